// The Jinja subset that chat templates are written in. What it supports (anything else is a
// parse or render error of kind kUnsupported that names the construct and its line):
//   {{ expr }}, {% if %}/{% elif %}/{% else %}/{% endif %}, {% for x in xs %} (also `for k, v in`,
//   an `if` filter on the loop and {% else %}), {% set x = expr %}, {% set ns.attr = expr %},
//   {# comments #}, `-` whitespace control, and trim_blocks + lstrip_blocks as transformers
//   renders chat templates.
//   Expressions: literals (strings with escapes, integers, floats, true/false/none in either
//   case, [lists], {dicts}), variables, `.attr`, `[index]`, `[a:b]` slices, calls, `x if c else
//   y`, or/and/not, == != < > <= >=, in / not in, `is [not] defined/undefined/none/string/
//   number/mapping/iterable/sequence/boolean/integer/true/false/odd/even`, + - * / // %, `~`.
//   Filters: trim, length, count, upper, lower, capitalize, title, string, int, float, first,
//   last, join, default (d), replace, list, reverse, tojson, safe, abs, items, selectattr /
//   rejectattr / map(attribute=). Globals: raise_exception, namespace, range.
//   Methods: str.strip/lstrip/rstrip/startswith/endswith/split/upper/lower/replace/title,
//   dict.items/keys/values/get.
//   loop: index, index0, revindex, revindex0, first, last, length, previtem, nextitem.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace flashserve::tokenizer::jinja {

struct Value;
using List = std::vector<Value>;
using Dict = std::map<std::string, Value>;

struct Undefined {};
struct None {};

// Lists and dicts are shared, as in Python: a namespace() set in a loop is seen after it.
struct Value {
  std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<List>,
               std::shared_ptr<Dict>>
      v;
  Value() = default;
  Value(None n) : v(n) {}
  Value(bool b) : v(b) {}
  Value(int64_t i) : v(i) {}
  Value(double d) : v(d) {}
  Value(std::string s) : v(std::move(s)) {}
  Value(const char* s) : v(std::string(s)) {}
  Value(List l) : v(std::make_shared<List>(std::move(l))) {}
  Value(Dict d) : v(std::make_shared<Dict>(std::move(d))) {}
};

struct Node;

class Template {
 public:
  // Throws Error(kUnsupported, "chat_template", ...) for syntax outside the subset.
  explicit Template(const std::string& source);
  ~Template();
  // Errors: raise_exception gives Error(kInvalidArgument, "messages", its message); other
  // render-time failures Error(kUnsupported or kInvalidArgument, "chat_template", ...).
  std::string render(const Dict& globals) const;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace flashserve::tokenizer::jinja
