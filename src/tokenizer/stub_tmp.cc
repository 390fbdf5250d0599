// First commit: the API compiles; the bodies come next.
#include "flashserve/error.h"
#include "tokenizer/tokenizer.h"

namespace flashserve::tokenizer {
namespace {
[[noreturn]] void todo() {
  throw Error(ErrorKind::kUnsupported, "tokenizer", "not implemented yet");
}
}  // namespace
class TokenizerImpl {};
struct ChatTemplate::Program {};
Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer Tokenizer::load(const std::string&) {
  todo();
}
Tokenizer Tokenizer::from_json(std::string_view, std::string_view) {
  todo();
}
std::vector<int32_t> Tokenizer::encode(std::string_view, bool) const {
  todo();
}
std::string Tokenizer::decode(std::span<const int32_t>, bool) const {
  todo();
}
int32_t Tokenizer::vocab_size() const {
  todo();
}
std::optional<int32_t> Tokenizer::token_id(std::string_view) const {
  todo();
}
std::optional<std::string> Tokenizer::token(int32_t) const {
  todo();
}
bool Tokenizer::is_special(int32_t) const {
  todo();
}
const std::vector<int32_t>& Tokenizer::eos_token_ids() const {
  todo();
}
std::optional<int32_t> Tokenizer::bos_token_id() const {
  todo();
}
const std::string& Tokenizer::bos_token() const {
  todo();
}
const std::string& Tokenizer::eos_token() const {
  todo();
}
IncrementalDecoder::IncrementalDecoder(const Tokenizer& t, std::span<const int32_t>, bool s)
    : tokenizer_(&t), skip_special_(s) {}
std::string IncrementalDecoder::push(int32_t) {
  todo();
}
std::string IncrementalDecoder::flush() {
  todo();
}
ChatTemplate::ChatTemplate(std::shared_ptr<const Program> p) : program_(std::move(p)) {}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate ChatTemplate::load(const std::string&) {
  todo();
}
ChatTemplate ChatTemplate::from_file(const std::string&, std::string, std::string) {
  todo();
}
ChatTemplate ChatTemplate::from_string(std::string, std::string, std::string) {
  todo();
}
std::string ChatTemplate::render(const std::vector<ChatMessage>&, bool) const {
  todo();
}
}  // namespace flashserve::tokenizer
