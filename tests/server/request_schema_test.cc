// The OpenAI request schema: every parameter refuses a wrong type naming itself, unknown fields
// are refused, null is "not given", values out of range are refused; stop strings hold back text
// that may still become a stop sequence; histograms render cumulative buckets.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "server/openai_request.h"
#include "server/prometheus.h"
#include "server/stop_strings.h"

namespace fsv = flashserve::server;
using json = nlohmann::json;

namespace {

fsv::ApiError refusal(const json& body, fsv::Endpoint e = fsv::Endpoint::kCompletions) {
  try {
    fsv::parse_request(body.dump(), e);
  } catch (const fsv::ApiError& err) {
    return err;
  }
  ADD_FAILURE() << "accepted: " << body.dump();
  return {};
}

json base(fsv::Endpoint e) {
  if (e == fsv::Endpoint::kChat)
    return {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  return {{"model", "m"}, {"prompt", {1, 2, 3}}};
}

TEST(RequestSchema, EveryParameterRefusesAWrongTypeNamingIt) {
  const json wrong[] = {"text", 1.5, true, json::array({1}), json::object({{"a", 1}})};
  for (const fsv::Endpoint e : {fsv::Endpoint::kCompletions, fsv::Endpoint::kChat}) {
    const std::map<std::string, std::vector<int>> params = {
        // index into `wrong` of the values that are the wrong type for it
        {"model", {1, 2, 3, 4}},
        {"max_tokens", {0, 1, 2, 3, 4}},
        {"temperature", {0, 2, 3, 4}},
        {"top_p", {0, 2, 3, 4}},
        {"top_k", {0, 1, 2, 3, 4}},
        {"seed", {0, 1, 2, 3, 4}},
        {"stop", {1, 2, 3, 4}},
        {"stop_token_ids", {0, 1, 2, 4}},
        {"ignore_eos", {0, 1, 3, 4}},
        {"stream", {0, 1, 3, 4}},
        {"n", {0, 1, 2, 3, 4}},
        {"user", {1, 2, 3, 4}},
        {"min_p", {0, 2, 3, 4}},
        {"repetition_penalty", {0, 2, 3, 4}},
        {"presence_penalty", {0, 2, 3, 4}},
        {"frequency_penalty", {0, 2, 3, 4}},
        {"logit_bias", {0, 1, 2, 3}},
        {"min_tokens", {0, 1, 2, 3, 4}},
        {"skip_special_tokens", {0, 1, 3, 4}},
        {"include_stop_str_in_output", {0, 1, 3, 4}},
    };
    for (const auto& [name, bad] : params)
      for (int i : bad) {
        json body = base(e);
        body[name] = wrong[i];
        const fsv::ApiError err = refusal(body, e);
        EXPECT_EQ(err.status, 400) << name << " = " << wrong[i].dump();
        EXPECT_EQ(err.param.substr(0, name.size()), name)
            << name << " = " << wrong[i].dump() << ": " << err.message;
      }
  }
  json body = base(fsv::Endpoint::kCompletions);
  body["prompt"] = 5;
  EXPECT_EQ(refusal(body).param, "prompt");
  body = base(fsv::Endpoint::kChat);
  body["messages"] = "hi";
  EXPECT_EQ(refusal(body, fsv::Endpoint::kChat).param, "messages");
  body["messages"] = json::array({{{"role", 3}, {"content", "x"}}});
  EXPECT_EQ(refusal(body, fsv::Endpoint::kChat).param, "messages[0].role");
  body = base(fsv::Endpoint::kCompletions);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", "yes"}};
  EXPECT_EQ(refusal(body).param, "stream_options.include_usage");
}

TEST(RequestSchema, UnknownFieldsAndUnsupportedValuesAreRefused) {
  json body = base(fsv::Endpoint::kCompletions);
  body["frobnicate"] = 1;
  fsv::ApiError err = refusal(body);
  EXPECT_EQ(err.param, "frobnicate");
  EXPECT_NE(err.message.find("Unrecognized request argument supplied: frobnicate"),
            std::string::npos);
  // max_completion_tokens is chat's; on completions it is unknown.
  body = base(fsv::Endpoint::kCompletions);
  body["max_completion_tokens"] = 5;
  EXPECT_EQ(refusal(body).param, "max_completion_tokens");
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, json>>{{"n", 129},
                                                 {"presence_penalty", 2.5},
                                                 {"frequency_penalty", -2.1},
                                                 {"repetition_penalty", 0},
                                                 {"min_p", 1.5},
                                                 {"min_tokens", -1},
                                                 {"logit_bias", {{"x", 1}}},
                                                 {"logit_bias", {{"-1", 1}}},
                                                 {"logit_bias", {{"01", 1}}},
                                                 {"logit_bias", {{"5", 101}}},
                                                 {"logit_bias", {{"5", "high"}}},
                                                 {"logprobs", 6},
                                                 {"logprobs", -1},
                                                 {"logprobs", true},
                                                 {"n", 0},
                                                 {"echo", 1},
                                                 {"max_tokens", 0},
                                                 {"max_tokens", -5},
                                                 {"max_tokens", 18446744073709551615ull},
                                                 {"temperature", -1},
                                                 {"temperature", 2.5},
                                                 {"top_p", 0},
                                                 {"top_k", -2},
                                                 {"stream_options", {{"include_usage", true}}},
                                                 {"stop", {"a", "b", "c", "d", "e"}},
                                                 {"stop", ""},
                                                 {"stop_token_ids", {-1}}}) {
    body = base(fsv::Endpoint::kCompletions);
    body[name] = value;
    err = refusal(body);
    EXPECT_EQ(err.status, 400);
    EXPECT_EQ(err.param.substr(0, name.size()), name) << value.dump() << ": " << err.message;
  }
  body = base(fsv::Endpoint::kCompletions);
  body["prompt"] = {"one", 2};
  EXPECT_EQ(refusal(body).param, "prompt[1]");
  body["prompt"] = json::array();
  EXPECT_EQ(refusal(body).param, "prompt");
  body["prompt"] = {"one", ""};
  EXPECT_EQ(refusal(body).param, "prompt[1]");
  // A batch mixing strings and token-id arrays is no form of OpenAI's: refused, not guessed.
  body["prompt"] = json::array({"one", {1, 2}});
  EXPECT_EQ(refusal(body).param, "prompt[1]");
  body["prompt"] = json::array({{1, 2}, "one"});
  EXPECT_EQ(refusal(body).param, "prompt[1]");
  body["prompt"] = std::vector<std::string>(fsv::kMaxPrompts + 1, "x");
  EXPECT_EQ(refusal(body).param, "prompt");
  // min_tokens past max_tokens; echo with logprobs (the prompt's are not computed).
  body = base(fsv::Endpoint::kCompletions);
  body["max_tokens"] = 4;
  body["min_tokens"] = 5;
  EXPECT_EQ(refusal(body).param, "min_tokens");
  body = base(fsv::Endpoint::kCompletions);
  body["echo"] = true;
  body["logprobs"] = 1;
  EXPECT_EQ(refusal(body).param, "echo");
  body = base(fsv::Endpoint::kCompletions);
  body["model"] = "";
  EXPECT_EQ(refusal(body).param, "model");
  // Left out, it is the server's first served name (vLLM's default): "" here.
  body.erase("model");
  EXPECT_EQ(fsv::parse_request(body.dump(), fsv::Endpoint::kCompletions).model, "");
}

// OpenAI's ranges: completions logprobs 0..5; chat logprobs a boolean, top_logprobs 0..20 and
// only with logprobs true. Each refusal is a 400 naming the parameter.
TEST(RequestSchema, LogprobsRangesAndTheirRefusals) {
  json body = base(fsv::Endpoint::kCompletions);
  EXPECT_EQ(fsv::parse_request(body.dump(), fsv::Endpoint::kCompletions).logprobs, -1);
  for (int n : {0, 3, 5}) {
    body["logprobs"] = n;
    EXPECT_EQ(fsv::parse_request(body.dump(), fsv::Endpoint::kCompletions).logprobs, n);
  }
  body["logprobs"] = 6;
  fsv::ApiError err = refusal(body);
  EXPECT_EQ(err.status, 400);
  EXPECT_EQ(err.param, "logprobs");
  EXPECT_TRUE(json::accept(err.body()));
  EXPECT_EQ(json::parse(err.body())["error"]["param"], "logprobs");
  body = base(fsv::Endpoint::kCompletions);
  body["top_logprobs"] = 2;  // chat's parameter: unknown on completions
  EXPECT_EQ(refusal(body).param, "top_logprobs");

  const auto chat = [](json extra) {
    json b = base(fsv::Endpoint::kChat);
    b.update(extra);
    return b;
  };
  const auto parsed = [](const json& b) {
    return fsv::parse_request(b.dump(), fsv::Endpoint::kChat).logprobs;
  };
  EXPECT_EQ(parsed(chat({{"logprobs", false}})), -1);
  EXPECT_EQ(parsed(chat({{"logprobs", true}})), 0);
  EXPECT_EQ(parsed(chat({{"logprobs", true}, {"top_logprobs", 20}})), 20);
  EXPECT_EQ(parsed(chat({{"logprobs", true}, {"top_logprobs", nullptr}})), 0);
  EXPECT_EQ(parsed(chat({{"logprobs", false}, {"top_logprobs", nullptr}})), -1);
  for (const json& bad :
       {json({{"logprobs", true}, {"top_logprobs", 21}}),
        json({{"logprobs", true}, {"top_logprobs", -1}}), json({{"top_logprobs", 3}}),
        json({{"logprobs", false}, {"top_logprobs", 0}}),
        json({{"logprobs", true}, {"top_logprobs", 2.0}})}) {
    err = refusal(chat(bad), fsv::Endpoint::kChat);
    EXPECT_EQ(err.status, 400) << bad.dump();
    EXPECT_EQ(err.param, "top_logprobs") << bad.dump() << ": " << err.message;
  }
  for (const json& bad : {json({{"logprobs", 1}}), json({{"logprobs", "yes"}})}) {
    err = refusal(chat(bad), fsv::Endpoint::kChat);
    EXPECT_EQ(err.status, 400) << bad.dump();
    EXPECT_EQ(err.param, "logprobs") << bad.dump();
  }
  // n from 1 to kMaxChoices on both endpoints; beyond, a clear 400.
  for (const fsv::Endpoint e : {fsv::Endpoint::kCompletions, fsv::Endpoint::kChat}) {
    body = base(e);
    body["n"] = fsv::kMaxChoices;
    EXPECT_EQ(fsv::parse_request(body.dump(), e).n, fsv::kMaxChoices);
    body["n"] = fsv::kMaxChoices + 1;
    err = refusal(body, e);
    EXPECT_EQ(err.status, 400);
    EXPECT_EQ(err.param, "n");
    EXPECT_NE(err.message.find("128"), std::string::npos) << err.message;
  }
}

TEST(RequestSchema, MalformedBodiesAreRefused) {
  for (const std::string& text :
       {std::string("{\"model\": "), std::string("[1, 2]"), std::string(""), std::string("nul"),
        std::string("{\"model\": \"m\", \"prompt\": \"\xff\xfe\"}"), std::string(100000, '[')}) {
    try {
      fsv::parse_request(text, fsv::Endpoint::kCompletions);
      ADD_FAILURE() << "accepted " << text.substr(0, 40);
    } catch (const fsv::ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_TRUE(json::accept(e.body()));  // the error body itself is valid JSON
    }
  }
}

TEST(RequestSchema, DepthIsCountedOutsideStringsOnly) {
  const json in_string = {{"model", "m"}, {"prompt", std::string(100, '[') + "\"{"}};
  EXPECT_EQ(*fsv::parse_request(in_string.dump(), fsv::Endpoint::kCompletions).prompts[0].text,
            std::string(100, '[') + "\"{");
  json deep = 1;
  for (int i = 0; i < fsv::kMaxJsonDepth; ++i) deep = json::array({deep});
  EXPECT_EQ(refusal({{"model", "m"}, {"prompt", {1}}, {"user", deep}}).code, "invalid_json");
}

TEST(RequestSchema, NullIsNotGivenAndValidValuesAreKept) {
  json body = base(fsv::Endpoint::kChat);
  for (const char* k : {"max_tokens", "temperature", "top_p", "seed", "stop", "n", "logprobs",
                        "stream_options", "user", "response_format"})
    body[k] = nullptr;
  const fsv::GenerationRequest r = fsv::parse_request(body.dump(), fsv::Endpoint::kChat);
  EXPECT_FALSE(r.max_tokens);
  EXPECT_FALSE(r.seed_given);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, "hi");

