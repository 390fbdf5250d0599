// Fuzzes the tokenizer (src/tokenizer) on arbitrary bytes. The first byte picks the mode:
//   0: encode the rest with the byte-level fixture: never throws; decode gives valid UTF-8 and,
//      byte-level BPE being lossless, exactly the input made valid (U+FFFD for invalid bytes);
//      encode_within(limit) is the encoding when it fits the limit and nullopt when not (all
//      text modes);
//   1: the same with the byte-fallback fixture: valid UTF-8 out, no exception;
//   2, 3: the rest as token ids (2 bytes each, modulo the vocabulary) of either fixture: decode
//      is valid UTF-8, and streaming them through IncrementalDecoder gives valid chunks adding up
//      to the decode (with byte fallback: where the decode has no U+FFFD, see check_ids);
//   4: the rest as a chat template: it parses and renders or throws flashserve::Error, nothing
//      else (no crash, no other exception, no unbounded recursion);
//   5 (first byte 250 and up): the Unicode normalizers: the Qwen2-shaped NFC fixture round-trips
//      to the NFC form of the input made valid, and the NFKD + StripAccents + Lowercase + Strip
//      fixture encodes to valid ids and decodes to valid UTF-8.
// Registered in fuzz/CMakeLists.txt: flashserve_fuzz_target(tokenizer
// flashserve_tokenizer). The fixtures are found beside this file (tests/tokenizer/fixtures).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flashserve/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace tok = flashserve::tokenizer;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "tokenizer fuzz: %s\n", what);
  std::abort();
}

const tok::Tokenizer& fixture(int which) {
  static const std::string dir = [] {
    std::string f = __FILE__;
    return f.substr(0, f.rfind('/')) + "/../tests/tokenizer/fixtures/";
  }();
  static const tok::Tokenizer byte_level = tok::Tokenizer::load(dir + "byte_level");
  static const tok::Tokenizer byte_fallback = tok::Tokenizer::load(dir + "byte_fallback");
  static const tok::Tokenizer qwen2_nfc = tok::Tokenizer::load(dir + "qwen2_nfc");
  static const tok::Tokenizer folded = tok::Tokenizer::load(dir + "byte_level_folded");
  const tok::Tokenizer* all[] = {&byte_level, &byte_fallback, &qwen2_nfc, &folded};
  return *all[which];
}

void check_text(const tok::Tokenizer& t, const std::string& text, bool lossless) {
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = t.encode(text, special);
    for (int32_t id : ids)
      if (id < 0 || id >= t.vocab_size()) fail("encode gave an id outside the vocabulary");
    // encode_within is the whole encoding up to its limit and nothing past it, wherever it stops.
    const size_t limits[] = {0, ids.size() / 3, ids.size() / 2, ids.size() - (ids.size() > 0),
                             ids.size()};
    for (size_t k : limits) {
      const auto within = t.encode_within(text, special, k);
      if (ids.size() <= k ? !within || *within != ids : within.has_value())
        fail("encode_within disagrees with encode");
    }
    const std::string back = t.decode(ids, false);
    if (!tok::utf8::is_valid(back)) fail("decode gave invalid UTF-8");
    if (lossless && !special && back != tok::utf8::lossy(text)) fail("byte-level round trip");
  }
}

void check_ids(const tok::Tokenizer& t, bool byte_level, const uint8_t* data, size_t size) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size && ids.size() < 4096; i += 2)
    ids.push_back((data[i] | data[i + 1] << 8) % t.vocab_size());
  for (bool skip : {false, true}) {
    const std::string whole = t.decode(ids, skip);
    if (!tok::utf8::is_valid(whole)) fail("decode gave invalid UTF-8");
    tok::IncrementalDecoder d(t, {}, skip);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string chunk = d.push(id);
      if (!tok::utf8::is_valid(chunk)) fail("a streamed chunk is invalid UTF-8");
      streamed += chunk;
    }
    streamed += d.flush();
    // Byte fallback: Hugging Face's decoder turns a whole run of byte tokens into U+FFFDs when any
    // byte of it is invalid, even characters completed earlier in the run, which a stream has
    // already shown. So the sum of the chunks equals the decode where the decode has no U+FFFD.
    const bool exact = byte_level || whole.find(tok::utf8::kReplacement) == std::string::npos;
    if (exact && streamed != whole) fail("streamed chunks do not add up to the decode");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] >= 250 ? 5 : data[0] % 5;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch (mode) {
      case 0:
        check_text(fixture(0), rest, true);
        break;
      case 1:
        check_text(fixture(1), rest, false);
        break;
      case 2:
      case 3:
        check_ids(fixture(mode - 2), mode == 2, data + 1, size - 1);
        break;
      case 5: {
        check_text(fixture(3), rest, false);
        const std::vector<int32_t> ids = fixture(2).encode(rest, false);
        if (fixture(2).decode(ids, false) !=
            tok::unicode::normalize(tok::utf8::lossy(rest), tok::unicode::Form::kNFC))
          fail("NFC byte-level round trip");
        break;
      }
      default: {
        if (rest.size() > 4096) return 0;  // templates are short; keeps renders quick
        try {
          const auto t = tok::ChatTemplate::from_string(rest, "<s>", "</s>");
          (void)t.render({{"user", "Hi"}, {"assistant", "Hello"}, {"system", "s"}}, true);
        } catch (const flashserve::Error&) {
          // a template outside the subset, or one that raises: both are expected
        }
      }
    }
  } catch (const flashserve::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    fail("flashserve::Error where none is allowed");
  }
  return 0;
}
