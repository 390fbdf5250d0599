// The cost of structured output's token mask (server/json_constraint.h) per step, on this
// machine's CPU: a synthetic 128k-token vocabulary (synthetic_vocab.h), masks computed from
// grammar states of response_format json_object (after '{', inside a string, after ':', inside
// an array of numbers) and of a json_schema (server/json_schema.h: an object of
// a string, an integer, an enum and an array of strings: where a key is expected, inside a key,
// inside a string value, inside the enum, after ':' of the integer).
// Usage: json_mask_cost [vocab size, default 128000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/json_recognizer.h"
#include "server/json_constraint.h"
#include "server/json_schema.h"
#include "synthetic_vocab.h"

namespace {

// Prints the row of one state: the mean time of a mask from it over 20 masks.
void time_mask(const flashserve::server::VocabTrie& trie, const flashserve::model::JsonGrammar* g,
               const char* prefix, size_t vocab) {
  flashserve::model::JsonRecognizer r(g);
  for (const char* p = prefix; *p; ++p)
    if (!r.feed(static_cast<uint8_t>(*p))) std::printf("(the grammar refuses '%s')\n", prefix);
  std::vector<uint32_t> mask((vocab + 31) / 32);
  constexpr int kReps = 20;
  const auto a = std::chrono::steady_clock::now();
  for (int i = 0; i < kReps; ++i) {
    std::fill(mask.begin(), mask.end(), 0u);
    trie.allowed_from(r, mask);
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count() /
      kReps;
  long allowed = 0;
  for (uint32_t w : mask) allowed += __builtin_popcount(w);
  std::printf("| `%s` | %.3f | %ld |\n", prefix, ms, allowed);
}

}  // namespace

int main(int argc, char** argv) {
  const int vocab = argc > 1 ? std::atoi(argv[1]) : 128000;
  const std::vector<std::string> bytes = flashserve::bench::synthetic_vocab(vocab);
  const auto t0 = std::chrono::steady_clock::now();
  flashserve::server::VocabTrie trie(bytes);
  std::printf(
      "vocabulary of %d tokens: trie built in %.1f ms\n\n", vocab,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  std::printf(
      "json_object:\n\n| state (text so far) | ms per mask | tokens allowed |\n|---|---|---|\n");
  for (const char* prefix : {"{", "{\"name\": \"abc", "{\"a\":", "{\"a\": [1, 2"})
    time_mask(trie, flashserve::model::JsonGrammar::any_object().get(), prefix, bytes.size());
  const auto schema = flashserve::server::json_schema_grammar(
      nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
          "name": {"type": "string"}, "age": {"type": "integer"},
          "color": {"enum": ["red", "green", "blue"]},
          "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name"]})"),
      "schema", false);
  std::printf(
      "\njson_schema:\n\n| state (text so far) | ms per mask | tokens allowed |\n|---|---|---|\n");
  for (const char* prefix : {"{", "{\"na", "{\"name\": \"abc", "{\"name\": \"\", \"color\": \"gr",
                             "{\"name\": \"\", \"age\":", "{\"name\": \"\", \"tags\": [\"x\","})
    time_mask(trie, schema.get(), prefix, bytes.size());
  return 0;
}
