#!/usr/bin/env bash
# expect.sh STATUS REGEX COMMAND...: runs COMMAND and passes when it exits with STATUS and its
# output (stdout and stderr) matches REGEX (grep -E). A hang fails by ctest's TIMEOUT.
set -u
want=$1 pattern=$2
shift 2
out=$("$@" 2>&1)
rc=$?
if [ "$rc" != "$want" ]; then
  printf 'exit status %s, expected %s; output:\n%s\n' "$rc" "$want" "$out"
  exit 1
fi
if ! grep -qE -- "$pattern" <<<"$out"; then
  printf 'output does not match /%s/:\n%s\n' "$pattern" "$out"
  exit 1
fi
