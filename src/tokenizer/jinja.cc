// The Jinja subset of jinja.h in three parts: the lexer cuts the source into text, {{ }} and
// {% %} segments (applying whitespace control, trim_blocks and lstrip_blocks) and each tag into
// tokens; the parser builds a tree of Nodes; the renderer walks it with Python's semantics for
// the values (truthiness, equality, indexing, string methods).
#include "tokenizer/jinja.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include <nlohmann/json.hpp>

#include "flashserve/error.h"
#include "tokenizer/utf8.h"

namespace flashserve::tokenizer::jinja {

namespace {

constexpr const char* kHint =
    "; it is outside flashserve's Jinja subset (src/tokenizer/jinja.h): give the server a "
    "template of your own with --chat-template FILE";

[[noreturn]] void unsupported(int line, const std::string& what) {
  throw Error(ErrorKind::kUnsupported, "chat_template",
              "line " + std::to_string(line) + ": " + what + kHint);
}

[[noreturn]] void render_error(int line, const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, "chat_template",
              "line " + std::to_string(line) + ": " + what);
}

constexpr int kMaxDepth = 200;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// ---------------------------------------------------------------- lexer

struct Segment {
  enum Kind { kText, kExpr, kStmt } kind;
  std::string text;
  int line;
};

// Finds the end of a tag, skipping quoted strings (a "}}" inside '...' does not close it).
size_t find_close(const std::string& s, size_t from, const char* close) {
  char quote = 0;
  for (size_t i = from; i + 1 < s.size(); ++i) {
    if (quote) {
      if (s[i] == '\\')
        ++i;
      else if (s[i] == quote)
        quote = 0;
    } else if (s[i] == '\'' || s[i] == '"') {
      quote = s[i];
    } else if (s[i] == close[0] && s[i + 1] == close[1]) {
      return i;
    }
  }
  return std::string::npos;
}

std::vector<Segment> segment(const std::string& src) {
  std::vector<Segment> out;
  size_t i = 0;
  bool strip_next = false, trim_newline = false;
  while (i <= src.size()) {
    size_t j = src.size();
    for (const char* open : {"{{", "{%", "{#"}) j = std::min(j, src.find(open, i));
    std::string text = src.substr(i, j - i);
    if (strip_next) {
      text.erase(0, std::find_if(text.begin(), text.end(), [](char c) { return !is_space(c); }) -
                        text.begin());
    } else if (trim_newline) {  // trim_blocks: the newline right after a block tag goes
      if (text.compare(0, 1, "\n") == 0)
        text.erase(0, 1);
      else if (text.compare(0, 2, "\r\n") == 0)
        text.erase(0, 2);
    }
    strip_next = trim_newline = false;
    const int line = 1 + static_cast<int>(std::count(src.begin(), src.begin() + j, '\n'));
    if (j == src.size()) {
      if (!text.empty()) out.push_back({Segment::kText, text, line});
      break;
    }
    const char kind = src[j + 1];
    const char mod = j + 2 < src.size() ? src[j + 2] : 0;
    if (mod == '-') {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (kind != '{' && mod != '+') {  // lstrip_blocks: a block tag alone on its line
      // Judged on the source: the newline may already be gone to trim_blocks.
      size_t p = j;
      while (p > i && (src[p - 1] == ' ' || src[p - 1] == '\t')) --p;
      const size_t blanks = j - p;
      if ((p == 0 || src[p - 1] == '\n') && blanks <= text.size()) text.erase(text.size() - blanks);
    }
    if (!text.empty()) out.push_back({Segment::kText, text, line});
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t body = j + 2 + (mod == '-' || mod == '+' ? 1 : 0);
    const size_t end = kind == '#' ? src.find("#}", body) : find_close(src, body, close);
    if (end == std::string::npos) unsupported(line, std::string("unclosed '{") + kind + "'");
    std::string inner = src.substr(body, end - body);
    if (!inner.empty() && inner.back() == '-') {
      strip_next = true;
      inner.pop_back();
    } else if (kind != '{') {
      if (!inner.empty() && inner.back() == '+')
        inner.pop_back();
      else
        trim_newline = true;
    }
    if (kind == '{')
      out.push_back({Segment::kExpr, inner, line});
    else if (kind == '%')
      out.push_back({Segment::kStmt, inner, line});
    i = end + 2;
  }
  return out;
}

struct Token {
  enum Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;
};

std::vector<Token> tokenize(const std::string& s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (is_space(c)) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t k = i;
      while (k < s.size() && (std::isalnum(static_cast<unsigned char>(s[k])) || s[k] == '_')) ++k;
      out.push_back({Token::kName, s.substr(i, k - i)});
      i = k;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t k = i;
      while (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) ++k;
      bool is_float =
          k + 1 < s.size() && s[k] == '.' && std::isdigit(static_cast<unsigned char>(s[k + 1]));
      if (is_float) {
        ++k;
        while (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) ++k;
      }
      out.push_back({is_float ? Token::kFloat : Token::kInt, s.substr(i, k - i)});
      i = k;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t k = i + 1;
      for (; k < s.size() && s[k] != c; ++k) {
        if (s[k] != '\\' || k + 1 >= s.size()) {
          v += s[k];
          continue;
        }
        const char e = s[++k];
        switch (e) {
          case 'n':
            v += '\n';
            break;
          case 't':
            v += '\t';
            break;
          case 'r':
            v += '\r';
            break;
          case '\\':
            v += '\\';
            break;
          case '\'':
            v += '\'';
            break;
          case '"':
            v += '"';
            break;
          default:
            v += '\\', v += e;  // Python keeps unknown escapes as written
        }
      }
      if (k >= s.size()) unsupported(line, "unterminated string");
      out.push_back({Token::kString, v});
      i = k + 1;
    } else {
      static const char* ops[] = {"//", "==", "!=", "<=", ">=", "**", "+", "-", "*",
                                  "/",  "%",  "~",  "<",  ">",  "|",  ".", ",", ":",
                                  "(",  ")",  "[",  "]",  "{",  "}",  "="};
      const char* found = nullptr;
      for (const char* op : ops)
        if (s.compare(i, std::strlen(op), op) == 0) {
          found = op;
          break;
        }
      if (!found) unsupported(line, std::string("character '") + c + "'");
      out.push_back({Token::kOp, found});
      i += std::strlen(found);
    }
  }
  out.push_back({Token::kEnd, ""});
  return out;
}

}  // namespace

