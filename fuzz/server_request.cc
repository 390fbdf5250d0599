// Fuzzes the HTTP server's request parsing (server/openai_request.h) and, for a request it
// accepts, what a choice returns for it (server/output_assembler.h): the first byte picks the
// endpoint and the finish, the rest is the JSON body.
//
// Parsing: every input is either refused with an ApiError of status 400 whose body is valid JSON,
// or parsed into a request that keeps the schema's promises: a prompt (text or non-negative ids)
// or messages with a role and content, max_tokens >= 1 when given, sampling parameters the engine
// accepts, at most 4 non-empty stop strings, logprobs in OpenAI's ranges.
//
// Output: the body's own bytes are generated "tokens" (ASCII bytes read as themselves, others as
// a held invalid byte that the detokeniser shows as U+FFFD with the next token) and go through the
// assembler with the request's stop strings three ways: one token per read, all in one read, and
// in reads of sizes the body picks. The three must return the same token ids, text, logprobs,
// finish reason and usage (a response must not depend on how the engine's tokens were batched);
// the text holds no stop string, the ids are a prefix of the tokens, usage counts the ids, and the
// logprobs are no more than the ids (none for the eos token).
//
// Structured output: a request's grammar (response_format json_object / json_schema, a forced
// tool call) reads the body's bytes, each it refuses skipped; the bytes it took, once it says they
// are whole, are a JSON object. With tools, the body read as the output of a choice gives calls
// whose arguments are JSON text, or content.
//
// Anything else (another exception, a crash, a sanitizer report) is a bug.
// Registration (fuzz/CMakeLists.txt): flashserve_fuzz_target(server_request flashserve_server)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "flashserve/error.h"
#include "model/json_recognizer.h"
#include "server/openai_request.h"
#include "server/output_assembler.h"
#include "server/tool_calls.h"

namespace fsv = flashserve::server;

namespace {
[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "server_request fuzz: %s\n", what);
  std::abort();
}

namespace fs = flashserve::serve;

const std::string kReplacement = "\xEF\xBF\xBD";

// ASCII tokens read as themselves; a byte >= 0x80 is held until the next token (or the end)
// shows it invalid, then comes out as U+FFFD, as the tokenizer's detokeniser does.
class ByteStream final : public fsv::TextStream {
 public:
  std::string push(int32_t t) override {
    if (t >= 0x80) {
      std::string out = flush();
      held_ = true;
      return out;
    }
    return flush() + std::string(1, static_cast<char>(t));
  }
  std::string flush() override {
    const bool h = held_;
    held_ = false;
    return h ? kReplacement : std::string();
  }

 private:
  bool held_ = false;
};

struct Returned {
  std::vector<int32_t> ids;
  std::string text;
  std::vector<float> logprobs;
  std::string finish;
  int64_t completion_tokens = 0;
  bool operator==(const Returned&) const = default;
};

Returned assemble(const std::vector<int32_t>& tokens, const std::vector<std::string>& stops,
                  fs::FinishReason finish, const std::vector<size_t>& reads) {
  fsv::OutputAssembler a(std::make_unique<ByteStream>(), stops);
  Returned r;
  size_t pos = 0, k = 0;
  while (!a.done()) {
    if (pos > tokens.size()) fail("the assembler did not finish at the end");
    const size_t n = std::min(reads[k++ % reads.size()], tokens.size() - pos);
    const std::vector<int32_t> read(tokens.begin() + static_cast<std::ptrdiff_t>(pos),
                                    tokens.begin() + static_cast<std::ptrdiff_t>(pos + n));
    std::vector<fsv::TokenLogprobs> lp;
    for (int32_t t : read) {
      fsv::TokenLogprobs e;
      e.sampled = {std::string(1, static_cast<char>(t)), true,
                   -static_cast<float>(pos + lp.size())};
      lp.push_back(e);
    }
    pos += n;
    fsv::Piece p;
    a.take(read, std::move(lp), pos == tokens.size() ? finish : fs::FinishReason::kNone, p);
    r.ids.insert(r.ids.end(), p.token_ids.begin(), p.token_ids.end());
    r.text += p.text;
    for (const auto& e : p.logprobs) r.logprobs.push_back(e.sampled.logprob);
    if (p.finish_reason) r.finish = *p.finish_reason;
    if (pos == tokens.size() && !a.done()) fail("not done after the finish");
  }
  r.completion_tokens = a.completion_tokens();
  return r;
}