  body = {{"model", "m"},
          {"prompt", {{7, 8}}},
          {"max_tokens", 9},
          {"temperature", 0.5},
          {"top_p", 0.9},
          {"top_k", -1},
          {"seed", -3},
          {"stop", "x"},
          {"stop_token_ids", {4}},
          {"stream", true},
          {"stream_options", {{"include_usage", true}}},
          {"n", 1},
          {"presence_penalty", 0}};
  const fsv::GenerationRequest c = fsv::parse_request(body.dump(), fsv::Endpoint::kCompletions);
  ASSERT_EQ(c.prompts.size(), 1u);
  EXPECT_EQ(c.prompts[0].ids, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(*c.max_tokens, 9);
  EXPECT_FLOAT_EQ(c.sampling.temperature, 0.5f);
  EXPECT_EQ(c.sampling.top_k, 0);
  EXPECT_EQ(c.sampling.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(c.stop, (std::vector<std::string>{"x"}));
  EXPECT_TRUE(c.stream && c.include_usage);
}

// A request that gives no temperature samples at 1, OpenAI's documented default and vLLM's: n
// choices of it differ, where greedy would return n copies of one text.
TEST(RequestSchema, TemperatureDefaultsToOne) {
  for (const fsv::Endpoint e : {fsv::Endpoint::kCompletions, fsv::Endpoint::kChat}) {
    json body = base(e);
    EXPECT_FLOAT_EQ(fsv::parse_request(body.dump(), e).sampling.temperature, 1.0f);
    body["temperature"] = nullptr;
    EXPECT_FLOAT_EQ(fsv::parse_request(body.dump(), e).sampling.temperature, 1.0f);
    body["temperature"] = 0;
    EXPECT_FLOAT_EQ(fsv::parse_request(body.dump(), e).sampling.temperature, 0.0f);
  }
}

// vLLM's extra_body fields and OpenAI's penalties, biases and echo, kept as given (their effect
// on sampling is the samplers' tests: tests/model/logits_adjust_test.cc).
TEST(RequestSchema, VllmSamplingFieldsAreKept) {
  json body = base(fsv::Endpoint::kCompletions);
  body["prompt"] = {"one", "two"};
  body["min_p"] = 0.05;
  body["repetition_penalty"] = 1.3;
  body["presence_penalty"] = -0.5;
  body["frequency_penalty"] = 2;
  body["logit_bias"] = {{"17", -100}, {"3", 2.5}};
  body["min_tokens"] = 3;
  body["max_tokens"] = 3;
  body["skip_special_tokens"] = false;
  body["include_stop_str_in_output"] = true;
  body["echo"] = true;
  const fsv::GenerationRequest r = fsv::parse_request(body.dump(), fsv::Endpoint::kCompletions);
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(*r.prompts[0].text, "one");
  EXPECT_EQ(*r.prompts[1].text, "two");
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.3f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 2.0f);
  auto bias = r.sampling.logit_bias;
  std::sort(bias.begin(), bias.end());
  EXPECT_EQ(bias, (std::vector<std::pair<int32_t, float>>{{3, 2.5f}, {17, -100.0f}}));
  EXPECT_EQ(r.sampling.min_tokens, 3);
  EXPECT_FALSE(r.skip_special_tokens);
  EXPECT_TRUE(r.include_stop_str_in_output);
  EXPECT_TRUE(r.echo);
  body["prompt"] = {{1, 2}, {3}};
  const fsv::GenerationRequest ids = fsv::parse_request(body.dump(), fsv::Endpoint::kCompletions);
  ASSERT_EQ(ids.prompts.size(), 2u);
  EXPECT_EQ(ids.prompts[1].ids, std::vector<int32_t>{3});
}

// Found by a hostile pass over the running server (each was accepted or mis-described before):
// unknown keys inside a content part were ignored; a message without content was read as ""; chat
// with max_tokens and max_completion_tokens of different values silently used max_tokens; an
// integer literal beyond 64 bits was "expected an integer, got a number"; a prompt [true] was
// "expected a string or an array of token ids, got an array"; top_p 1e-300 said "must be > 0".
TEST(RequestSchema, NestedFieldsAmbiguousLimitsAndMessagesThatSayWhatIsWrong) {
  const fsv::Endpoint chat = fsv::Endpoint::kChat;
  json body = base(chat);
  body["messages"] = json::array(
      {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"}, {"detail", 1}}}}}});
  fsv::ApiError err = refusal(body, chat);
  EXPECT_EQ(err.param, "messages[0].content[0].detail");
  EXPECT_NE(err.message.find("Unrecognized argument"), std::string::npos) << err.message;

  for (const json& m :
       {json{{"role", "user"}}, json{{"role", "assistant"}, {"content", nullptr}}}) {
    body["messages"] = json::array({m});
    err = refusal(body, chat);
    EXPECT_EQ(err.param, "messages[0].content") << m.dump();
    EXPECT_EQ(err.message, "messages[0].content: missing");
  }

  body = base(chat);
  body["max_tokens"] = 2;
  body["max_completion_tokens"] = 100000;
  err = refusal(body, chat);
  EXPECT_EQ(err.param, "max_completion_tokens");
  EXPECT_NE(err.message.find("differs from max_tokens 2"), std::string::npos) << err.message;
  body["max_completion_tokens"] = 2;  // the same value twice is one request
  fsv::GenerationRequest r = fsv::parse_request(body.dump(), chat);
  EXPECT_EQ(*r.max_tokens, 2);
  body.erase("max_tokens");
  body["max_completion_tokens"] = 7;
  r = fsv::parse_request(body.dump(), chat);
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_EQ(r.max_tokens_param, "max_completion_tokens");

  for (const char* literal : {"1000000000000000000000000000000", "-1e30", "18446744073709551616"}) {
    const std::string text =
        std::string(R"({"model": "m", "prompt": [1], "max_tokens": )") + literal + "}";
    try {
      fsv::parse_request(text, fsv::Endpoint::kCompletions);
      ADD_FAILURE() << literal;
    } catch (const fsv::ApiError& e) {
      EXPECT_EQ(e.param, "max_tokens");
      EXPECT_NE(e.message.find("is outside [1, 9223372036854775807]"), std::string::npos)
          << e.message;
    }
  }

  body = base(fsv::Endpoint::kCompletions);
  for (const auto& [prompt, param, says] : std::vector<std::tuple<json, std::string, std::string>>{
           {{true}, "prompt[0]", "expected an integer, got a boolean"},
           {{nullptr}, "prompt[0]", "expected an integer, got null"},
           {{1, json::object()}, "prompt[1]", "expected an integer, got an object"},
           // A batch of one prompt [[1]] (issue 24): its element [1] is named.
           {{{{1}}}, "prompt[0][0]", "expected an integer, got an array"}}) {
    body["prompt"] = prompt;
    err = refusal(body);
    EXPECT_EQ(err.param, param) << prompt.dump();
    EXPECT_NE(err.message.find(says), std::string::npos) << err.message;
  }

  body = base(fsv::Endpoint::kCompletions);
  body["top_p"] = 1e-300;
  err = refusal(body);
  EXPECT_EQ(err.param, "top_p");
  EXPECT_NE(err.message.find("rounds to 0 in float32"), std::string::npos) << err.message;
}

// Chat's response_format: text, json_object and json_schema taken, anything else refused naming
// response_format (or, in a json_schema, the field's path) and saying what is not supported.
TEST(RequestSchema, ResponseFormatAndItsRefusals) {
  json body = base(fsv::Endpoint::kChat);
  body["response_format"] = {{"type", "json_object"}};
  EXPECT_TRUE(fsv::parse_request(body.dump(), fsv::Endpoint::kChat).grammar);
  body["response_format"] = {{"type", "text"}};
  EXPECT_FALSE(fsv::parse_request(body.dump(), fsv::Endpoint::kChat).grammar);
  body["response_format"] = {{"type", "json_schema"},
                             {"json_schema",
                              {{"name", "x"},
                               {"strict", true},
                               {"schema", {{"type", "object"}, {"properties", json::object()}}}}}};
  EXPECT_TRUE(fsv::parse_request(body.dump(), fsv::Endpoint::kChat).grammar);
  const std::vector<std::tuple<json, std::string, std::string>> refused = {
      {{{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", json::object()}}}},
       "response_format.json_schema.schema",
       "the top level must be an object schema"},
      {{{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "object"}}}}}},
       "response_format.json_schema.name",
       "missing"},
      {{{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}},
       "response_format.json_schema.schema",
       "missing"},
      {{{"type", "json_schema"},
        {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}, {"extra", 1}}}},
       "response_format.json_schema.extra",
       "Unrecognized argument"},
      {{{"type", "json_schema"}}, "response_format.json_schema", "expected an object"},
      {{{"type", "json_object"}, {"strict", true}},
       "response_format",
       "\"strict\" is not supported"},
      {{{"type", "xml"}}, "response_format", "unknown type \"xml\""},
      {"json_object", "response_format", "expected an object"},
      {json::object(), "response_format", "expected an object"},
  };
  for (const auto& [format, param, says] : refused) {
    body["response_format"] = format;
    const fsv::ApiError e = refusal(body, fsv::Endpoint::kChat);
    EXPECT_EQ(e.param, param) << format.dump();
    EXPECT_NE(e.message.find(says), std::string::npos) << e.message;
  }
  // The grammar decides where the output ends: nothing may keep it going.
  body["response_format"] = {{"type", "json_object"}};
  for (const auto& [field, value] : {std::pair<std::string, json>{"min_tokens", 2},
                                     std::pair<std::string, json>{"ignore_eos", true}}) {
    json b = body;
    b[field] = value;
    const fsv::ApiError e = refusal(b, fsv::Endpoint::kChat);
    EXPECT_EQ(e.param, field);
    EXPECT_NE(e.message.find("its grammar decides where the output ends"), std::string::npos);
  }
}

