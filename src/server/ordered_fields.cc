#include "server/ordered_fields.h"

#include <unordered_map>
#include <utility>
#include <vector>

namespace flashserve::server {
namespace {

using ojson = nlohmann::ordered_json;

// nlohmann's SAX interface: builds the wanted fields' values, nothing else.
class Reader {
 public:
  explicit Reader(const std::set<std::string>& fields) : fields_(fields) {}
  std::map<std::string, ojson> out;

  bool null() { return value(nullptr); }
  bool boolean(bool v) { return value(v); }
  bool number_integer(ojson::number_integer_t v) { return value(v); }
  bool number_unsigned(ojson::number_unsigned_t v) { return value(v); }
  bool number_float(ojson::number_float_t v, const std::string&) { return value(v); }
  bool string(std::string& v) { return value(std::move(v)); }
  bool binary(ojson::binary_t&) { return false; }  // not in JSON text
  bool start_object(std::size_t) { return open(ojson::object()); }
  bool start_array(std::size_t) { return open(ojson::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& k) {
    if (depth_ == 1) {
      capturing_ = fields_.count(k) > 0;
      field_ = k;
    } else {
      key_ = std::move(k);
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    out.clear();
    return false;
  }

 private:
  struct Open {
    ojson* json;
    std::unordered_map<std::string, size_t> index;  // an object's keys -> their place
  };

  bool value(ojson v) {
    if (capturing_ && depth_ >= 1) place(std::move(v));
    return true;
  }
  bool open(ojson v) {
    if (++depth_ > 1 && capturing_) stack_.push_back({place(std::move(v)), {}});
    return true;
  }
  bool close() {
    if (depth_-- > 1 && capturing_) stack_.pop_back();
    return true;
  }
  // Puts `v` where the text has it; returns it (an ancestor's place does not move while a
  // descendant is open: only the innermost container grows).
  ojson* place(ojson v) {
    if (stack_.empty()) {
      ojson& slot = out[field_];
      slot = std::move(v);
      return &slot;
    }
    Open& top = stack_.back();
    if (top.json->is_array()) {
      top.json->push_back(std::move(v));
      return &top.json->back();
    }
    auto& items = top.json->get_ref<ojson::object_t&>();
    if (const auto it = top.index.find(key_); it != top.index.end()) {
      auto at = items.begin() + static_cast<std::ptrdiff_t>(it->second);
      at->second = std::move(v);
      return &at->second;
    }
    top.index.emplace(key_, items.size());
    items.emplace_back(key_, std::move(v));
    return &items.back().second;
  }

  const std::set<std::string>& fields_;
  int depth_ = 0;  // containers open, the body's own object included
  bool capturing_ = false;
  std::string field_, key_;
  std::vector<Open> stack_;
};

}  // namespace

std::map<std::string, ojson> ordered_fields(std::string_view body,
                                            const std::set<std::string>& fields) {
  Reader reader(fields);
  ojson::sax_parse(body.begin(), body.end(), &reader);
  return std::move(reader.out);
}

}  // namespace flashserve::server
