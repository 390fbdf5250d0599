// OutputAssembler: token ids, text, logprobs and usage of one choice stay in step at an eos or
// stop token and at a stop string, however the tokens are batched by the reads (checked against
// an independent reference on random token sequences, stop strings and batchings).
#include "server/output_assembler.h"

#include <gtest/gtest.h>

#include <random>
#include <utility>

namespace fs = flashserve::serve;
namespace fsv = flashserve::server;

namespace {

// Token t reads as (t % 3 + 1) copies of the letter 'a' + t % 4, so tokens have texts of 1 to 3
// bytes and a stop string can begin or end inside a token.
std::string token_text(int32_t t) {
  return std::string(static_cast<size_t>(t % 3 + 1), static_cast<char>('a' + t % 4));
}

// Token 9 is a lone invalid byte: the stream holds it until the next token shows it cannot start
// a character, then gives U+FFFD with that token's text (as the tokenizer's decoder does).
constexpr int32_t kInvalidByte = 9;
const std::string kReplacement = "\xEF\xBF\xBD";

class LetterStream final : public fsv::TextStream {
 public:
  std::string push(int32_t t) override {
    if (t == kInvalidByte) {
      held_ = true;
      return {};
    }
    return flush() + token_text(t);
  }
  std::string flush() override { return std::exchange(held_, false) ? kReplacement : ""; }

 private:
  bool held_ = false;
};

fsv::TokenLogprobs entry(int32_t t) {
  fsv::TokenLogprobs e;
  e.sampled = {t == kInvalidByte ? "\xFF" : token_text(t), true, -0.5f * static_cast<float>(t)};
  return e;
}

struct Output {
  std::vector<int32_t> ids;
  std::string text;
  std::vector<float> logprobs;  // the sampled tokens' values, which name the tokens here
  std::string finish;
  int64_t completion_tokens = 0;
};

// Feeds `tokens` in reads of the sizes `batches` (cycled); the last read carries `finish`.
Output assemble(const std::vector<int32_t>& tokens, const std::vector<std::string>& stops,
                fs::FinishReason finish, const std::vector<size_t>& batches) {
  fsv::OutputAssembler a(std::make_unique<LetterStream>(), stops);
  Output o;
  size_t pos = 0, b = 0;
  while (!a.done()) {
    const size_t n = std::min(batches[b++ % batches.size()], tokens.size() - pos);
    std::vector<int32_t> read(tokens.begin() + static_cast<std::ptrdiff_t>(pos),
                              tokens.begin() + static_cast<std::ptrdiff_t>(pos + n));
    std::vector<fsv::TokenLogprobs> lp;
    for (int32_t t : read) lp.push_back(entry(t));
    pos += n;
    fsv::Piece p;
    a.take(read, std::move(lp), pos == tokens.size() ? finish : fs::FinishReason::kNone, p);
    o.ids.insert(o.ids.end(), p.token_ids.begin(), p.token_ids.end());
    o.text += p.text;
    for (const auto& e : p.logprobs) o.logprobs.push_back(e.sampled.logprob);
    if (p.finish_reason) o.finish = *p.finish_reason;
    if (pos == tokens.size() && !a.done()) ADD_FAILURE() << "not done after the finish";
  }
  EXPECT_EQ(a.finish_reason(), o.finish);
  o.completion_tokens = a.completion_tokens();
  return o;
}

TEST(OutputAssembler, EosTokenIsInTokenIdsButNotInTextOrLogprobs) {
  // 0 1 2 then the eos (7): text "a" "bb" "ccc"; three entries; four ids and completion tokens.
  for (const auto finish : {fs::FinishReason::kEos, fs::FinishReason::kStop}) {
    for (const size_t batch : {1, 2, 4}) {
      const Output o = assemble({0, 1, 2, 7}, {}, finish, {batch});
      EXPECT_EQ(o.ids, std::vector<int32_t>({0, 1, 2, 7}));
      EXPECT_EQ(o.text, "abbccc");
      EXPECT_EQ(o.logprobs, std::vector<float>({0.0f, -0.5f, -1.0f})) << batch;
      EXPECT_EQ(o.completion_tokens, 4);
      EXPECT_EQ(o.finish, "stop");
    }
  }
  // Length: every token is text.
  const Output o = assemble({0, 1}, {}, fs::FinishReason::kLength, {1});
  EXPECT_EQ(o.logprobs.size(), 2u);
  EXPECT_EQ(o.finish, "length");
}

TEST(OutputAssembler, TokensAfterAStopStringAreDroppedInEveryBatching) {
  // Texts: 0 "a", 1 "bb", 2 "ccc", 4 "aa", 5 "bbb". Stop "bc" completes at token 2; tokens 4, 5
  // read in the same batch were generated after it.
  for (const size_t batch : {1, 2, 3, 5}) {
    const Output o = assemble({0, 1, 2, 4, 5}, {"bc"}, fs::FinishReason::kLength, {batch});
    EXPECT_EQ(o.ids, std::vector<int32_t>({0, 1, 2})) << batch;
    EXPECT_EQ(o.completion_tokens, 3) << batch;
    EXPECT_EQ(o.text, "ab") << batch;
    // Token 1 ("bb") begins before the cut (at "ab|bccc"), so it keeps its entry; token 2 lies
    // wholly inside the stop string.
    EXPECT_EQ(o.logprobs, std::vector<float>({0.0f, -0.5f})) << batch;
    EXPECT_EQ(o.finish, "stop");
  }
}

// The detokeniser gives a held byte's U+FFFD together with the next token's text: that token
// begins after the U+FFFD, so a stop string starting there leaves it out. (Before: the token was
// taken to begin where the U+FFFD does, and kept its entry.)
TEST(OutputAssembler, ATokenAfterAHeldByteBeginsAfterItsReplacementCharacter) {
  for (const size_t batch : {1, 2, 3}) {
    const Output o = assemble({0, kInvalidByte, 1, 2}, {"bb"}, fs::FinishReason::kLength, {batch});
    EXPECT_EQ(o.text, "a" + kReplacement) << batch;
    EXPECT_EQ(o.ids, std::vector<int32_t>({0, kInvalidByte, 1})) << batch;
    EXPECT_EQ(o.logprobs, std::vector<float>({0.0f, -4.5f})) << batch;
  }
  // A stop string that takes the U+FFFD with it drops the byte's entry too.
  const Output o = assemble({0, kInvalidByte, 1}, {kReplacement}, fs::FinishReason::kLength, {1});
  EXPECT_EQ(o.text, "a");
  EXPECT_EQ(o.logprobs, std::vector<float>({0.0f}));
}

// The reference: the stop string is found at the first token whose text completes one; the text
// is cut at the earliest stop string in the text up to that token; entries are the tokens that
// begin before the cut.
Output reference(const std::vector<int32_t>& tokens, const std::vector<std::string>& stops,
                 fs::FinishReason finish) {
  Output o;
  std::string text;
  std::vector<size_t> starts;
  const bool ends_on_token = finish == fs::FinishReason::kEos || finish == fs::FinishReason::kStop;
  for (size_t k = 0; k < tokens.size(); ++k) {
    o.ids.push_back(tokens[k]);
    if (ends_on_token && k + 1 == tokens.size()) break;
    starts.push_back(text.size());
    text += token_text(tokens[k]);
    size_t cut = std::string::npos;
    for (const auto& s : stops) cut = std::min(cut, text.find(s));
    if (cut != std::string::npos) {
      o.text = text.substr(0, cut);
      for (size_t j = 0; j < starts.size(); ++j)
        if (starts[j] < cut) o.logprobs.push_back(-0.5f * static_cast<float>(tokens[j]));
      o.finish = "stop";
      o.completion_tokens = static_cast<int64_t>(o.ids.size());
      return o;
    }
  }
  o.text = text;
  for (size_t j = 0; j < starts.size(); ++j)
    o.logprobs.push_back(-0.5f * static_cast<float>(tokens[j]));
  o.finish = finish == fs::FinishReason::kLength ? "length" : "stop";
  o.completion_tokens = static_cast<int64_t>(o.ids.size());
  return o;
}

TEST(OutputAssembler, MatchesTheReferenceOnRandomSequencesStopsAndBatchings) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int32_t> tokens(1 + rng() % 12);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % 8);
    std::vector<std::string> stops(rng() % 3);
    for (auto& s : stops) {
      s.resize(1 + rng() % 4);
      for (char& c : s) c = static_cast<char>('a' + rng() % 3);
    }
    const fs::FinishReason finish =
        std::vector{fs::FinishReason::kLength, fs::FinishReason::kEos}[rng() % 2];
    std::vector<size_t> batches(1 + rng() % 3);
    for (auto& b : batches) b = 1 + rng() % 4;
    const Output got = assemble(tokens, stops, finish, batches);
    const Output want = reference(tokens, stops, finish);
    ASSERT_EQ(got.ids, want.ids) << trial;
    ASSERT_EQ(got.text, want.text) << trial;
    ASSERT_EQ(got.logprobs, want.logprobs) << trial;
    ASSERT_EQ(got.finish, want.finish) << trial;
    ASSERT_EQ(got.completion_tokens, want.completion_tokens) << trial;
  }
}