// ---------------------------------------------------------------- tree

struct Node {
  enum Kind {
    // expressions
    kLiteral,
    kVar,
    kAttr,
    kIndex,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kUnary,
    kBinary,
    kCond,
    kList,
    kDict,
    // statements
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kBlock
  } kind;
  int line = 0;
  std::string name;  // variable, attribute, operator, filter, test; the text of kText
  Value literal;
  bool negate = false;                      // `is not`, `not in`
  std::vector<std::shared_ptr<Node>> kids;  // operands, arguments (nullptr: an absent slice bound)
  std::vector<std::string> names;           // keyword names of arguments; for/set targets
  std::vector<std::vector<std::shared_ptr<Node>>> bodies;  // if: one per branch; for: body, else
};
using NodePtr = std::shared_ptr<Node>;

namespace {

NodePtr node(Node::Kind k, int line, std::string name = {}) {
  auto n = std::make_shared<Node>();
  n->kind = k;
  n->line = line;
  n->name = std::move(name);
  return n;
}

// ---------------------------------------------------------------- parser

class ExprParser {
 public:
  ExprParser(std::vector<Token> toks, int line) : t_(std::move(toks)), line_(line) {}

  bool at_end() const { return t_[p_].kind == Token::kEnd; }
  bool peek_name(const char* n) const { return t_[p_].kind == Token::kName && t_[p_].text == n; }
  bool peek_op(const char* o) const { return t_[p_].kind == Token::kOp && t_[p_].text == o; }
  bool accept_name(const char* n) { return peek_name(n) ? (++p_, true) : false; }
  bool accept_op(const char* o) { return peek_op(o) ? (++p_, true) : false; }
  void expect_op(const char* o) {
    if (!accept_op(o))
      unsupported(line_, std::string("expected '") + o + "' near '" + t_[p_].text + "'");
  }
  std::string expect_name() {
    if (t_[p_].kind != Token::kName)
      unsupported(line_, "expected a name near '" + t_[p_].text + "'");
    return t_[p_++].text;
  }
  void expect_end() {
    if (!at_end()) unsupported(line_, "unexpected '" + t_[p_].text + "'");
  }

  NodePtr expression() {
    NodePtr e = or_expr();
    if (accept_name("if")) {  // x if cond else y
      auto n = node(Node::kCond, line_);
      n->kids = {e, or_expr(), nullptr};
      if (accept_name("else")) n->kids[2] = expression();
      return n;
    }
    return e;
  }

  // An expression without the trailing `if` (the iterable of a for loop with a filter).
  NodePtr or_expr() {
    NodePtr l = and_expr();
    while (accept_name("or")) l = binary("or", l, and_expr());
    return l;
  }

