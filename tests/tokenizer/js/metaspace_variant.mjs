// Derives the Metaspace form of the byte-fallback fixture (Llama 2 with legacy=false, Mistral
// v0.3): no normalizer, a Metaspace pre-tokenizer (prepend_scheme "first", no split) and a
// Metaspace decoder, same vocabulary and merges. Exercises our Metaspace against Hugging Face's.
//   node metaspace_variant.mjs FIXTURE_DIR OUT_DIR
import fs from "node:fs";

const [from, to] = process.argv.slice(2);
const tokenizer = JSON.parse(fs.readFileSync(`${from}/tokenizer.json`, "utf8"));
tokenizer.normalizer = null;
tokenizer.pre_tokenizer = { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: false };
tokenizer.decoder = { type: "Sequence", decoders: [
  { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: false },
  { type: "ByteFallback" }, { type: "Fuse" }] };
fs.mkdirSync(to, { recursive: true });
fs.writeFileSync(`${to}/tokenizer.json`, JSON.stringify(tokenizer));
fs.copyFileSync(`${from}/tokenizer_config.json`, `${to}/tokenizer_config.json`);
