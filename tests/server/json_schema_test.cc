// server/json_schema.h: schemas compiled to grammars, read by model/json_recognizer.h, against
// the reference of tests/support/json_schema_reference.h (nlohmann's parse and JSON Schema's
// reading of the subset, no state machine) on every text of up to a few pieces of small
// alphabets; the token mask along random walks; every keyword outside the subset refused by
// name, with its path; the order-keeping reader of the body (ordered_fields).
#include "server/json_schema.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "model/json_recognizer.h"
#include "server/api_error.h"
#include "server/json_constraint.h"
#include "server/ordered_fields.h"
#include "support/json_schema_reference.h"
#include "support/mask_walk.h"

namespace flashserve::server {
namespace {

using ojson = nlohmann::ordered_json;
using testing::reference_accepts;

// Every concatenation of up to `max_pieces` of `pieces`: the recognizer takes it whole exactly
// when the reference does. Returns how many texts both took.
int64_t agree_on_every_text(const ojson& schema, bool strict,
                            const std::vector<std::string>& pieces, int max_pieces) {
  const auto grammar = json_schema_grammar(schema, "schema", strict);
  int64_t accepted = 0;
  std::function<void(const std::string&, const model::JsonRecognizer&, bool, int)> visit =
      [&](const std::string& text, const model::JsonRecognizer& r, bool alive, int depth) {
        const bool ours = alive && r.complete();
        const bool reference = reference_accepts(text, schema, strict);
        EXPECT_EQ(ours, reference) << "'" << text << "' against " << schema.dump();
        if (ours != reference) throw std::runtime_error("stop at the first disagreement");
        accepted += ours;
        if (depth == max_pieces) return;
        for (const std::string& p : pieces) {
          model::JsonRecognizer next = r;
          bool ok = alive;
          for (size_t i = 0; ok && i < p.size(); ++i) ok = next.feed(static_cast<uint8_t>(p[i]));
          visit(text + p, next, ok, depth + 1);
        }
      };
  try {
    visit("", model::JsonRecognizer(grammar.get()), true, 0);
  } catch (const std::runtime_error&) {
  }
  return accepted;
}

TEST(JsonSchemaGrammar, AgreesWithTheReferenceOnEveryShortTextByteByByte) {
  // An optional integer, then a required enum of a string, a number and null.
  const ojson schema = ojson::parse(R"({"type": "object",
      "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", 1, null]}},
      "required": ["b"]})");
  const std::vector<std::string> bytes = {"{", "}", "\"", ":", ",", "a", "b", "1"};
  EXPECT_EQ(agree_on_every_text(schema, false, bytes, 7), 1);  // {"b":1}
  const std::vector<std::string> pieces = {"{", "}",     "\"a\":", "\"b\":", ",", "1",
                                           "-", "\"x\"", "null",   ".5",     " "};
  EXPECT_GE(agree_on_every_text(schema, false, pieces, 6), 6);
  // strict: every property is written, `required` or not.
  const std::vector<std::string> few = {"{", "}", "\"a\":", "\"b\":", ",", "1", "null", "\"x\""};
  EXPECT_EQ(agree_on_every_text(schema, true, few, 7), 3);  // {"a":1,"b":1|null|"x"}
}

TEST(JsonSchemaGrammar, AgreesWithTheReferenceOnNestedTypesUnionsAndLiterals) {
  const ojson schema = ojson::parse(R"({"type": "object", "properties": {
      "n": {"type": ["integer", "null"]},
      "t": {"type": "array", "items": {"type": "boolean"}},
      "o": {"type": "object", "properties": {"s": {"type": "string"}}, "additionalProperties": false},
      "e": {"anyOf": [{"const": "xy"}, {"type": "number"}, {"type": "object"}]},
      "f": {"type": "object", "additionalProperties": false}},
      "required": ["t"]})");
  // Pieces large enough that 5 of them reach every property (5 keep the test a few seconds
  // under ASan).
  const std::vector<std::string> pieces = {
      "{",           "}",         "{\"n\":null,", "{\"n\":1,", "\"t\":[", "]",
      "],",          "\"t\":[],", "true",         ",",         "{}",      "\"o\":{",
      "\"s\":\"x\"", "\"e\":",    "\"xy\"",       "\"f\":{}",  "0.5e1"};
  EXPECT_GE(agree_on_every_text(schema, false, pieces, 5), 10);
}

