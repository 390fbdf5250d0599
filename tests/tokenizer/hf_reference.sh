#!/usr/bin/env bash
# ctest hf_reference: installs @huggingface/tokenizers (the version pinned in js/package-lock.json)
# into the build tree, runs it on the fixtures and the comparison corpus, and compares ours with
# it (test_tokenizer --gtest_filter=HfReference.*). Without node/npm or the registry it skips
# (exit 77) and says so.
#   hf_reference.sh TEST_BINARY WORK_DIR
set -euo pipefail
test_bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "skipped: node/npm not found, so ours was not compared with Hugging Face's tokenizers"
  exit 77
fi
mkdir -p "$work"
cp "$here/js/package.json" "$here/js/package-lock.json" "$here/js/reference.mjs" \
   "$here/js/metaspace_variant.mjs" "$work/"
if [ ! -d "$work/node_modules/@huggingface/tokenizers" ]; then
  if ! (cd "$work" && npm ci --no-audit --no-fund --loglevel=error); then
    echo "skipped: npm ci of @huggingface/tokenizers failed (no registry?), no comparison ran"
    exit 77
  fi
fi
node "$work/metaspace_variant.mjs" "$here/fixtures/byte_fallback" "$work/metaspace"
for kind in byte_level byte_fallback metaspace; do
  dir="$here/fixtures/$kind"
  [ "$kind" = metaspace ] && dir="$work/metaspace"
  node "$work/reference.mjs" "$dir" "$here/fixtures/compare_corpus.json" > "$work/$kind.jsonl"
done
# The Unicode normalizers' fixtures (make_normalizer_fixtures.mjs) on both corpora.
for kind in qwen2_nfc byte_fallback_nfkc byte_fallback_nfd byte_level_folded; do
  node "$work/reference.mjs" "$here/fixtures/$kind" "$here/fixtures/compare_corpus.json" \
       "$here/fixtures/normalizer_corpus.json" > "$work/$kind.jsonl"
done
FLASHSERVE_HF_REFERENCE=$work "$test_bin" --gtest_filter='HfReference.*' --gtest_brief=1
