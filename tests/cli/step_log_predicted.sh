#!/usr/bin/env bash
# step_log_predicted.sh FLASHSERVE PROFILE: `bench-serve --step-log` writes, with --profile, the
# profile's cost of every step's batch (predicted_s) beside its measured seconds, and leaves the
# column empty without one. The fixed tiny profile (tiny_step_profile.csv) costs a step with a
# prompt chunk of up to 48 tokens at linear(T) + prefill_attn >= 1.52 + 0.88 ms = 2.40 ms, and a
# decode-only step of these requests (at most two, at most 52 keys: the table's axes end at 32 keys
# and extrapolate linearly) at decode_base(2) + decode_attn(2, 52) <= 0.21 + 1.07 x 52 / 31 ms =
# 2.0 ms: every prefill row must be predicted above every decode-only row. Both logs say what each
# batch held: a row with a prompt chunk has 1-2 chunks after at most 47 cached tokens, a
# decode-only row none; decodes read 49-52 keys (a 48-token prompt and up to 4 tokens out), a
# row without decodes says 0.
set -eu
bin=$1 profile=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
run() {
  OPENBLAS_NUM_THREADS=1 "$bin" bench-serve --shape tiny --workload fixed --prompt-len 48 \
    --output-len 4 --requests 2 --rate 50 --policy sarathi --budget 64 --max-running 2 \
    --kv-memory-mb 16 "$@" > "$dir/out.txt" 2>&1 || { cat "$dir/out.txt"; exit 1; }
}
run --profile "$profile" --step-log "$dir/with.csv"
run --step-log "$dir/without.csv"
header=policy,seed,step,end_s,seconds,tokens,decodes,budget,graph_captures,predicted_s
header=$header,decode_kv_mean,decode_kv_max,chunks,chunk_cached_max
for f in with without; do
  [ "$(head -1 "$dir/$f.csv")" = "$header" ] || { echo "$f: header $(head -1 "$dir/$f.csv")"; exit 1; }
  awk -F, -v f=$f 'NR > 1 {
    rows++
    if (NF != 14) { print f " row " NR ": " NF " columns"; bad = 1 }
    if ($6 > $7 && !($13 >= 1 && $13 <= 2 && $14 >= 0 && $14 <= 47)) bad = 1
    if ($6 == $7 && !($13 == 0 && $14 == 0)) bad = 1
    if ($7 > 0 && !($11 >= 49 && $11 <= $12 && $12 <= 52)) bad = 1
    if ($7 == 0 && !($11 == 0 && $12 == 0)) bad = 1
    if (bad && !said) { print f " row " NR ": " $0; said = 1 }
  }
  END { printf "%s: %d steps, the batches as they ran: %s\n", f, rows, bad ? "no" : "yes"; exit bad || rows == 0 }' \
    "$dir/$f.csv"
done
awk -F, 'NR > 1 {
  rows++
  if ($10 == "" || !($10 > 0)) { print "row " NR ": predicted_s \"" $10 "\""; bad = 1 }
  if ($6 > $7) { prefill++; if (min_prefill == "" || $10 < min_prefill) min_prefill = $10 }
  else { decode++; if ($10 > max_decode) max_decode = $10 }
}
END {
  printf "with --profile: %d steps, %d with a prompt chunk (cheapest %.6f s), %d decode-only (dearest %.6f s)\n",
         rows, prefill, min_prefill, decode, max_decode
  exit bad || rows == 0 || prefill == 0 || decode == 0 || !(min_prefill > max_decode)
}' "$dir/with.csv"
awk -F, 'NR > 1 { rows++; if ($10 != "") bad = 1 }
  END { printf "without: %d steps, predicted_s empty: %s\n", rows, bad ? "no" : "yes"; exit bad || rows == 0 }' \
  "$dir/without.csv"