TEST(JsonSchemaGrammar, AnyValueArraysAndFreeObjects) {
  // No type: any JSON value; an object schema without properties: any object.
  const ojson schema = ojson::parse(R"({"properties": {"v": {}, "w": {"type": "object"},
      "l": {"type": "array"}}})");
  const std::vector<std::string> pieces = {"{", "}", "\"v\":", "\"w\":", "\"l\":", ",",
                                           "[", "]", "\"k\":", "-1",     "false",  "\"s\""};
  EXPECT_GE(agree_on_every_text(schema, false, pieces, 6), 10);
}

// The recognizer fed a few hand-written texts.
bool takes(const std::shared_ptr<const model::JsonGrammar>& g, const std::string& text) {
  model::JsonRecognizer r(g.get());
  for (char c : text)
    if (!r.feed(static_cast<uint8_t>(c))) return false;
  return r.complete();
}

TEST(JsonSchemaGrammar, WritesPropertiesInTheSchemasOrderAndOnlyThose) {
  const ojson schema = ojson::parse(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array",
      "items": {"enum": ["a", "b"]}}}, "required": ["name", "tags"]})");
  const auto g = json_schema_grammar(schema, "s", false);
  EXPECT_TRUE(takes(g, R"({"name": "Ann", "age": 31, "tags": ["a", "b"]})"));
  EXPECT_TRUE(takes(g, R"({"name":"","tags":[]})"));                    // age is optional
  EXPECT_FALSE(takes(g, R"({"age": 31, "name": "Ann", "tags": []})"));  // the schema's order
  EXPECT_FALSE(takes(g, R"({"name": "Ann"})"));                         // tags is required
  EXPECT_FALSE(takes(g, R"({"name": "Ann", "tags": [], "x": 1})"));     // nothing else
  EXPECT_FALSE(takes(g, R"({"name": "Ann", "age": 3.5, "tags": []})"));
  EXPECT_FALSE(takes(g, R"({"name": "Ann", "tags": ["c"]})"));
  EXPECT_FALSE(takes(g, R"({"name": "Ann", "name": "Bo", "tags": []})"));
}