 private:
  NodePtr binary(const std::string& op, NodePtr l, NodePtr r) {
    auto n = node(Node::kBinary, line_, op);
    n->kids = {std::move(l), std::move(r)};
    return n;
  }
  NodePtr and_expr() {
    NodePtr l = not_expr();
    while (accept_name("and")) l = binary("and", l, not_expr());
    return l;
  }
  NodePtr not_expr() {
    if (accept_name("not")) {
      auto n = node(Node::kUnary, line_, "not");
      n->kids = {not_expr()};
      return n;
    }
    return compare();
  }
  NodePtr compare() {
    NodePtr l = add();
    for (;;) {
      std::string op;
      for (const char* o : {"==", "!=", "<=", ">=", "<", ">"})
        if (accept_op(o)) {
          op = o;
          break;
        }
      if (!op.empty()) {
        l = binary(op, l, add());
      } else if (accept_name("in")) {
        l = binary("in", l, add());
      } else if (peek_name("not") && t_[p_ + 1].kind == Token::kName && t_[p_ + 1].text == "in") {
        p_ += 2;
        l = binary("in", l, add());
        l->negate = true;
      } else {
        return l;
      }
    }
  }
  NodePtr add() {
    NodePtr l = concat();
    for (;;) {
      if (accept_op("+"))
        l = binary("+", l, concat());
      else if (accept_op("-"))
        l = binary("-", l, concat());
      else
        return l;
    }
  }
  NodePtr concat() {
    NodePtr l = mul();
    while (accept_op("~")) l = binary("~", l, mul());
    return l;
  }
  NodePtr mul() {
    NodePtr l = unary();
    for (;;) {
      std::string op;
      for (const char* o : {"//", "*", "/", "%"})
        if (accept_op(o)) {
          op = o;
          break;
        }
      if (op.empty()) return l;
      l = binary(op, l, unary());
    }
  }
  NodePtr unary() {
    // Nesting is recursion here: bound it so no template can exhaust the stack.
    struct Depth {
      int& d;
      Depth(int& d, int line) : d(d) {
        if (++d > kMaxDepth) unsupported(line, "expressions nested deeper than 200");
      }
      ~Depth() { --d; }
    } guard(depth_, line_);
    if (accept_op("-")) {
      auto n = node(Node::kUnary, line_, "-");
      n->kids = {unary()};
      return n;
    }
    if (accept_op("+")) return unary();
    return filters(postfix(primary()));
  }
  void call_args(Node& n) {  // after '(' : positional and keyword arguments up to ')'
    while (!accept_op(")")) {
      std::string kw;
      if (t_[p_].kind == Token::kName && t_[p_ + 1].kind == Token::kOp && t_[p_ + 1].text == "=") {
        kw = t_[p_].text;
        p_ += 2;
      }
      n.kids.push_back(expression());
      n.names.push_back(kw);
      if (!accept_op(",")) {
        expect_op(")");
        break;
      }
    }
  }
  NodePtr postfix(NodePtr e) {
    for (;;) {
      if (accept_op(".")) {
        auto n = node(Node::kAttr, line_, expect_name());
        n->kids = {e};
        e = n;
      } else if (accept_op("[")) {
        NodePtr a = peek_op(":") ? nullptr : expression();
        if (accept_op(":")) {
          auto n = node(Node::kSlice, line_);
          NodePtr b = peek_op("]") ? nullptr : expression();
          n->kids = {e, a, b};
          e = n;
        } else {
          auto n = node(Node::kIndex, line_);
          n->kids = {e, a};
          e = n;
        }
        expect_op("]");
      } else if (accept_op("(")) {
        auto n = node(Node::kCall, line_);
        n->kids = {e};
        n->names = {""};
        call_args(*n);
        e = n;
      } else {
        return e;
      }
    }
  }
  NodePtr filters(NodePtr e) {
    for (;;) {
      if (accept_op("|")) {
        auto n = node(Node::kFilter, line_, expect_name());
        n->kids = {e};
        n->names = {""};
        if (accept_op("(")) call_args(*n);
        e = n;
      } else if (accept_name("is")) {
        auto n = node(Node::kTest, line_);
        n->negate = accept_name("not");
        n->name = expect_name();
        n->kids = {e};
        n->names = {""};
        if (accept_op("("))
          call_args(*n);
        else if (!at_end() && t_[p_].kind != Token::kOp && t_[p_].kind != Token::kName)
          n->kids.push_back(primary()), n->names.push_back("");  // `is equalto 'x'`
        e = n;
      } else {
        return e;
      }
    }
  }
  NodePtr primary() {
    const Token tok = t_[p_];
    if (tok.kind == Token::kEnd) unsupported(line_, "expression ends early");
    ++p_;
    auto lit = [&](Value v) {
      auto n = node(Node::kLiteral, line_);
      n->literal = std::move(v);
      return n;
    };
    switch (tok.kind) {
      case Token::kString: {
        std::string s = tok.text;
        while (t_[p_].kind == Token::kString) s += t_[p_++].text;  // 'a' 'b' concatenates
        return lit(s);
      }
      case Token::kInt:
        return lit(static_cast<int64_t>(std::stoll(tok.text)));
      case Token::kFloat:
        return lit(std::stod(tok.text));
      case Token::kName:
        if (tok.text == "true" || tok.text == "True") return lit(true);
        if (tok.text == "false" || tok.text == "False") return lit(false);
        if (tok.text == "none" || tok.text == "None") return lit(None{});
        return node(Node::kVar, line_, tok.text);
      default:
        break;
    }
    if (tok.text == "(") {
      NodePtr e = expression();
      expect_op(")");
      return e;
    }
    if (tok.text == "[") {
      auto n = node(Node::kList, line_);
      while (!accept_op("]")) {
        n->kids.push_back(expression());
        if (!accept_op(",")) {
          expect_op("]");
          break;
        }
      }
      return n;
    }
    if (tok.text == "{") {
      auto n = node(Node::kDict, line_);
      while (!accept_op("}")) {
        n->kids.push_back(expression());
        expect_op(":");
        n->kids.push_back(expression());
        if (!accept_op(",")) {
          expect_op("}");
          break;
        }
      }
      return n;
    }
    unsupported(line_, "unexpected '" + tok.text + "'");
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
  int depth_ = 0;
};

class Parser {
 public:
  explicit Parser(std::vector<Segment> segs) : s_(std::move(segs)) {}

  // Parses statements until one of `stops` (returned in *stop, with its parser) or the end.
  std::vector<NodePtr> block(std::initializer_list<const char*> stops, std::string* stop,
                             std::unique_ptr<ExprParser>* stop_parser) {
    std::vector<NodePtr> out;
    while (i_ < s_.size()) {
      const Segment& seg = s_[i_++];
      if (seg.kind == Segment::kText) {
        out.push_back(node(Node::kText, seg.line, seg.text));
        continue;
      }
      auto ep = std::make_unique<ExprParser>(tokenize(seg.text, seg.line), seg.line);
      if (seg.kind == Segment::kExpr) {
        auto n = node(Node::kOutput, seg.line);
        n->kids = {ep->expression()};
        ep->expect_end();
        out.push_back(n);
        continue;
      }
      const std::string kw = ep->expect_name();
      if (std::find_if(stops.begin(), stops.end(), [&](const char* s) { return kw == s; }) !=
          stops.end()) {
        *stop = kw;
        *stop_parser = std::move(ep);
        return out;
      }
      if (kw == "if")
        out.push_back(parse_if(*ep, seg.line));
      else if (kw == "for")
        out.push_back(parse_for(*ep, seg.line));
      else if (kw == "set")
        out.push_back(parse_set(*ep, seg.line));
      else
        unsupported(seg.line, "the statement '{% " + kw + " %}'");
    }
    if (stops.size())
      unsupported(s_.empty() ? 0 : s_.back().line,
                  std::string("missing '{% ") + *stops.begin() + " %}'");
    return out;
  }