TEST(StopStrings, HoldsBackWhatMayStillBecomeAStopSequence) {
  fsv::StopStrings s({"END", "xyz"});
  EXPECT_EQ(s.feed("hello E"), "hello ");  // "E" may start END
  EXPECT_EQ(s.feed("N"), "");              // "EN" too
  EXPECT_EQ(s.feed("d"), "ENd");           // not END after all
  EXPECT_EQ(s.feed("abcx"), "abc");
  EXPECT_EQ(s.feed("yzzz"), "");  // "xyz": stop; nothing from it on is sent
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.feed("more"), "");
  EXPECT_EQ(s.flush(), "");

  fsv::StopStrings t({"ab"});
  EXPECT_EQ(t.feed("xa"), "x");
  EXPECT_EQ(t.flush(), "a");  // the end came without a stop: the held text is sent
  fsv::StopStrings none({});
  EXPECT_EQ(none.feed("abc"), "abc");
}

TEST(Prometheus, HistogramBucketsAreCumulative) {
  fsv::Histogram h("x_seconds", "help", {0.1, 1});
  for (double v : {0.05, 0.1, 0.5, 7.0}) h.observe(v);
  std::string out;
  h.render(out);
  EXPECT_NE(out.find("# TYPE x_seconds histogram\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_bucket{le=\"0.1\"} 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"1\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"+Inf\"} 4\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_count 4\n"), std::string::npos) << out;
}

}  // namespace