// Each keyword outside the subset (or malformed) is refused, its path the error's param.
TEST(JsonSchemaGrammar, RefusesWhatIsOutsideTheSubsetByName) {
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {R"({"type": "object", "$ref": "#/x"})", "s.$ref", "'$ref' is not supported"},
      {R"({"type": "object", "properties": {"p": {"type": "string", "pattern": "a+"}}})",
       "s.properties.p.pattern", "'pattern' is not supported"},
      {R"({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}})",
       "s.properties.d.format", "'format'"},
      {R"({"type": "object", "properties": {"d": {"type": "string", "minLength": 2}}})",
       "s.properties.d.minLength", "'minLength'"},
      {R"({"type": "object", "oneOf": [{}]})", "s.oneOf", "'oneOf'"},
      {R"({"type": "object", "properties": {"l": {"type": "array", "items": {"frob": 1}}}})",
       "s.properties.l.items.frob", "'frob'"},
      {R"({"type": "object", "$defs": {}})", "s.$defs", "'$defs'"},
      {R"({"type": "object", "additionalProperties": {"type": "string"}})",
       "s.additionalProperties", "only true or false"},
      {R"({"type": "object", "properties": {}, "required": ["x"]})", "s.required",
       "'x' is not in properties"},
      {R"({"type": "object", "properties": {"e": {"enum": [[1]]}}})", "s.properties.e.enum[0]",
       "only strings, numbers, booleans and null"},
      {R"({"type": "object", "properties": {"e": {"enum": []}}})", "s.properties.e.enum", "empty"},
      {R"({"type": "object", "properties": {"e": {"type": "string", "enum": [1]}}})",
       "s.properties.e.enum[0]", "not of the schema's type"},
      {R"({"type": "object", "properties": {"u": {"anyOf": [{"type": "object"},
          {"type": "object", "properties": {}}]}}})",
       "s.properties.u.anyOf", "start with the same byte ('{')"},
      {R"({"type": "object", "properties": {"u": {"type": ["number", "integer", "string"],
          "items": {}}}})",
       "s.properties.u.items", "only with type array"},
      {R"({"type": "tuple"})", "s.type", "'tuple' is not a type"},
      {R"({"type": "array"})", "s", "the top level must be an object schema"},
      {R"({"type": "object", "properties": {"f": false}})", "s.properties.f", "admits no value"},
      {R"({"type": "object", "title": 3})", "s.title", "expected a string"},
  };
  for (const auto& [text, param, says] : cases) {
    try {
      json_schema_grammar(ojson::parse(text), "s", false);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, param) << text;
      EXPECT_NE(e.message.find(says), std::string::npos) << e.message;
    }
  }
  // Annotations constrain nothing and are taken.
  EXPECT_NO_THROW(json_schema_grammar(
      ojson::parse(R"({"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "t",
          "description": "d", "type": "object", "properties": {"a": {"default": 1,
          "examples": [1], "$comment": "c", "type": "integer"}}})"),
      "s", false));
}

// The mask of a schema's constraint over a small vocabulary, token by token along random walks
// (seed logged), against the recognizer fed each token; a walk that completes is valid.
TEST(JsonSchemaConstraint, TheMaskIsExactlyTheTokensTheGrammarTakes) {
  const ojson schema = ojson::parse(R"({"type": "object", "properties": {
      "id": {"type": "integer"}, "kind": {"enum": ["cat", "dog"]},
      "tags": {"type": "array", "items": {"type": "string"}},
      "ok": {"type": ["boolean", "null"]}}, "required": ["kind"]})");
  const auto g = json_schema_grammar(schema, "s", false);
  const std::vector<std::string> vocab = {
      "",        "{",        "}",          "[",    "]",   "\"",       ":",     ",",    " ",
      "1",       "12",       "-",          ".",    "e",   "a",        "\"c",   "at\"", "\"dog\"",
      "\"id\":", "\"kind\"", "\"tags\":[", "\"ok", "\":", "true",     "fal",   "se",   "null",
      "\\",      "n",        "\"}",        "]}",   ",\"", "\xc3\xa9", "\"a\"", "\"\"", "0"};
  const testing::WalkCounts n = testing::walk_masks(
      vocab, g, 20261202, 300, 60,
      [&](const std::string& text) { EXPECT_TRUE(reference_accepts(text, schema)) << text; });
  EXPECT_GT(n.steps, 1500);
  EXPECT_GT(n.completed, 5);
}

TEST(OrderedFields, KeepsTheKeysInTheOrderWrittenAndTheLastOfARepeatedOne) {
  const std::string body =
      R"({"model": "m", "tools": [{"z": 1, "a": {"y": [1, {"k": 2, "b": 3}], "c": null}}],
          "response_format": {"b": 1, "a": 2, "b": 3}, "other": {"x": 1}})";
  auto f = ordered_fields(body, {"tools", "response_format"});
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f["tools"].dump(), R"([{"z":1,"a":{"y":[1,{"k":2,"b":3}],"c":null}}])");
  EXPECT_EQ(f["response_format"].dump(), R"({"b":3,"a":2})");
  EXPECT_TRUE(ordered_fields("{\"tools\": [1,", {"tools"}).empty());  // malformed: nothing
}

}  // namespace
}  // namespace flashserve::server