 private:
  NodePtr parse_if(ExprParser& ep, int line) {
    auto n = node(Node::kIf, line);
    n->kids.push_back(ep.expression());
    ep.expect_end();
    for (;;) {
      std::string stop;
      std::unique_ptr<ExprParser> sp;
      n->bodies.push_back(block({"endif", "elif", "else"}, &stop, &sp));
      if (stop == "endif") break;
      if (stop == "elif") {
        n->kids.push_back(sp->expression());
        sp->expect_end();
      } else {
        sp->expect_end();
        n->bodies.push_back(block({"endif"}, &stop, &sp));
        break;
      }
    }
    return n;
  }
  NodePtr parse_for(ExprParser& ep, int line) {
    auto n = node(Node::kFor, line);
    n->names.push_back(ep.expect_name());
    while (ep.accept_op(",")) n->names.push_back(ep.expect_name());
    if (!ep.accept_name("in")) unsupported(line, "expected 'in' in the for loop");
    n->kids = {ep.or_expr(), nullptr};
    if (ep.accept_name("if")) n->kids[1] = ep.or_expr();
    if (ep.accept_name("recursive")) unsupported(line, "recursive loops");
    ep.expect_end();
    std::string stop;
    std::unique_ptr<ExprParser> sp;
    n->bodies.push_back(block({"endfor", "else"}, &stop, &sp));
    if (stop == "else") n->bodies.push_back(block({"endfor"}, &stop, &sp));
    return n;
  }
  NodePtr parse_set(ExprParser& ep, int line) {
    auto n = node(Node::kSet, line);
    n->names.push_back(ep.expect_name());
    if (ep.accept_op(".")) n->names.push_back(ep.expect_name());
    if (!ep.accept_op("=")) unsupported(line, "block {% set %} (only `set x = expr`)");
    n->kids = {ep.expression()};
    ep.expect_end();
    return n;
  }

  std::vector<Segment> s_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

// ---------------------------------------------------------------- values

namespace {

bool is_undefined(const Value& v) {
  return std::holds_alternative<Undefined>(v.v);
}
bool is_none(const Value& v) {
  return std::holds_alternative<None>(v.v);
}
const std::string* as_string(const Value& v) {
  return std::get_if<std::string>(&v.v);
}
const List* as_list(const Value& v) {
  auto p = std::get_if<std::shared_ptr<List>>(&v.v);
  return p ? p->get() : nullptr;
}
Dict* as_dict(const Value& v) {
  auto p = std::get_if<std::shared_ptr<Dict>>(&v.v);
  return p ? p->get() : nullptr;
}
bool is_number(const Value& v) {
  return std::holds_alternative<int64_t>(v.v) || std::holds_alternative<double>(v.v);
}
double as_double(const Value& v) {
  if (auto i = std::get_if<int64_t>(&v.v)) return static_cast<double>(*i);
  if (auto d = std::get_if<double>(&v.v)) return *d;
  if (auto b = std::get_if<bool>(&v.v)) return *b;
  return 0;
}

bool truthy(const Value& v) {
  return std::visit(
      [](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined> || std::is_same_v<T, None>)
          return false;
        else if constexpr (std::is_same_v<T, bool>)
          return x;
        else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>)
          return x != 0;
        else if constexpr (std::is_same_v<T, std::string>)
          return !x.empty();
        else
          return !x->empty();
      },
      v.v);
}

nlohmann::json to_json(const Value& v) {
  if (auto s = as_string(v)) return *s;
  if (auto b = std::get_if<bool>(&v.v)) return *b;
  if (auto i = std::get_if<int64_t>(&v.v)) return *i;
  if (auto d = std::get_if<double>(&v.v)) return *d;
  if (auto l = as_list(v)) {
    auto a = nlohmann::json::array();
    for (const auto& x : *l) a.push_back(to_json(x));
    return a;
  }
  if (auto d = as_dict(v)) {
    auto o = nlohmann::json::object();
    for (const auto& [k, x] : *d) o[k] = to_json(x);
    return o;
  }
  return nullptr;
}

std::string repr(const Value& v);

// str(): what {{ }} prints.
std::string str(const Value& v) {
  if (auto s = as_string(v)) return *s;
  if (is_undefined(v)) return "";
  if (is_none(v)) return "None";
  if (auto b = std::get_if<bool>(&v.v)) return *b ? "True" : "False";
  if (auto i = std::get_if<int64_t>(&v.v)) return std::to_string(*i);
  if (auto d = std::get_if<double>(&v.v)) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.17g", *d);
    std::string s = buf;
    if (s.find_first_of(".en") == std::string::npos) s += ".0";
    return s;
  }
  return repr(v);
}

std::string repr(const Value& v) {
  if (auto s = as_string(v)) {
    std::string out = "'";
    for (char c : *s) out += c == '\'' ? "\\'" : c == '\n' ? "\\n" : std::string(1, c);
    return out + "'";
  }
  if (auto l = as_list(v)) {
    std::string out = "[";
    for (size_t i = 0; i < l->size(); ++i) out += (i ? ", " : "") + repr((*l)[i]);
    return out + "]";
  }
  if (auto d = as_dict(v)) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, x] : *d)
      out += (first ? "" : ", ") + repr(Value(k)) + ": " + repr(x), first = false;
    return out + "}";
  }
  return str(v);
}

bool equal(const Value& a, const Value& b) {
  if (is_number(a) && is_number(b)) return as_double(a) == as_double(b);
  if (auto x = std::get_if<bool>(&a.v)) {
    if (auto y = std::get_if<bool>(&b.v)) return *x == *y;
    if (is_number(b)) return as_double(a) == as_double(b);
    return false;
  }
  if (std::get_if<bool>(&b.v)) return equal(b, a);
  if (a.v.index() != b.v.index()) return false;
  if (auto s = as_string(a)) return *s == *as_string(b);
  if (auto l = as_list(a)) {
    const List* m = as_list(b);
    if (l->size() != m->size()) return false;
    for (size_t i = 0; i < l->size(); ++i)
      if (!equal((*l)[i], (*m)[i])) return false;
    return true;
  }
  if (auto d = as_dict(a)) {
    const Dict* e = as_dict(b);
    if (d->size() != e->size()) return false;
    for (const auto& [k, x] : *d) {
      auto it = e->find(k);
      if (it == e->end() || !equal(x, it->second)) return false;
    }
    return true;
  }
  return true;  // both undefined or both none
}