TEST(OutputAssembler, StreamedEntriesWaitForTheirText) {
  // Stop "ab..."-prefix: "a" is held back as a possible start of "abc", and its entry with it.
  fsv::OutputAssembler a(std::make_unique<LetterStream>(), {"abc"});
  fsv::Piece p;
  a.take({0}, {entry(0)}, fs::FinishReason::kNone, p);  // "a"
  EXPECT_EQ(p.text, "");
  EXPECT_TRUE(p.logprobs.empty());
  EXPECT_EQ(p.token_ids, std::vector<int32_t>({0}));
  fsv::Piece q;
  a.take({3}, {entry(3)}, fs::FinishReason::kNone, q);  // "d": "ad" cannot start "abc"
  EXPECT_EQ(q.text, "ad");
  ASSERT_EQ(q.logprobs.size(), 2u);
  EXPECT_FALSE(a.done());
}

// Without a tokenizer there is no text: every token but the eos/stop token has its entry at once.
TEST(OutputAssembler, WithoutATokenizer) {
  fsv::OutputAssembler a(nullptr, {});
  fsv::Piece p;
  a.take({5, 6}, {entry(5), entry(6)}, fs::FinishReason::kNone, p);
  EXPECT_EQ(p.logprobs.size(), 2u);
  fsv::Piece q;
  a.take({7, 2}, {entry(7), entry(2)}, fs::FinishReason::kStop, q);
  EXPECT_EQ(q.token_ids, std::vector<int32_t>({7, 2}));
  EXPECT_EQ(q.logprobs.size(), 1u);
  EXPECT_EQ(a.completion_tokens(), 4);
  EXPECT_STREQ(a.finish_reason(), "stop");
}

}  // namespace
