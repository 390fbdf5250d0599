// Hugging Face's own tokenizer (@huggingface/tokenizers, the JavaScript port that
// transformers.js uses) on the fixtures: prints, as JSON lines, what it makes of every text of
// the comparison corpus (ids with and without special tokens, decodes with and without skipping
// them) and the decodes of random id sequences. The C++ test HfReference compares ours with it.
//   node reference.mjs FIXTURE_DIR CORPUS_JSON [MORE_CORPUS_JSON...] > reference.jsonl
import fs from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [dir, ...corpusPaths] = process.argv.slice(2);
const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(`${dir}/tokenizer.json`, "utf8")),
                                JSON.parse(fs.readFileSync(`${dir}/tokenizer_config.json`, "utf8")));
// Its decode refuses an empty list (a text that encodes to nothing without a BOM): that is "".
const decode = (ids, options) => (ids.length ? tokenizer.decode(ids, options) : "");
const texts = corpusPaths.flatMap((p) => JSON.parse(fs.readFileSync(p, "utf8")));
const out = [];
for (const text of texts) {
  const ids = tokenizer.encode(text, { add_special_tokens: false }).ids;
  const withSpecial = tokenizer.encode(text).ids;
  out.push(JSON.stringify({ kind: "text", text, ids, with_special: withSpecial,
                            decoded: decode(withSpecial),
                            decoded_skip: decode(withSpecial, { skip_special_tokens: true }) }));
}
// Random id sequences: byte tokens cut in the middle of characters, special tokens anywhere.
const json = JSON.parse(fs.readFileSync(`${dir}/tokenizer.json`, "utf8"));
const total = Math.max(...Object.values(json.model.vocab), ...json.added_tokens.map((t) => t.id)) + 1;
let seed = 12345;
const rand = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
for (let k = 0; k < 300; ++k) {
  const ids = Array.from({ length: 1 + rand(12) }, () => rand(total));
  out.push(JSON.stringify({ kind: "ids", ids, decoded: tokenizer.decode(ids),
                            decoded_skip: tokenizer.decode(ids, { skip_special_tokens: true }) }));
}
process.stdout.write(out.join("\n") + "\n");