// The code points of a string, for Python's character indexing.
std::vector<std::string> chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8::valid_length(s, i);
    if (n == 0) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string strip(const std::string& s, bool left, bool right, const std::string* set = nullptr) {
  const auto drop = [&](char c) { return set ? set->find(c) != std::string::npos : is_space(c); };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && drop(s[b])) ++b;
  if (right)
    while (e > b && drop(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t k = 0; (k = s.find(from, k)) != std::string::npos; k += to.size())
    s.replace(k, from.size(), to);
  return s;
}

std::string title(const std::string& s, bool only_first) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c));
    if (alpha) c = start ? static_cast<char>(std::toupper(c)) : static_cast<char>(std::tolower(c));
    start = only_first ? false : !alpha;
  }
  return out;
}

// ---------------------------------------------------------------- renderer

class Renderer {
 public:
  explicit Renderer(const Dict& globals) { scopes_.push_back(globals); }

  void exec(const std::vector<NodePtr>& body) {
    for (const NodePtr& n : body) exec(*n);
  }
  std::string out;

 private:
  void exec(const Node& n) {
    switch (n.kind) {
      case Node::kText:
        out += n.name;
        return;
      case Node::kOutput:
        out += str(eval(*n.kids[0]));
        return;
      case Node::kIf:
        for (size_t b = 0; b < n.bodies.size(); ++b)
          if (b >= n.kids.size() || truthy(eval(*n.kids[b]))) {
            exec(n.bodies[b]);
            return;
          }
        return;
      case Node::kSet: {
        Value v = eval(*n.kids[0]);
        if (n.names.size() == 1) {
          scopes_.back()[n.names[0]] = std::move(v);
        } else {
          Dict* ns = as_dict(lookup(n.names[0]));
          if (!ns) render_error(n.line, "'" + n.names[0] + "' is not a namespace");
          (*ns)[n.names[1]] = std::move(v);
        }
        return;
      }
      case Node::kFor:
        return exec_for(n);
      default:
        render_error(n.line, "internal: not a statement");
    }
  }

  void exec_for(const Node& n) {
    const Value seq = eval(*n.kids[0]);
    List items;
    if (auto l = as_list(seq))
      items = *l;
    else if (auto d = as_dict(seq))
      for (const auto& [k, v] : *d) items.emplace_back(k);
    else if (auto s = as_string(seq))
      for (auto& c : chars(*s)) items.emplace_back(c);
    else if (!is_undefined(seq) && !is_none(seq))
      render_error(n.line, "cannot loop over " + repr(seq));
    // The loop filter applies before `loop` counts, as in Jinja.
    std::vector<Value> kept;
    for (const Value& item : items) {
      if (n.kids[1]) {
        scopes_.push_back({});
        bind(n, item);
        const bool keep = truthy(eval(*n.kids[1]));
        scopes_.pop_back();
        if (!keep) continue;
      }
      kept.push_back(item);
    }
    if (kept.empty()) {
      if (n.bodies.size() > 1) exec(n.bodies[1]);
      return;
    }
    const int64_t len = static_cast<int64_t>(kept.size());
    for (int64_t i = 0; i < len; ++i) {
      scopes_.push_back({});
      bind(n, kept[i]);
      Dict loop{{"index0", Value(i)},         {"index", Value(i + 1)},
                {"revindex", Value(len - i)}, {"revindex0", Value(len - i - 1)},
                {"first", Value(i == 0)},     {"last", Value(i == len - 1)},
                {"length", Value(len)}};
      if (i > 0) loop["previtem"] = kept[i - 1];
      if (i + 1 < len) loop["nextitem"] = kept[i + 1];
      scopes_.back()["loop"] = Value(std::move(loop));
      exec(n.bodies[0]);
      scopes_.pop_back();
    }
  }

  void bind(const Node& n, const Value& item) {
    if (n.names.size() == 1) {
      scopes_.back()[n.names[0]] = item;
      return;
    }
    const List* l = as_list(item);
    if (!l || l->size() != n.names.size()) render_error(n.line, "cannot unpack " + repr(item));
    for (size_t k = 0; k < n.names.size(); ++k) scopes_.back()[n.names[k]] = (*l)[k];
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (auto f = it->find(name); f != it->end()) return f->second;
    return {};
  }

  static Value item(const Value& obj, const Value& key, int line) {
    if (auto d = as_dict(obj)) {
      auto k = as_string(key);
      if (!k) return {};
      auto it = d->find(*k);
      return it == d->end() ? Value() : it->second;
    }
    const bool is_str = as_string(obj) != nullptr;
    if (as_list(obj) || is_str) {
      if (!std::holds_alternative<int64_t>(key.v))
        render_error(line, "index " + repr(key) + " is not an integer");
      std::vector<std::string> cs = is_str ? chars(*as_string(obj)) : std::vector<std::string>();
      const int64_t size =
          is_str ? static_cast<int64_t>(cs.size()) : static_cast<int64_t>(as_list(obj)->size());
      int64_t i = std::get<int64_t>(key.v);
      if (i < 0) i += size;
      if (i < 0 || i >= size)
        render_error(line, "index " + std::to_string(std::get<int64_t>(key.v)) + " out of range");
      return is_str ? Value(cs[i]) : (*as_list(obj))[i];
    }
    if (is_undefined(obj)) render_error(line, "indexing an undefined value with " + repr(key));
    return {};
  }

