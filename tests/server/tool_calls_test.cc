// server/tool_calls.h: tools and tool_choice parsed (each malformed form refused naming its
// field), the grammar of a forced call (named: that tool's; required: any tool's, its arguments
// following the tool the name chose), the auto rule reading an output as calls, and the reader
// giving the same calls streamed in any pieces as whole.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <random>

#include "model/json_recognizer.h"
#include "server/api_error.h"

namespace flashserve::server {
namespace {

using ojson = nlohmann::ordered_json;

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                  "unit": {"enum": ["C", "F"]}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "now"}}])");

bool takes(const ChatTools& t, const std::string& text) {
  model::JsonRecognizer r(t.grammar.get());
  for (char c : text)
    if (!r.feed(static_cast<uint8_t>(c))) return false;
  return r.complete();
}

TEST(ToolCalls, ChoicesAndTheGrammarOfAForcedCall) {
  EXPECT_EQ(parse_tools(kTools, nullptr).choice, ToolChoice::kAuto);
  EXPECT_EQ(parse_tools(kTools, "none").choice, ToolChoice::kNone);
  EXPECT_FALSE(parse_tools(kTools, "auto").grammar);
  EXPECT_EQ(parse_tools(nullptr, nullptr).choice, ToolChoice::kNone);
  EXPECT_EQ(parse_tools(kTools, nullptr).names, (std::vector<std::string>{"get_weather", "now"}));

  const ChatTools named = parse_tools(
      kTools, ojson::parse(R"({"type": "function", "function": {"name": "get_weather"}})"));
  EXPECT_EQ(named.choice, ToolChoice::kNamed);
  EXPECT_TRUE(takes(named, R"({"name": "get_weather", "arguments": {"city": "Paris"}})"));
  EXPECT_TRUE(takes(named, R"({"name":"get_weather","arguments":{"city":"x","unit":"F"}})"));
  EXPECT_FALSE(takes(named, R"({"name": "now", "arguments": {}})"));
  EXPECT_FALSE(takes(named, R"({"name": "get_weather", "arguments": {}})"));  // city required

  const ChatTools required = parse_tools(kTools, "required");
  EXPECT_EQ(required.choice, ToolChoice::kRequired);
  EXPECT_TRUE(takes(required, R"({"name": "now", "arguments": {}})"));
  EXPECT_TRUE(takes(required, R"({"name": "get_weather", "arguments": {"city": ""}})"));
  // The name chose the tool: its arguments follow that tool's schema, not the other's.
  EXPECT_FALSE(takes(required, R"({"name": "now", "arguments": {"city": ""}})"));
  EXPECT_FALSE(takes(required, R"({"name": "get_weather", "arguments": {}})"));
  EXPECT_FALSE(takes(required, R"({"name": "other", "arguments": {}})"));
  EXPECT_FALSE(takes(required, R"({"arguments": {}, "name": "now"})"));
}

TEST(ToolCalls, MalformedToolsAndChoicesAreRefusedByName) {
  const std::vector<std::tuple<ojson, ojson, std::string, std::string>> cases = {
      {ojson::object(), nullptr, "tools", "expected an array"},
      {ojson::array(), nullptr, "tools", "empty"},
      {ojson::parse(R"([{"type": "retrieval"}])"), nullptr, "tools[0].type", "only \"function\""},
      {ojson::parse(R"([{"type": "function"}])"), nullptr, "tools[0].function",
       "expected an object"},
      {ojson::parse(R"([{"type": "function", "function": {"name": "a b"}}])"), nullptr,
       "tools[0].function.name", "'a b' is not a function name"},
      {ojson::parse(R"([{"type": "function", "function": {"name": "f", "extra": 1}}])"), nullptr,
       "tools[0].function.extra", "Unrecognized argument"},
      {ojson::parse(R"([{"type": "function", "function": {"name": "f"}},
                        {"type": "function", "function": {"name": "f"}}])"),
       nullptr, "tools[1].function.name", "'f' names two tools"},
      {ojson::parse(R"([{"type": "function", "function": {"name": "f",
          "parameters": {"type": "object", "properties": {"x": {"type": "string",
          "pattern": "a"}}}}}])"),
       nullptr, "tools[0].function.parameters.properties.x.pattern", "'pattern' is not supported"},
      {ojson::parse(R"([{"type": "function", "function": {"name": "f",
          "parameters": {"type": "string"}}}])"),
       nullptr, "tools[0].function.parameters", "must be an object schema"},
      {kTools, "sometimes", "tool_choice", "'sometimes' is not one of none, auto, required"},
      {kTools, ojson::parse(R"({"type": "function", "function": {"name": "nope"}})"), "tool_choice",
       "no tool is named 'nope'"},
      {nullptr, "auto", "tool_choice", "only allowed when tools are given"},
      {kTools, 3, "tool_choice", "expected \"none\", \"auto\", \"required\" or an object"},
  };
  for (const auto& [tools, choice, param, says] : cases) {
    try {
      parse_tools(tools, choice);
      ADD_FAILURE() << "accepted: " << tools.dump() << " " << choice.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, param) << tools.dump() << " " << choice.dump();
      EXPECT_NE(e.message.find(says), std::string::npos) << e.message;
    }
  }
}

