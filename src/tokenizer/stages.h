// The stages of tokenizer.json around the model: normalizers and pre-tokenizers on the way in,
// decoders on the way out. Each is built from its JSON object; a "type" we do not implement
// throws Error(kUnsupported) naming the field and the type.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace flashserve::tokenizer {

// One piece of text between the added tokens, as the pre-tokenizers see it.
struct Piece {
  std::string text;
  bool at_start;  // the piece begins the input text (Metaspace prepend_scheme "first")
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void apply(std::string& text) const = 0;
};

// Where a pre-tokenizer hands its pieces, one at a time, in order.
using PieceSink = std::function<void(Piece&&)>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Hands `sink` the pieces `piece` splits into, in order. Piece by piece rather than as a list:
  // each stage splits each piece on its own (as in Hugging Face's tokenizers), so the pieces of a
  // prompt, millions for a few MB of text, never need to exist at once.
  virtual void split(Piece piece, const PieceSink& sink) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Tokens are byte strings here (a ByteLevel token maps back to arbitrary bytes); the caller
  // turns the joined result into valid UTF-8.
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};

// null gives nullptr. `field` names the JSON path for errors ("tokenizer.json: normalizer").
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& field);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& field);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& field);

}  // namespace flashserve::tokenizer