  Value slice(const Value& obj, const Value& a, const Value& b, int line) {
    const bool is_str = as_string(obj) != nullptr;
    if (!is_str && !as_list(obj)) render_error(line, "cannot slice " + repr(obj));
    std::vector<std::string> cs = is_str ? chars(*as_string(obj)) : std::vector<std::string>();
    const int64_t size =
        is_str ? static_cast<int64_t>(cs.size()) : static_cast<int64_t>(as_list(obj)->size());
    const auto bound = [&](const Value& v, int64_t dflt) {
      if (is_undefined(v) || is_none(v)) return dflt;
      if (!std::holds_alternative<int64_t>(v.v))
        render_error(line, "slice bound is not an integer");
      int64_t x = std::get<int64_t>(v.v);
      if (x < 0) x += size;
      return std::clamp<int64_t>(x, 0, size);
    };
    const int64_t from = bound(a, 0), to = std::max(from, bound(b, size));
    if (is_str) {
      std::string s;
      for (int64_t i = from; i < to; ++i) s += cs[i];
      return s;
    }
    return List(as_list(obj)->begin() + from, as_list(obj)->begin() + to);
  }

  std::vector<Value> args(const Node& n, size_t first) {
    std::vector<Value> out;
    for (size_t k = first; k < n.kids.size(); ++k) out.push_back(eval(*n.kids[k]));
    return out;
  }