void check_output(const fsv::GenerationRequest& r, std::string_view body, uint8_t flags) {
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < body.size() && tokens.size() < 256; ++i)
    tokens.push_back(static_cast<unsigned char>(body[i]));
  if (tokens.empty()) return;
  const fs::FinishReason finish = flags & 2 ? fs::FinishReason::kEos : fs::FinishReason::kLength;
  std::vector<size_t> reads;
  for (size_t i = 0; i < body.size() && reads.size() < 8; i += 7)
    reads.push_back(1 + static_cast<unsigned char>(body[i]) % 5);
  const Returned one = assemble(tokens, r.stop, finish, {1});
  const Returned all = assemble(tokens, r.stop, finish, {tokens.size()});
  const Returned mixed = assemble(tokens, r.stop, finish, reads);
  if (!(one == all) || !(one == mixed)) fail("the output depends on how the reads batched it");
  for (const std::string& s : r.stop)
    if (one.text.find(s) != std::string::npos) fail("a stop string in the returned text");
  if (one.ids.size() > tokens.size() || !std::equal(one.ids.begin(), one.ids.end(), tokens.begin()))
    fail("token_ids are not a prefix of the generated tokens");
  if (one.completion_tokens != static_cast<int64_t>(one.ids.size()))
    fail("usage does not count the token_ids");
  if (one.logprobs.size() > one.ids.size()) fail("more logprobs than tokens");
  if (one.finish != "stop" && one.finish != "length") fail("unknown finish reason");
  if (one.finish == "length" && one.ids.size() != tokens.size())
    fail("finish length with tokens dropped");
  if (finish == fs::FinishReason::kEos && one.ids.size() == tokens.size() &&
      one.logprobs.size() == one.ids.size())
    fail("the eos token has a logprobs entry");
}

void check_structured(const fsv::GenerationRequest& r, std::string_view body) {
  if (r.grammar) {
    flashserve::model::JsonRecognizer g(r.grammar.get());
    std::string taken;
    for (const char c : body)
      if (g.feed(static_cast<uint8_t>(c))) taken += c;
    if (g.complete() && !(taken.front() == '{' && nlohmann::json::accept(taken)))
      fail("the grammar took a whole text that is no JSON object");
  }
  if (r.tools.choice == fsv::ToolChoice::kNone) return;
  fsv::ToolCallReader reader(r.tools, 1);
  fsv::Piece p;
  p.text = std::string(body);
  p.finish_reason = "stop";
  reader.take(p);
  for (const fsv::ToolCall& c : p.tool_calls)
    if (p.finish_reason == "tool_calls" && !nlohmann::json::accept(c.arguments))
      fail("a tool call's arguments are not JSON");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const fsv::Endpoint endpoint = data[0] & 1 ? fsv::Endpoint::kChat : fsv::Endpoint::kCompletions;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const fsv::GenerationRequest r = fsv::parse_request(body, endpoint);
    if (endpoint == fsv::Endpoint::kChat) {
      if (r.messages.empty()) fail("chat request without messages");
      if (r.logprobs > fsv::kMaxChatTopLogprobs) fail("top_logprobs above 20");
      for (const auto& m : r.messages)
        if (m.role.empty()) fail("message without a role");
    } else if (r.prompts.empty() || r.prompts.size() > fsv::kMaxPrompts) {
      fail("completion without a prompt, or too many");
    }
    for (const fsv::Prompt& p : r.prompts) {
      if (!p.text && p.ids.empty()) fail("an empty prompt of a batch");
      if (p.text && p.text->empty()) fail("empty text prompt accepted");
      for (int32_t id : p.ids)
        if (id < 0) fail("negative prompt id");
    }
    if (r.sampling.min_tokens < 0 || (r.max_tokens && r.sampling.min_tokens > *r.max_tokens))
      fail("min_tokens outside [0, max_tokens] accepted");
    if (r.echo && r.logprobs >= 0) fail("echo with logprobs accepted");
    for (int32_t id : r.stop_token_ids)
      if (id < 0) fail("negative stop token id");
    if (r.max_tokens && *r.max_tokens < 1) fail("max_tokens < 1 accepted");
    if (r.stop.size() > fsv::kMaxStopStrings) fail("too many stop strings");
    for (const auto& s : r.stop)
      if (s.empty()) fail("empty stop string");
    if (r.include_usage && !r.stream) fail("include_usage without stream");
    if (endpoint == fsv::Endpoint::kCompletions && r.logprobs > fsv::kMaxCompletionLogprobs)
      fail("logprobs above 5");
    if (r.logprobs < -1) fail("logprobs below -1");
    try {
      r.sampling.validate();
    } catch (const flashserve::Error&) {
      fail("sampling parameters the engine refuses were accepted");
    }
    check_output(r, body, data[0]);
    check_structured(r, body);
  } catch (const fsv::ApiError& e) {
    if (e.status != 400) fail("a refusal that is not 400");
    if (!nlohmann::json::accept(e.body())) fail("an error body that is not JSON");
  }
  return 0;
}