TEST(ToolCalls, TheAutoRuleReadsObjectsAndHermesBlocks) {
  const std::vector<std::string> names = {"f", "g"};
  auto calls =
      parse_tool_calls(" {\"name\": \"f\", \"arguments\": {\"b\": 1, \"a\": [2]}}\n", names);
  ASSERT_TRUE(calls);
  ASSERT_EQ(calls->size(), 1u);
  EXPECT_EQ((*calls)[0].name, "f");
  EXPECT_EQ((*calls)[0].arguments, R"({"b":1,"a":[2]})");  // the order written
  calls = parse_tool_calls(
      "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": \"y\"}}</tool_call>",
      names);
  ASSERT_TRUE(calls);
  ASSERT_EQ(calls->size(), 2u);
  EXPECT_EQ((*calls)[1].arguments, R"({"x":"y"})");
  for (const char* content :
       {"Hello", "{\"name\": \"h\", \"arguments\": {}}", "{\"name\": \"f\", \"arguments\": 1}",
        "{\"name\": \"f\", \"arguments\": {}, \"x\": 1}", "{\"name\": \"f\"",
        "<tool_call>{\"name\": \"f\", \"arguments\": {}}", "text <tool_call></tool_call>", ""})
    EXPECT_FALSE(parse_tool_calls(content, names)) << content;
}

// The pieces of one output, read by a ToolCallReader: the text that goes out and the calls.
Piece read_in_pieces(const ChatTools& tools, const std::string& out, const std::string& finish,
                     std::mt19937& rng, std::string* streamed) {
  ToolCallReader reader(tools, 7);
  Piece all;
  for (size_t at = 0; at <= out.size();) {
    const size_t n = std::uniform_int_distribution<size_t>(0, 4)(rng);
    Piece p;
    p.text = out.substr(at, n);
    at += n;
    if (at >= out.size()) p.finish_reason = finish;
    reader.take(p);
    *streamed += p.text;
    all.text += p.text;
    for (const ToolCall& c : p.tool_calls) all.add_tool_call(c);
    if (p.finish_reason) {
      all.finish_reason = p.finish_reason;
      break;
    }
  }
  return all;
}

TEST(ToolCalls, TheReaderGivesTheSameCallsInAnyPiecesAndHoldsBackOnlyWhatMayBeACall) {
  const ChatTools tools = parse_tools(kTools, "auto");
  const uint32_t seed = 424242;
  std::mt19937 rng(seed);
  for (int round = 0; round < 50; ++round) {
    std::string streamed;
    Piece p =
        read_in_pieces(tools, "  {\"name\": \"now\", \"arguments\": {}}", "stop", rng, &streamed);
    EXPECT_EQ(streamed, "") << "seed " << seed;
    ASSERT_EQ(p.tool_calls.size(), 1u);
    EXPECT_EQ(p.tool_calls[0].id.size(), 5u + 24u);
    EXPECT_EQ(p.tool_calls[0].id.substr(0, 5), "call_");
    EXPECT_EQ(p.finish_reason, "tool_calls");
    // Content: it goes out as it comes once it cannot be a call; a call cut short is content.
    streamed.clear();
    p = read_in_pieces(tools, "Sunny, 21 C.", "stop", rng, &streamed);
    EXPECT_EQ(streamed, "Sunny, 21 C.");
    EXPECT_TRUE(p.tool_calls.empty());
    EXPECT_EQ(p.finish_reason, "stop");
    streamed.clear();
    p = read_in_pieces(tools, "{\"name\": \"now\", \"argu", "length", rng, &streamed);
    EXPECT_EQ(p.text, "{\"name\": \"now\", \"argu");
    EXPECT_EQ(p.finish_reason, "length");
  }
}

TEST(ToolCalls, AForcedCallStreamsItsNameThenItsArgumentsAsTheyCome) {
  const ChatTools tools = parse_tools(kTools, "required");
  const std::string args = R"({"city": "a} b ", "unit": "C"})";
  const std::string out = "{ \"name\": \"get_weather\",\n \"arguments\": " + args + " }";
  const uint32_t seed = 777;
  std::mt19937 rng(seed);
  for (int round = 0; round < 50; ++round) {
    std::string streamed;
    const Piece p = read_in_pieces(tools, out, "stop", rng, &streamed);
    EXPECT_EQ(streamed, "");
    ASSERT_EQ(p.tool_calls.size(), 1u) << "seed " << seed;
    EXPECT_EQ(p.tool_calls[0].name, "get_weather");
    EXPECT_EQ(p.tool_calls[0].arguments, args) << "seed " << seed << ", round " << round;
    EXPECT_EQ(p.finish_reason, "tool_calls");
    // Cut in the arguments: the arguments so far, "length"; cut before them: content.
    const Piece cut = read_in_pieces(tools, out.substr(0, 50), "length", rng, &streamed);
    ASSERT_EQ(cut.tool_calls.size(), 1u);
    EXPECT_EQ(cut.tool_calls[0].arguments, out.substr(0, 50).substr(out.find("{\"city")));
    EXPECT_EQ(cut.finish_reason, "length");
    const Piece early = read_in_pieces(tools, out.substr(0, 12), "length", rng, &streamed);
    EXPECT_TRUE(early.tool_calls.empty());
    EXPECT_EQ(early.text, out.substr(0, 12));
  }
  // The first piece has the id and the name; the others continue the arguments only.
  ToolCallReader reader(tools, 3);
  Piece a;
  a.text = "{\"name\": \"now\", \"arguments\": {";
  reader.take(a);
  ASSERT_EQ(a.tool_calls.size(), 1u);
  EXPECT_EQ(a.tool_calls[0].name, "now");
  EXPECT_EQ(a.tool_calls[0].id.substr(0, 5), "call_");
  EXPECT_EQ(a.tool_calls[0].arguments, "{");
  Piece b;
  b.text = "}}";
  b.finish_reason = "stop";
  reader.take(b);
  ASSERT_EQ(b.tool_calls.size(), 1u);
  EXPECT_EQ(b.tool_calls[0].id, "");
  EXPECT_EQ(b.tool_calls[0].arguments, "}");
  EXPECT_EQ(b.finish_reason, "tool_calls");
}

}  // namespace
}  // namespace flashserve::server