  Value eval(const Node& n) {
    switch (n.kind) {
      case Node::kLiteral:
        return n.literal;
      case Node::kVar:
        return lookup(n.name);
      case Node::kAttr: {
        const Value obj = eval(*n.kids[0]);
        if (is_undefined(obj)) render_error(n.line, "'." + n.name + "' of an undefined value");
        return item(obj, Value(n.name), n.line);
      }
      case Node::kIndex:
        return item(eval(*n.kids[0]), eval(*n.kids[1]), n.line);
      case Node::kSlice:
        return slice(eval(*n.kids[0]), n.kids[1] ? eval(*n.kids[1]) : Value(),
                     n.kids[2] ? eval(*n.kids[2]) : Value(), n.line);
      case Node::kList:
        return List(args(n, 0));
      case Node::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < n.kids.size(); k += 2)
          d[str(eval(*n.kids[k]))] = eval(*n.kids[k + 1]);
        return d;
      }
      case Node::kCond:
        if (truthy(eval(*n.kids[1]))) return eval(*n.kids[0]);
        return n.kids[2] ? eval(*n.kids[2]) : Value();
      case Node::kUnary: {
        const Value v = eval(*n.kids[0]);
        if (n.name == "not") return !truthy(v);
        if (auto i = std::get_if<int64_t>(&v.v)) return -*i;
        if (is_number(v)) return -as_double(v);
        render_error(n.line, "unary minus of " + repr(v));
      }
      case Node::kBinary:
        return binary(n);
      case Node::kCall:
        return call(n);
      case Node::kFilter:
        return filter(n);
      case Node::kTest:
        return test(n);
      default:
        render_error(n.line, "internal: not an expression");
    }
  }

  Value binary(const Node& n) {
    if (n.name == "and") {
      Value l = eval(*n.kids[0]);
      return truthy(l) ? eval(*n.kids[1]) : l;
    }
    if (n.name == "or") {
      Value l = eval(*n.kids[0]);
      return truthy(l) ? l : eval(*n.kids[1]);
    }
    const Value a = eval(*n.kids[0]), b = eval(*n.kids[1]);
    const std::string& op = n.name;
    if (op == "==") return equal(a, b);
    if (op == "!=") return !equal(a, b);
    if (op == "~") return str(a) + str(b);
    if (op == "in") {
      bool found = false;
      if (auto s = as_string(b)) {
        if (!as_string(a)) render_error(n.line, "'in <string>' needs a string on the left");
        found = s->find(*as_string(a)) != std::string::npos;
      } else if (auto l = as_list(b)) {
        found = std::any_of(l->begin(), l->end(), [&](const Value& x) { return equal(x, a); });
      } else if (auto d = as_dict(b)) {
        found = as_string(a) && d->count(*as_string(a));
      } else if (!is_undefined(b) && !is_none(b)) {
        render_error(n.line, "'in' of " + repr(b));
      }
      return found != n.negate;
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c;
      if (is_number(a) && is_number(b))
        c = as_double(a) < as_double(b) ? -1 : as_double(a) > as_double(b);
      else if (as_string(a) && as_string(b))
        c = as_string(a)->compare(*as_string(b));
      else
        render_error(n.line, "cannot compare " + repr(a) + " and " + repr(b));
      return op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
    }
    if (op == "+") {
      if (as_string(a) && as_string(b)) return *as_string(a) + *as_string(b);
      if (as_list(a) && as_list(b)) {
        List l = *as_list(a);
        l.insert(l.end(), as_list(b)->begin(), as_list(b)->end());
        return l;
      }
    }
    if (op == "*" && as_string(a) && std::holds_alternative<int64_t>(b.v)) {
      std::string s;
      for (int64_t k = 0; k < std::min<int64_t>(std::get<int64_t>(b.v), 1 << 20); ++k)
        s += *as_string(a);
      return s;
    }
    if (!is_number(a) || !is_number(b) || std::holds_alternative<bool>(a.v) ||
        std::holds_alternative<bool>(b.v))
      render_error(n.line, "'" + op + "' of " + repr(a) + " and " + repr(b));
    const bool ints = std::holds_alternative<int64_t>(a.v) && std::holds_alternative<int64_t>(b.v);
    if (ints && op != "/") {
      const int64_t x = std::get<int64_t>(a.v), y = std::get<int64_t>(b.v);
      if (op == "+") return x + y;
      if (op == "-") return x - y;
      if (op == "*") return x * y;
      if (y == 0) render_error(n.line, "division by zero");
      const int64_t q = x / y - ((x % y != 0) && ((x < 0) != (y < 0)));  // Python floors
      return op == "//" ? q : x - q * y;
    }
    const double x = as_double(a), y = as_double(b);
    if (op == "+") return x + y;
    if (op == "-") return x - y;
    if (op == "*") return x * y;
    if (y == 0) render_error(n.line, "division by zero");
    if (op == "/") return x / y;
    if (op == "//") return std::floor(x / y);
    return x - std::floor(x / y) * y;
  }

  Value call(const Node& n) {
    const Node& callee = *n.kids[0];
    std::vector<Value> a = args(n, 1);
    if (callee.kind == Node::kAttr) {  // a method of a string or a dict
      const Value obj = eval(*callee.kids[0]);
      const std::string& m = callee.name;
      if (auto s = as_string(obj)) {
        const std::string* arg0 = a.empty() ? nullptr : as_string(a[0]);
        if (m == "strip") return strip(*s, true, true, arg0);
        if (m == "lstrip") return strip(*s, true, false, arg0);
        if (m == "rstrip") return strip(*s, false, true, arg0);
        if (m == "upper" || m == "lower") {
          std::string r = *s;
          for (char& c : r) c = static_cast<char>(m == "upper" ? std::toupper(c) : std::tolower(c));
          return r;
        }
        if (m == "title") return title(*s, false);
        if ((m == "startswith" || m == "endswith") && arg0) {
          if (arg0->size() > s->size()) return false;
          return m == "startswith" ? s->compare(0, arg0->size(), *arg0) == 0
                                   : s->compare(s->size() - arg0->size(), arg0->size(), *arg0) == 0;
        }
        if (m == "replace" && a.size() == 2 && arg0 && as_string(a[1]))
          return replace_all(*s, *arg0, *as_string(a[1]));
        if (m == "split") {
          List parts;
          if (arg0 && !arg0->empty()) {
            size_t i = 0;
            for (size_t k; (k = s->find(*arg0, i)) != std::string::npos; i = k + arg0->size())
              parts.emplace_back(s->substr(i, k - i));
            parts.emplace_back(s->substr(i));
          } else {
            std::string cur;
            for (char c : *s + " ")
              if (is_space(c)) {
                if (!cur.empty()) parts.emplace_back(cur), cur.clear();
              } else {
                cur += c;
              }
          }
          return parts;
        }
      }
      if (auto d = as_dict(obj)) {
        if (m == "items") {
          List l;
          for (const auto& [k, v] : *d) l.emplace_back(List{Value(k), v});
          return l;
        }
        if (m == "keys" || m == "values") {
          List l;
          for (const auto& [k, v] : *d) l.push_back(m == "keys" ? Value(k) : v);
          return l;
        }
        if (m == "get" && !a.empty()) {
          Value v = item(obj, a[0], n.line);
          return is_undefined(v) && a.size() > 1 ? a[1] : is_undefined(v) ? Value(None{}) : v;
        }
      }
      unsupported(n.line, "the method '." + m + "()' of " + repr(obj).substr(0, 40));
    }
    if (callee.kind == Node::kVar) {
      if (callee.name == "raise_exception")
        throw Error(ErrorKind::kInvalidArgument, "messages",
                    a.empty() ? "rejected by the chat template" : str(a[0]));
      if (callee.name == "namespace") {
        Dict d;
        for (size_t k = 1; k < n.names.size(); ++k)
          if (!n.names[k].empty()) d[n.names[k]] = a[k - 1];
        return d;
      }
      if (callee.name == "range") {
        int64_t from = 0, to = 0;
        if (a.size() == 1)
          to = static_cast<int64_t>(as_double(a[0]));
        else if (a.size() >= 2)
          from = static_cast<int64_t>(as_double(a[0])), to = static_cast<int64_t>(as_double(a[1]));
        List l;
        for (int64_t i = from; i < std::min<int64_t>(to, from + (1 << 20)); ++i) l.emplace_back(i);
        return l;
      }
      unsupported(n.line, "the function '" + callee.name + "()'");
    }
    unsupported(n.line, "calling an expression");
  }

  // selectattr / rejectattr / map(attribute=...) over a list of dicts.
  Value attr_filter(const Node& n, const Value& v, const std::vector<Value>& a) {
    const List* l = as_list(v);
    if (!l) return List{};
    List out;
    if (n.name == "map") {
      for (size_t k = 1; k < n.names.size(); ++k)
        if (n.names[k] == "attribute") {
          for (const Value& x : *l) out.push_back(item(x, a[k - 1], n.line));
          return out;
        }
      unsupported(n.line, "map() without attribute=");
    }
    if (a.empty() || !as_string(a[0])) unsupported(n.line, n.name + "() without an attribute name");
    for (const Value& x : *l) {
      const Value field = item(x, a[0], n.line);
      bool pass;
      if (a.size() == 1)
        pass = truthy(field);
      else {
        const std::string test = str(a[1]);
        if (test == "equalto" || test == "eq" || test == "==")
          pass = a.size() > 2 && equal(field, a[2]);
        else if (test == "defined")
          pass = !is_undefined(field);
        else if (test == "undefined")
          pass = is_undefined(field);
        else if (test == "none")
          pass = is_none(field);
        else
          unsupported(n.line, "the test '" + test + "' in " + n.name + "()");
      }
      if (pass == (n.name == "selectattr")) out.push_back(x);
    }
    return out;
  }

  Value filter(const Node& n) {
    const Value v = eval(*n.kids[0]);
    const std::vector<Value> a = args(n, 1);
    const std::string& f = n.name;
    const std::string* s = as_string(v);
    if (f == "trim") return strip(str(v), true, true);
    if (f == "length" || f == "count") {
      if (s) return static_cast<int64_t>(chars(*s).size());
      if (auto l = as_list(v)) return static_cast<int64_t>(l->size());
      if (auto d = as_dict(v)) return static_cast<int64_t>(d->size());
      return int64_t{0};
    }
    if (f == "upper" || f == "lower") {
      std::string r = str(v);
      for (char& c : r) c = static_cast<char>(f == "upper" ? std::toupper(c) : std::tolower(c));
      return r;
    }
    if (f == "capitalize") return title(str(v), true);
    if (f == "title") return title(str(v), false);
    if (f == "string") return str(v);
    if (f == "safe") return v;  // no autoescaping here, so nothing to mark
    if (f == "int") {
      if (s) {
        try {
          return static_cast<int64_t>(std::stoll(*s));
        } catch (...) {
          return int64_t{0};
        }
      }
      return static_cast<int64_t>(as_double(v));
    }
    if (f == "float") return s ? std::strtod(s->c_str(), nullptr) : as_double(v);
    if (f == "abs")
      return std::holds_alternative<int64_t>(v.v) ? Value(std::abs(std::get<int64_t>(v.v)))
                                                  : Value(std::fabs(as_double(v)));
    if (f == "first" || f == "last") {
      if (auto l = as_list(v)) return l->empty() ? Value() : f == "first" ? l->front() : l->back();
      if (s) {
        auto cs = chars(*s);
        return cs.empty() ? Value() : Value(f == "first" ? cs.front() : cs.back());
      }
      return {};
    }
    if (f == "join") {
      const std::string sep = a.empty() ? "" : str(a[0]);
      std::string r;
      if (auto l = as_list(v))
        for (size_t k = 0; k < l->size(); ++k) r += (k ? sep : "") + str((*l)[k]);
      return r;
    }
    if (f == "default" || f == "d") {
      const bool boolean = a.size() > 1 && truthy(a[1]);
      if (is_undefined(v) || (boolean && !truthy(v))) return a.empty() ? Value("") : a[0];
      return v;
    }
    if (f == "replace" && a.size() >= 2) return replace_all(str(v), str(a[0]), str(a[1]));
    if (f == "list") {
      if (as_list(v)) return v;
      List l;
      if (s)
        for (auto& c : chars(*s)) l.emplace_back(c);
      if (auto d = as_dict(v))
        for (const auto& [k, x] : *d) l.emplace_back(k);
      return l;
    }
    if (f == "reverse") {
      if (auto l = as_list(v)) return List(l->rbegin(), l->rend());
      if (s) {
        auto cs = chars(*s);
        std::string r;
        for (auto it = cs.rbegin(); it != cs.rend(); ++it) r += *it;
        return r;
      }
      return v;
    }
    if (f == "items") {
      List l;
      if (auto d = as_dict(v))
        for (const auto& [k, x] : *d) l.emplace_back(List{Value(k), x});
      return l;
    }
    if (f == "tojson") {
      int indent = -1;
      for (size_t k = 1; k < n.names.size(); ++k)
        if (n.names[k] == "indent" || n.names[k].empty())
          indent = static_cast<int>(as_double(a[k - 1]));
      // Python's json.dumps separators: ", " and ": " on one line.
      const nlohmann::json j = to_json(v);
      if (indent >= 0) return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
      std::string r;
      const std::function<void(const nlohmann::json&)> dump = [&](const nlohmann::json& x) {
        if (x.is_array()) {
          r += '[';
          for (size_t k = 0; k < x.size(); ++k) r += k ? ", " : "", dump(x[k]);
          r += ']';
        } else if (x.is_object()) {
          r += '{';
          bool first = true;
          for (const auto& [k, y] : x.items()) {
            r += first ? "" : ", ";
            first = false;
            r += nlohmann::json(k).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                 ": ";
            dump(y);
          }
          r += '}';
        } else {
          r += x.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        }
      };
      dump(j);
      return r;
    }
    if (f == "selectattr" || f == "rejectattr" || f == "map") return attr_filter(n, v, a);
    unsupported(n.line, "the filter '|" + f + "'");
  }

  Value test(const Node& n) {
    const Value v = eval(*n.kids[0]);
    const std::vector<Value> a = args(n, 1);
    const std::string& t = n.name;
    bool r;
    if (t == "defined")
      r = !is_undefined(v);
    else if (t == "undefined")
      r = is_undefined(v);
    else if (t == "none")
      r = is_none(v);
    else if (t == "string")
      r = as_string(v) != nullptr;
    else if (t == "number")
      r = is_number(v);
    else if (t == "integer")
      r = std::holds_alternative<int64_t>(v.v);
    else if (t == "boolean")
      r = std::holds_alternative<bool>(v.v);
    else if (t == "mapping")
      r = as_dict(v) != nullptr;
    else if (t == "sequence" || t == "iterable")
      r = as_list(v) || as_string(v) || (t == "iterable" && as_dict(v));
    else if (t == "true")
      r = std::holds_alternative<bool>(v.v) && std::get<bool>(v.v);
    else if (t == "false")
      r = std::holds_alternative<bool>(v.v) && !std::get<bool>(v.v);
    else if (t == "odd" || t == "even")
      r = std::holds_alternative<int64_t>(v.v) && (std::get<int64_t>(v.v) % 2 != 0) == (t == "odd");
    else if (t == "equalto" || t == "eq" || t == "sameas")
      r = !a.empty() && equal(v, a[0]);
    else
      unsupported(n.line, "the test 'is " + t + "'");
    return r != n.negate;
  }

  std::vector<Dict> scopes_;
};

}  // namespace

Template::Template(const std::string& source) {
  Parser p(segment(source));
  auto root = node(Node::kBlock, 1);
  std::string stop;
  std::unique_ptr<ExprParser> sp;
  root->bodies.push_back(p.block({}, &stop, &sp));
  root_ = root;
}

Template::~Template() = default;

std::string Template::render(const Dict& globals) const {
  Renderer r(globals);
  r.exec(root_->bodies[0]);
  return std::move(r.out);
}

}  // namespace flashserve::tokenizer::jinja
