#!/usr/bin/env bash
# simulate_tensor_parallel.sh FLASHSERVE TP2_PROFILE TP1_PROFILE: `simulate --tensor-parallel-size
# 2` sizes its KV pool as what fits beside one rank's weights on each GPU: for mistral-7b on the
# H200 more than twice the one-GPU pool (half the weights, half the KV heads a token). The two
# profiles only have to be of sizes 2 and 1; the pool comes from the --model preset.
set -eu
bin=$1 tp2=$2 tp1=$3
blocks() {  # the pool simulate reports: "KV cache N blocks x 16 tokens"
  "$bin" simulate --model mistral-7b --gpu h200 --requests 10 "$@" |
    sed -n 's/.*KV cache \([0-9]*\) blocks.*/\1/p'
}
one=$(blocks --profile "$tp1")
two=$(blocks --profile "$tp2" --tensor-parallel-size 2)
echo "KV blocks: TP=1 $one, TP=2 $two"
[ -n "$one" ] && [ -n "$two" ] && [ "$two" -gt $((2 * one)) ]
