#!/usr/bin/env bash
# serve_tokenizer_beyond_vocab.sh FLASHSERVE TINY_DIR WORK_DIR: a copy of the tiny checkpoint whose
# tokenizer.json has one token more than config.json's vocab_size. `flashserve serve` must refuse
# to start (exit 2), naming the file and both sizes, instead of serving prompts with ids the model
# has no embedding for.
set -eu
bin=$1 tiny=$2 work=$3
rm -rf "$work"
cp -r "$tiny" "$work"
python3 - "$work/tokenizer.json" <<'PY'
import json, sys
path = sys.argv[1]
j = json.load(open(path))
ids = list(j["model"]["vocab"].values()) + [t["id"] for t in j.get("added_tokens", [])]
j.setdefault("added_tokens", []).append(
    {"id": max(ids) + 1, "content": "<|extra|>", "special": True, "single_word": False,
     "lstrip": False, "rstrip": False, "normalized": False})
json.dump(j, open(path, "w"))
PY
exec bash "$(dirname "$0")/expect.sh" 2 \
  "error: .*tokenizer.json: has token ids up to 1024, beyond the model's vocab_size 1024" \
  "$bin" serve --model "$work" --port 0
