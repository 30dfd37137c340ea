#include "tokenizer/jinja.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include <fmt/format.h>

#include "tokenizer/utf8.h"

namespace tf::tok::jinja {
namespace {

[[noreturn]] void fail(int line, const std::string& msg) {
  throw TemplateError(line > 0 ? fmt::format("line {}: {}", line, msg) : msg);
}

// =============================================================================================
// Lexer: template text -> data / tag tokens, with Jinja2's whitespace rules.

enum class T {
  kData,        // text outside tags
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  T type;
  std::string text;  // data, name, decoded string, number text or operator
  int line;
};

bool is_name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// Python str.rstrip() / lstrip() without arguments.
std::string_view rstrip_ws(std::string_view s) {
  while (!s.empty()) {
    size_t k = s.size() - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    size_t kk = k;
    if (!py_isspace(utf8_next(s, kk))) break;
    s = s.substr(0, k);
  }
  return s;
}
size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size()) {
    size_t k = i;
    if (!py_isspace(utf8_next(s, k))) break;
    i = k;
  }
  return i;
}

// Python's "unicode-escape" decoding of a string literal body, as Jinja2 applies it.
std::string unescape(std::string_view s, int line) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out += s[i];
      continue;
    }
    const char e = s[++i];
    auto hex = [&](int n) -> char32_t {
      char32_t v = 0;
      for (int k = 1; k <= n; ++k) {
        if (i + k >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i + k])))
          fail(line, "truncated \\x/\\u escape in a string literal");
        const char c = s[i + k];
        v = v * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(c))
                                               ? c - '0'
                                               : (std::tolower(c) - 'a' + 10));
      }
      i += n;
      return v;
    };
    switch (e) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
        utf8_append(out, hex(2));
        break;
      case 'u':
      case 'U': {
        const char32_t cp = hex(e == 'u' ? 4 : 8);
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
          fail(line, "string literal escape is not a valid character");
        utf8_append(out, cp);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          int v = e - '0', n = 1;
          while (n < 3 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7')
            v = v * 8 + (s[++i] - '0'), ++n;
          utf8_append(out, static_cast<char32_t>(v));
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Token> run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      const size_t open = find_tag(pos);
      std::string_view text(src_.data() + pos,
                            (open == std::string::npos ? src_.size() : open) - pos);
      if (open == std::string::npos) {
        emit_data(text, pos);
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const char ctl = open + 2 < src_.size() ? src_[open + 2] : '\0';
      // Whitespace before the tag: '-' strips all of it; otherwise lstrip_blocks strips spaces
      // and tabs between the line start and a block or comment tag ('+' disables that).
      if (ctl == '-') {
        text = rstrip_ws(text);
      } else if (ctl != '+' && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        const bool line_starting = pos == 0 || src_[pos - 1] == '\n';
        if (l_pos > 0 || line_starting) {
          std::string_view tail = text.substr(l_pos);
          if (!tail.empty() && skip_ws(tail, 0) == tail.size()) text = text.substr(0, l_pos);
        }
      }
      emit_data(text, pos);
      size_t i = open + 2 + ((ctl == '-' || ctl == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t close = src_.find("#}", i);
        if (close == std::string::npos) fail(line_at(open), "unclosed comment");
        pos = after_tag_end(close, close + 2, /*block=*/true);
        continue;
      }
      tokens_.push_back({kind == '{' ? T::kVarBegin : T::kBlockBegin, "", line_at(open)});
      pos = lex_tag(i, kind == '{' ? '}' : '%');
    }
    tokens_.push_back({T::kEof, "", line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }
  int line_at(size_t pos) const {
    return 1 + static_cast<int>(std::count(src_.begin(), src_.begin() + pos, '\n'));
  }
  void emit_data(std::string_view text, size_t pos) {
    if (!text.empty()) tokens_.push_back({T::kData, std::string(text), line_at(pos)});
  }
  // `close` is where the end marker ("%}", "}}", "#}") starts and `end` just after it. A '-'
  // before the marker strips all whitespace after the tag; trim_blocks removes one newline after
  // block and comment tags ('+' disables that).
  size_t after_tag_end(size_t close, size_t end, bool block) const {
    const char before = close > 0 ? src_[close - 1] : '\0';
    if (before == '-') return skip_ws(src_, end);
    if (block && before != '+' && end < src_.size() && src_[end] == '\n') return end + 1;
    return end;
  }

  size_t lex_tag(size_t i, char closer) {
    const int line = line_at(i);
    for (;;) {
      i = skip_ws(src_, i);
      if (i >= src_.size()) fail(line, "unclosed tag");
      // End marker, optionally preceded by '-' or '+'.
      size_t m = i;
      if ((src_[m] == '-' || src_[m] == '+') && m + 2 < src_.size() + 1 && m + 1 < src_.size() &&
          src_[m + 1] == closer && m + 2 < src_.size() && src_[m + 2] == '}')
        ++m;
      if (src_[m] == closer && m + 1 < src_.size() && src_[m + 1] == '}') {
        tokens_.push_back({closer == '}' ? T::kVarEnd : T::kBlockEnd, "", line});
        return after_tag_end(m, m + 2, closer == '%');
      }
      const char c = src_[i];
      if (c == '\'' || c == '"') {
        size_t k = i + 1;
        while (k < src_.size() && src_[k] != c) k += src_[k] == '\\' ? 2 : 1;
        if (k >= src_.size()) fail(line, "unterminated string literal");
        tokens_.push_back(
            {T::kString, unescape(std::string_view(src_).substr(i + 1, k - i - 1), line), line});
        i = k + 1;
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t k = i;
        auto digits = [&] {
          while (k < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[k])) ||
                                     (src_[k] == '_' && k + 1 < src_.size() &&
                                      std::isdigit(static_cast<unsigned char>(src_[k + 1])))))
            ++k;
        };
        digits();
        bool is_float = false;
        if (k + 1 < src_.size() && src_[k] == '.' &&
            std::isdigit(static_cast<unsigned char>(src_[k + 1]))) {
          ++k, digits(), is_float = true;
        }
        if (k < src_.size() && (src_[k] == 'e' || src_[k] == 'E')) {
          size_t e = k + 1;
          if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
          if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e])))
            k = e, digits(), is_float = true;
        }
        std::string num = src_.substr(i, k - i);
        num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
        tokens_.push_back({is_float ? T::kFloat : T::kInt, num, line});
        i = k;
        continue;
      }
      if (is_name_start(c)) {
        size_t k = i;
        while (k < src_.size() && is_name_char(src_[k])) ++k;
        tokens_.push_back({T::kName, src_.substr(i, k - i), line});
        i = k;
        continue;
      }
      static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/",
                                   "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                   "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};
      bool matched = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (src_.compare(i, n, op) == 0) {
          tokens_.push_back({T::kOp, op, line});
          i += n;
          matched = true;
          break;
        }
      }
      if (!matched) fail(line, fmt::format("unexpected character '{}' in a tag", c));
    }
  }

  std::string src_;
  std::vector<Token> tokens_;
};

// =============================================================================================
// AST

struct Expr;
using ExprP = std::unique_ptr<Expr>;
struct Expr {
  enum class K {
    kConst,
    kName,
    kList,    // args
    kTuple,   // args
    kDict,    // args: k0, v0, k1, v1, ...
    kAttr,    // a.name
    kItem,    // a[b]
    kSlice,   // a[b:c:d] (null parts)
    kCall,    // a(args, kwargs)
    kFilter,  // name, a = input (may be null in filter blocks), args, kwargs
    kTest,    // a is [not] name(args)
    kNeg,
    kPos,
    kNot,
    kBinary,  // name = operator
    kAnd,
    kOr,
    kCompare,  // a, then ops[i] with args[i]
    kCond,     // b if a else c
  };
  K k;
  int line = 0;
  Value value;
  std::string name;
  ExprP a, b, c;
  std::vector<ExprP> args;
  std::vector<std::pair<std::string, ExprP>> kwargs;
  std::vector<std::string> ops;
  bool negate = false;
};

struct Node;
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;
struct Node {
  enum class K { kData, kOutput, kIf, kFor, kSet, kSetBlock, kBreak, kContinue, kScope };
  K k;
  int line = 0;
  std::string data;
  ExprP expr;                                    // output / set value / for iterable
  std::vector<std::pair<ExprP, Body>> branches;  // if/elif (+ else with null condition)
  std::vector<std::string> targets;              // for / set names
  ExprP target_attr;                             // set ns.attr: the object expression
  std::string attr;
  ExprP filter;  // for ... if filter
  Body body, else_body;
};

// =============================================================================================
// Parser

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_template() {
    Body body = parse_body({});
    if (cur().type != T::kEof) fail(cur().line, "unexpected tag");
    return body;
  }

 private:
  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == T::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == T::kName && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(cur().line, fmt::format("expected '{}'", op));
    ++p_;
  }
  std::string expect_name() {
    if (cur().type != T::kName) fail(cur().line, "expected a name");
    return t_[p_++].text;
  }
  void expect_block_end() {
    if (cur().type != T::kBlockEnd) fail(cur().line, "expected end of tag '%}'");
    ++p_;
  }

  // Parses nodes until a block tag whose keyword is in `stops` (left unconsumed, at its name).
  Body parse_body(std::initializer_list<const char*> stops) {
    Body body;
    for (;;) {
      const Token& tk = cur();
      if (tk.type == T::kEof) {
        if (stops.size()) fail(tk.line, fmt::format("missing end tag ({})", *stops.begin()));
        return body;
      }
      if (tk.type == T::kData) {
        auto n = std::make_unique<Node>();
        n->k = Node::K::kData;
        n->data = tk.text;
        body.push_back(std::move(n));
        ++p_;
        continue;
      }
      if (tk.type == T::kVarBegin) {
        ++p_;
        auto n = std::make_unique<Node>();
        n->k = Node::K::kOutput;
        n->line = tk.line;
        n->expr = parse_tuple_or_expr();
        if (cur().type != T::kVarEnd) fail(cur().line, "expected end of expression '}}'");
        ++p_;
        body.push_back(std::move(n));
        continue;
      }
      if (tk.type != T::kBlockBegin) fail(tk.line, "unexpected token");
      const Token& kw = peek();
      if (kw.type != T::kName) fail(kw.line, "expected a tag name after '{%'");
      for (const char* s : stops)
        if (kw.text == s) {
          ++p_;  // at the keyword
          return body;
        }
      p_ += 2;
      body.push_back(parse_statement(kw.text, kw.line));
    }
  }

  NodeP parse_statement(const std::string& kw, int line) {
    auto n = std::make_unique<Node>();
    n->line = line;
    if (kw == "if") {
      n->k = Node::K::kIf;
      ExprP cond = parse_expr();
      expect_block_end();
      for (;;) {
        Body b = parse_body({"elif", "else", "endif"});
        n->branches.emplace_back(std::move(cond), std::move(b));
        const std::string which = t_[p_++].text;
        if (which == "endif") {
          expect_block_end();
          break;
        }
        if (which == "else") {
          expect_block_end();
          Body e = parse_body({"endif"});
          ++p_;
          expect_block_end();
          n->branches.emplace_back(nullptr, std::move(e));
          break;
        }
        cond = parse_expr();
        expect_block_end();
      }
      return n;
    }
    if (kw == "for") {
      n->k = Node::K::kFor;
      n->targets.push_back(expect_name());
      while (is_op(",")) ++p_, n->targets.push_back(expect_name());
      if (!is_name("in")) fail(cur().line, "expected 'in' in for loop");
      ++p_;
      n->expr = parse_expr(/*allow_cond=*/false);
      if (is_name("if")) ++p_, n->filter = parse_expr();
      if (is_name("recursive")) fail(cur().line, "recursive loops are not supported");
      expect_block_end();
      n->body = parse_body({"else", "endfor"});
      if (t_[p_++].text == "else") {
        expect_block_end();
        n->else_body = parse_body({"endfor"});
        ++p_;
      }
      expect_block_end();
      return n;
    }
    if (kw == "set") {
      const std::string first = expect_name();
      if (is_op(".")) {
        ++p_;
        auto obj = std::make_unique<Expr>();
        obj->k = Expr::K::kName;
        obj->name = first;
        obj->line = line;
        n->target_attr = std::move(obj);
        n->attr = expect_name();
      } else {
        n->targets.push_back(first);
        while (is_op(",")) ++p_, n->targets.push_back(expect_name());
      }
      if (is_op("=")) {
        ++p_;
        n->k = Node::K::kSet;
        n->expr = parse_tuple_or_expr();
        expect_block_end();
        return n;
      }
      if (n->targets.size() != 1) fail(line, "a set block needs one name");
      n->k = Node::K::kSetBlock;
      expect_block_end();
      n->body = parse_body({"endset"});
      ++p_;
      expect_block_end();
      return n;
    }
    if (kw == "break" || kw == "continue") {
      n->k = kw == "break" ? Node::K::kBreak : Node::K::kContinue;
      expect_block_end();
      return n;
    }
    if (kw == "generation") {  // transformers' AssistantTracker: renders its body unchanged
      n->k = Node::K::kScope;
      expect_block_end();
      n->body = parse_body({"endgeneration"});
      ++p_;
      expect_block_end();
      return n;
    }
    fail(line, fmt::format("unsupported tag '{}'", kw));
  }

  ExprP make(Expr::K k, int line) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = line;
    return e;
  }

  ExprP parse_tuple_or_expr() {
    const int line = cur().line;
    ExprP e = parse_expr();
    if (!is_op(",")) return e;
    ExprP t = make(Expr::K::kTuple, line);
    t->args.push_back(std::move(e));
    while (is_op(",")) {
      ++p_;
      if (cur().type == T::kVarEnd || cur().type == T::kBlockEnd) break;
      t->args.push_back(parse_expr());
    }
    return t;
  }

  ExprP parse_expr(bool allow_cond = true) {
    ExprP e = parse_or();
    while (allow_cond && is_name("if")) {
      const int line = cur().line;
      ++p_;
      ExprP cond = make(Expr::K::kCond, line);
      cond->a = parse_or();
      cond->b = std::move(e);
      if (is_name("else")) ++p_, cond->c = parse_expr();
      e = std::move(cond);
    }
    return e;
  }
  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      ExprP n = make(Expr::K::kOr, t_[p_++].line);
      n->a = std::move(e);
      n->b = parse_and();
      e = std::move(n);
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      ExprP n = make(Expr::K::kAnd, t_[p_++].line);
      n->a = std::move(e);
      n->b = parse_not();
      e = std::move(n);
    }
    return e;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      ExprP n = make(Expr::K::kNot, t_[p_++].line);
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    const int line = cur().line;
    ExprP e = parse_math1();
    ExprP cmp;
    for (;;) {
      std::string op;
      if (cur().type == T::kOp &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
        op = t_[p_++].text;
      } else if (is_name("in")) {
        ++p_, op = "in";
      } else if (is_name("not") && peek().type == T::kName && peek().text == "in") {
        p_ += 2, op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::K::kCompare, line);
        cmp->a = std::move(e);
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }
  ExprP binary(const std::string& op, ExprP l, ExprP r, int line) {
    ExprP n = make(Expr::K::kBinary, line);
    n->name = op;
    n->a = std::move(l);
    n->b = std::move(r);
    return n;
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& tk = t_[p_++];
      e = binary(tk.text, std::move(e), parse_concat(), tk.line);
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (is_op("~")) {
      const Token& tk = t_[p_++];
      e = binary("~", std::move(e), parse_math2(), tk.line);
    }
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& tk = t_[p_++];
      e = binary(tk.text, std::move(e), parse_pow(), tk.line);
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary(true);
    while (is_op("**")) {
      const Token& tk = t_[p_++];
      e = binary("**", std::move(e), parse_unary(true), tk.line);
    }
    return e;
  }
  ExprP parse_unary(bool with_filter) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      const Token& tk = t_[p_++];
      e = make(tk.text == "-" ? Expr::K::kNeg : Expr::K::kPos, tk.line);
      e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }
  ExprP parse_primary() {
    const Token& tk = cur();
    switch (tk.type) {
      case T::kName: {
        ++p_;
        const std::string& n = tk.text;
        if (n == "true" || n == "True") return constant(Value::boolean(true), tk.line);
        if (n == "false" || n == "False") return constant(Value::boolean(false), tk.line);
        if (n == "none" || n == "None") return constant(Value::none(), tk.line);
        ExprP e = make(Expr::K::kName, tk.line);
        e->name = n;
        return e;
      }
      case T::kString: {
        std::string s;
        while (cur().type == T::kString) s += t_[p_++].text;  // adjacent literals concatenate
        return constant(Value::string(std::move(s)), tk.line);
      }
      case T::kInt: {
        ++p_;
        __int128 v = 0;
        for (char c : tk.text) {
          v = v * 10 + (c - '0');
          if (v > (static_cast<__int128>(1) << 100)) fail(tk.line, "integer literal too large");
        }
        return constant(Value::integer(v), tk.line);
      }
      case T::kFloat:
        ++p_;
        return constant(Value::number(std::strtod(tk.text.c_str(), nullptr)), tk.line);
      case T::kOp:
        if (tk.text == "(") {
          ++p_;
          if (is_op(")")) {
            ++p_;
            return make(Expr::K::kTuple, tk.line);
          }
          ExprP e = parse_expr();
          if (is_op(",")) {
            ExprP t = make(Expr::K::kTuple, tk.line);
            t->args.push_back(std::move(e));
            while (is_op(",")) {
              ++p_;
              if (is_op(")")) break;
              t->args.push_back(parse_expr());
            }
            e = std::move(t);
          }
          expect_op(")");
          return e;
        }
        if (tk.text == "[") {
          ++p_;
          ExprP e = make(Expr::K::kList, tk.line);
          while (!is_op("]")) {
            e->args.push_back(parse_expr());
            if (!is_op(",")) break;
            ++p_;
          }
          expect_op("]");
          return e;
        }
        if (tk.text == "{") {
          ++p_;
          ExprP e = make(Expr::K::kDict, tk.line);
          while (!is_op("}")) {
            e->args.push_back(parse_expr());
            expect_op(":");
            e->args.push_back(parse_expr());
            if (!is_op(",")) break;
            ++p_;
          }
          expect_op("}");
          return e;
        }
        break;
      default:
        break;
    }
    fail(tk.line, tk.type == T::kOp ? fmt::format("unexpected '{}'", tk.text)
                                    : std::string("unexpected end of expression"));
  }
  ExprP constant(Value v, int line) {
    ExprP e = make(Expr::K::kConst, line);
    e->value = std::move(v);
    return e;
  }
  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().type == T::kName && peek().type == T::kOp && peek().text == "=") {
        std::string key = t_[p_].text;
        p_ += 2;
        call.kwargs.emplace_back(std::move(key), parse_expr());
      } else {
        if (!call.kwargs.empty()) fail(cur().line, "positional argument after keyword argument");
        call.args.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op(")");
  }
  ExprP parse_postfix(ExprP e) {
    for (;;) {
      const int line = cur().line;
      if (is_op(".")) {
        ++p_;
        ExprP n = make(Expr::K::kAttr, line);
        if (cur().type == T::kInt) {  // x.0 is x[0] in Jinja
          n->k = Expr::K::kItem;
          n->b = constant(Value::integer(std::stoll(t_[p_++].text)), line);
        } else {
          n->name = expect_name();
        }
        n->a = std::move(e);
        e = std::move(n);
      } else if (is_op("[")) {
        ++p_;
        ExprP parts[3];
        int n_colons = 0;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = parse_expr();
          if (k < 2 && is_op(":")) {
            ++p_, ++n_colons;
          } else {
            break;
          }
        }
        expect_op("]");
        ExprP n = make(n_colons ? Expr::K::kSlice : Expr::K::kItem, line);
        n->a = std::move(e);
        if (!n_colons && !parts[0]) fail(line, "empty subscript");
        n->b = std::move(parts[0]);
        if (n_colons) {
          n->c = std::move(parts[1]);
          n->args.push_back(std::move(parts[2]));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        ExprP n = make(Expr::K::kCall, line);
        n->a = std::move(e);
        parse_call_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }
  ExprP parse_filter_expr(ExprP e) {
    for (;;) {
      const int line = cur().line;
      if (is_op("|")) {
        ++p_;
        ExprP f = make(Expr::K::kFilter, line);
        f->name = expect_name();
        while (is_op(".")) ++p_, f->name += "." + expect_name();
        if (is_op("(")) parse_call_args(*f);
        f->a = std::move(e);
        e = std::move(f);
      } else if (is_name("is")) {
        ++p_;
        ExprP t = make(Expr::K::kTest, line);
        if (is_name("not")) ++p_, t->negate = true;
        t->name = expect_name();
        while (is_op(".")) ++p_, t->name += "." + expect_name();
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == T::kName || cur().type == T::kString || cur().type == T::kInt ||
                    cur().type == T::kFloat || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") &&
                   !is_name("in") && !is_name("not")) {
          if (is_name("is")) fail(line, "cannot chain tests with 'is'");
          t->args.push_back(parse_postfix(parse_primary()));
        }
        t->a = std::move(e);
        e = std::move(t);
      } else if (is_op("(")) {
        ExprP n = make(Expr::K::kCall, line);
        n->a = std::move(e);
        parse_call_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t p_ = 0;
};

}  // namespace

struct Template::Program {
  Body body;
};

// =============================================================================================
// Interpreter

namespace {

constexpr size_t kMaxOutputBytes = size_t{1} << 30;
constexpr int64_t kMaxRange = 1'000'000;

enum class Flow { kNormal, kBreak, kContinue };

// Code point sequence of a UTF-8 string (for Python's index/slice/len semantics).
std::vector<char32_t> code_points(std::string_view s) {
  std::vector<char32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) cps.push_back(utf8_next(s, i));
  return cps;
}
std::string from_code_points(const std::vector<char32_t>& cps, size_t b, size_t e) {
  std::string out;
  for (size_t i = b; i < e; ++i) utf8_append(out, cps[i]);
  return out;
}
bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

int64_t to_index(const Value& v, int line) {
  if (!v.is_int())
    fail(line, fmt::format("TypeError: indices must be integers, not {}", v.type_name()));
  return static_cast<int64_t>(v.as_int());
}

// Python slice index resolution: returns the selected positions of a sequence of length n.
std::vector<size_t> slice_positions(int64_t n, const Value& start, const Value& stop,
                                    const Value& step, int line) {
  int64_t st = 1;
  if (!step.is_none() && !step.is_undefined()) st = to_index(step, line);
  if (st == 0) fail(line, "ValueError: slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t dflt) -> int64_t {
    if (v.is_none() || v.is_undefined()) return dflt;
    int64_t i = to_index(v, line);
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : n - 1), e = clamp(stop, st > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(static_cast<size_t>(i));
  return out;
}

// Python str.strip family. chars: undefined/None -> whitespace.
std::string py_strip(std::string_view s, const Value& chars, bool left, bool right, int line) {
  std::vector<char32_t> set;
  const bool ws = chars.is_undefined() || chars.is_none();
  if (!ws) {
    if (!chars.is_string()) fail(line, "TypeError: strip arg must be None or str");
    set = code_points(chars.str());
  }
  auto strip_it = [&](char32_t c) {
    return ws ? py_isspace(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  const std::vector<char32_t> cps = code_points(s);
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return from_code_points(cps, b, e);
}

Value py_split(std::string_view s, const Value& sep, int64_t maxsplit, bool from_right, int line) {
  List parts;
  if (sep.is_undefined() || sep.is_none()) {
    // Runs of whitespace; leading/trailing whitespace ignored.
    const std::vector<char32_t> cps = code_points(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && py_isspace(cps[i])) ++i;
      if (i >= cps.size()) break;
      size_t j = i;
      while (j < cps.size() && !py_isspace(cps[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (!from_right) {
        auto rest = std::pair<size_t, size_t>{words[maxsplit].first, cps.size()};
        size_t e = cps.size();
        while (e > rest.first && py_isspace(cps[e - 1])) --e;
        words.resize(maxsplit);
        words.emplace_back(rest.first, e);
      } else {
        const size_t keep_from = words.size() - maxsplit;
        size_t b = 0;
        while (b < cps.size() && py_isspace(cps[b])) ++b;
        std::vector<std::pair<size_t, size_t>> w2{{b, words[keep_from - 1].second}};
        w2.insert(w2.end(), words.begin() + keep_from, words.end());
        words = std::move(w2);
      }
    }
    for (auto [b, e] : words) parts.push_back(Value::string(from_code_points(cps, b, e)));
    return Value::list(std::move(parts));
  }
  if (!sep.is_string()) fail(line, "TypeError: must be str or None");
  const std::string& d = sep.str();
  if (d.empty()) fail(line, "ValueError: empty separator");
  std::vector<std::string> out;
  if (!from_right) {
    size_t pos = 0;
    for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
      const size_t f = s.find(d, pos);
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, f - pos));
      pos = f + d.size();
    }
    out.emplace_back(s.substr(pos));
  } else {
    size_t end = s.size();
    for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
      if (end < d.size()) break;
      const size_t f = s.rfind(d, end - d.size());
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(f + d.size(), end - f - d.size()));
      end = f;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
  }
  for (auto& p : out) parts.push_back(Value::string(std::move(p)));
  return Value::list(std::move(parts));
}

std::string py_title(std::string_view s, bool capitalize_only) {
  const std::vector<char32_t> cps = code_points(s);
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    std::string one;
    utf8_append(one, cps[i]);
    const bool upper = capitalize_only ? i == 0 : !prev_cased;
    std::string mapped = upper ? py_upper(one) : py_lower(one);
    out += mapped;
    const bool cased = py_upper(one) != py_lower(one);
    prev_cased = cased;
  }
  return out;
}

class Interp {
 public:
  Interp(const Dict& vars, std::string& out) : out_(out) {
    scopes_.emplace_back();
    install_globals();
    for (const auto& [k, v] : vars.items)
      if (k.is_string()) scopes_.back()[k.str()] = v;
    scopes_.emplace_back();  // the template's own top-level sets
  }

  Flow run(const Body& body) {
    for (const NodeP& n : body) {
      const Flow f = exec(*n);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

 private:
  using Scope = std::unordered_map<std::string, Value>;

  void emit(std::string_view s) {
    if (out_.size() + s.size() > kMaxOutputBytes) fail(0, "rendered output exceeds 1 GiB");
    out_ += s;
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::undefined(fmt::format("'{}' is undefined", name));
  }
  void assign(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }

  void assign_targets(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      assign(targets[0], v);
      return;
    }
    List items = iterate(v, line);
    if (items.size() != targets.size())
      fail(line, fmt::format("ValueError: expected {} values to unpack, got {}", targets.size(),
                             items.size()));
    for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], items[i]);
  }

  Flow exec(const Node& n) {
    switch (n.k) {
      case Node::K::kData:
        emit(n.data);
        return Flow::kNormal;
      case Node::K::kOutput: {
        const Value v = eval(*n.expr);
        emit(v.to_str());
        return Flow::kNormal;
      }
      case Node::K::kIf:
        for (const auto& [cond, body] : n.branches)
          if (!cond || eval(*cond).truthy()) return run(body);
        return Flow::kNormal;
      case Node::K::kFor:
        return exec_for(n);
      case Node::K::kSet: {
        Value v = eval(*n.expr);
        if (n.target_attr) {
          Value obj = eval(*n.target_attr);
          if (obj.kind() != Value::Kind::kNamespace)
            fail(n.line, "cannot assign attribute on non-namespace object");
          obj.mapping().set(Value::string(n.attr), std::move(v));
        } else {
          assign_targets(n.targets, v, n.line);
        }
        return Flow::kNormal;
      }
      case Node::K::kSetBlock: {
        std::string captured;
        std::swap(captured, out_);
        run(n.body);
        std::swap(captured, out_);
        assign(n.targets[0], Value::string(std::move(captured)));
        return Flow::kNormal;
      }
      case Node::K::kBreak:
        return Flow::kBreak;
      case Node::K::kContinue:
        return Flow::kContinue;
      case Node::K::kScope:
        return run(n.body);
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Node& n) {
    List all = iterate(eval(*n.expr), n.line);
    List items;
    if (n.filter) {
      for (Value& v : all) {
        scopes_.emplace_back();
        assign_targets(n.targets, v, n.line);
        const bool keep = eval(*n.filter).truthy();
        scopes_.pop_back();
        if (keep) items.push_back(std::move(v));
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) {
      if (!n.else_body.empty()) {
        scopes_.emplace_back();
        const Flow f = run(n.else_body);
        scopes_.pop_back();
        return f == Flow::kNormal ? f : Flow::kNormal;
      }
      return Flow::kNormal;
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      scopes_.emplace_back();
      Dict loop;
      loop.set(Value::string("index0"), Value::integer(i));
      loop.set(Value::string("index"), Value::integer(i + 1));
      loop.set(Value::string("revindex0"), Value::integer(len - 1 - i));
      loop.set(Value::string("revindex"), Value::integer(len - i));
      loop.set(Value::string("first"), Value::boolean(i == 0));
      loop.set(Value::string("last"), Value::boolean(i == len - 1));
      loop.set(Value::string("length"), Value::integer(len));
      loop.set(Value::string("depth"), Value::integer(1));
      loop.set(Value::string("depth0"), Value::integer(0));
      loop.set(Value::string("previtem"),
               i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
      loop.set(Value::string("nextitem"),
               i + 1 < len ? items[i + 1] : Value::undefined("there is no next item"));
      loop.set(Value::string("cycle"),
               Value::function("loop.cycle", [i](std::vector<Value>& args, KwArgs&) -> Value {
                 if (args.empty()) fail(0, "TypeError: no items for cycling given");
                 return args[static_cast<size_t>(i) % args.size()];
               }));
      assign("loop", Value::ns(std::move(loop)));
      assign_targets(n.targets, items[i], n.line);
      const Flow f = run(n.body);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  List iterate(const Value& v, int line) const {
    switch (v.kind()) {
      case Value::Kind::kUndefined:
        return {};
      case Value::Kind::kList:
        return v.items();
      case Value::Kind::kDict: {
        List keys;
        for (const auto& [k, _] : v.mapping().items) keys.push_back(k);
        return keys;
      }
      case Value::Kind::kString: {
        List chars;
        for (char32_t c : code_points(v.str())) {
          std::string s;
          utf8_append(s, c);
          chars.push_back(Value::string(std::move(s)));
        }
        return chars;
      }
      default:
        fail(line, fmt::format("TypeError: '{}' object is not iterable", v.type_name()));
    }
  }

  // ----- expressions

  [[noreturn]] void undefined_error(const Value& u, int line) const {
    fail(line,
         "UndefinedError: " + (u.name().empty() ? std::string("value is undefined") : u.name()));
  }

  Value eval(const Expr& e) {
    switch (e.k) {
      case Expr::K::kConst:
        return e.value;
      case Expr::K::kName:
        return lookup(e.name);
      case Expr::K::kList:
      case Expr::K::kTuple: {
        List items;
        for (const ExprP& a : e.args) items.push_back(eval(*a));
        return e.k == Expr::K::kTuple ? Value::tuple(std::move(items))
                                      : Value::list(std::move(items));
      }
      case Expr::K::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2)
          d.set(eval(*e.args[i]), eval(*e.args[i + 1]));
        return Value::dict(std::move(d));
      }
      case Expr::K::kAttr:
        return get_attr(eval(*e.a), e.name, e.line);
      case Expr::K::kItem:
        return get_item(eval(*e.a), eval(*e.b), e.line);
      case Expr::K::kSlice:
        return get_slice(eval(*e.a), e.b ? eval(*e.b) : Value::none(),
                         e.c ? eval(*e.c) : Value::none(),
                         e.args[0] ? eval(*e.args[0]) : Value::none(), e.line);
      case Expr::K::kCall: {
        const Value f = eval(*e.a);
        std::vector<Value> args;
        KwArgs kwargs;
        for (const ExprP& a : e.args) args.push_back(eval(*a));
        for (const auto& [k, a] : e.kwargs) kwargs.emplace_back(k, eval(*a));
        if (f.is_undefined()) undefined_error(f, e.line);
        if (!f.is_callable())
          fail(e.line, fmt::format("TypeError: '{}' object is not callable", f.type_name()));
        return f.fn()(args, kwargs);
      }
      case Expr::K::kFilter:
        return apply_filter(e);
      case Expr::K::kTest: {
        const bool r = apply_test(e);
        return Value::boolean(e.negate ? !r : r);
      }
      case Expr::K::kNeg:
      case Expr::K::kPos: {
        const Value v = eval(*e.a);
        if (v.is_undefined()) undefined_error(v, e.line);
        if (!v.is_number())
          fail(e.line, fmt::format("TypeError: bad operand type for unary {}: '{}'",
                                   e.k == Expr::K::kNeg ? '-' : '+', v.type_name()));
        if (e.k == Expr::K::kPos) return v.is_bool() ? Value::integer(v.as_int()) : v;
        return v.kind() == Value::Kind::kFloat ? Value::number(-v.as_double())
                                               : Value::integer(-v.as_int());
      }
      case Expr::K::kNot:
        return Value::boolean(!eval(*e.a).truthy());
      case Expr::K::kAnd: {
        Value l = eval(*e.a);
        return l.truthy() ? eval(*e.b) : l;
      }
      case Expr::K::kOr: {
        Value l = eval(*e.a);
        return l.truthy() ? l : eval(*e.b);
      }
      case Expr::K::kBinary:
        return binary(e.name, eval(*e.a), eval(*e.b), e.line);
      case Expr::K::kCompare: {
        Value l = eval(*e.a);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value r = eval(*e.args[i]);
          if (!compare(e.ops[i], l, r, e.line)) return Value::boolean(false);
          l = std::move(r);
        }
        return Value::boolean(true);
      }
      case Expr::K::kCond:
        if (eval(*e.a).truthy()) return eval(*e.b);
        return e.c ? eval(*e.c) : Value::undefined("the conditional expression had no else");
    }
    return Value();
  }

  bool contains(const Value& container, const Value& item, int line) const {
    switch (container.kind()) {
      case Value::Kind::kString:
        if (!item.is_string())
          fail(line, fmt::format("TypeError: 'in <string>' requires string as left operand, not {}",
                                 item.type_name()));
        return container.str().find(item.str()) != std::string::npos;
      case Value::Kind::kList:
        for (const Value& v : container.items())
          if (py_equal(v, item)) return true;
        return false;
      case Value::Kind::kDict:
      case Value::Kind::kNamespace:
        return container.mapping().find(item) != nullptr;
      case Value::Kind::kUndefined:
        return false;
      default:
        fail(line, fmt::format("TypeError: argument of type '{}' is not iterable",
                               container.type_name()));
    }
  }

  bool compare(const std::string& op, const Value& l, const Value& r, int line) const {
    if (op == "==") return py_equal(l, r);
    if (op == "!=") return !py_equal(l, r);
    if (op == "in") return contains(r, l, line);
    if (op == "not in") return !contains(r, l, line);
    if (l.is_undefined()) undefined_error(l, line);
    if (r.is_undefined()) undefined_error(r, line);
    try {
      if (op == "<") return py_less(l, r);
      if (op == ">") return py_less(r, l);
      if (op == "<=") return !py_less(r, l);
      if (op == ">=") return !py_less(l, r);
    } catch (const TemplateError& err) {
      fail(line, err.what());
    }
    fail(line, "unknown comparison " + op);
  }

  Value binary(const std::string& op, const Value& l, const Value& r, int line) const {
    if (op == "~") return Value::string(l.to_str() + r.to_str());
    if (l.is_undefined()) undefined_error(l, line);
    if (r.is_undefined()) undefined_error(r, line);
    auto type_error = [&]() {
      fail(line, fmt::format("TypeError: unsupported operand type(s) for {}: '{}' and '{}'", op,
                             l.type_name(), r.type_name()));
    };
    if (l.is_number() && r.is_number()) {
      const bool fl = l.kind() == Value::Kind::kFloat || r.kind() == Value::Kind::kFloat;
      const double a = l.as_double(), b = r.as_double();
      const __int128 x = l.as_int(), y = r.as_int();
      if (op == "+") return fl ? Value::number(a + b) : Value::integer(x + y);
      if (op == "-") return fl ? Value::number(a - b) : Value::integer(x - y);
      if (op == "*") return fl ? Value::number(a * b) : Value::integer(x * y);
      if (op == "/") {
        if (b == 0) fail(line, "ZeroDivisionError: division by zero");
        return Value::number(a / b);
      }
      if (op == "//" || op == "%") {
        if (fl ? b == 0 : y == 0)
          fail(line, "ZeroDivisionError: integer division or modulo by zero");
        if (fl) {
          const double q = std::floor(a / b);
          return op == "//" ? Value::number(q) : Value::number(a - q * b);
        }
        __int128 q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return op == "//" ? Value::integer(q) : Value::integer(x - q * y);
      }
      if (op == "**") {
        if (!fl && y >= 0) {
          __int128 p = 1;
          for (__int128 k = 0; k < y; ++k) {
            p *= x;
            if (p > (static_cast<__int128>(1) << 100) || p < -(static_cast<__int128>(1) << 100))
              fail(line, "OverflowError: integer power too large");
          }
          return Value::integer(p);
        }
        return Value::number(std::pow(a, b));
      }
    }
    if (op == "+") {
      if (l.is_string() && r.is_string()) return Value::string(l.str() + r.str());
      if (l.is_list() && r.is_list()) {
        List items = l.items();
        items.insert(items.end(), r.items().begin(), r.items().end());
        return Value::list(std::move(items));
      }
      type_error();
    }
    if (op == "*" && (l.is_string() || l.is_list()) && r.is_int()) {
      const int64_t n = static_cast<int64_t>(std::max<__int128>(0, r.as_int()));
      if (l.is_string()) {
        if (l.str().size() * n > kMaxOutputBytes) fail(line, "string repetition too large");
        std::string s;
        for (int64_t k = 0; k < n; ++k) s += l.str();
        return Value::string(std::move(s));
      }
      List items;
      for (int64_t k = 0; k < n; ++k) items.insert(items.end(), l.items().begin(), l.items().end());
      return Value::list(std::move(items));
    }
    if (op == "*" && l.is_int() && (r.is_string() || r.is_list())) return binary(op, r, l, line);
    if (op == "%" && l.is_string()) fail(line, "printf-style string formatting is not supported");
    type_error();
    return Value();
  }

  Value get_item(const Value& obj, const Value& key, int line) {
    switch (obj.kind()) {
      case Value::Kind::kUndefined:
        undefined_error(obj, line);
      case Value::Kind::kList: {
        if (!key.is_int()) break;
        int64_t i = static_cast<int64_t>(key.as_int());
        const int64_t n = static_cast<int64_t>(obj.items().size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("list index out of range");
        return obj.items()[static_cast<size_t>(i)];
      }
      case Value::Kind::kString: {
        if (!key.is_int()) break;
        const std::vector<char32_t> cps = code_points(obj.str());
        int64_t i = static_cast<int64_t>(key.as_int());
        const int64_t n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("string index out of range");
        return Value::string(from_code_points(cps, i, i + 1));
      }
      case Value::Kind::kDict:
      case Value::Kind::kNamespace: {
        if (const Value* v = obj.mapping().find(key)) return *v;
        if (key.is_string()) return get_attr(obj, key.str(), line, /*from_item=*/true);
        return Value::undefined(fmt::format("'dict object' has no attribute {}", key.repr()));
      }
      default:
        break;
    }
    if (key.is_string()) return get_attr(obj, key.str(), line, /*from_item=*/true);
    return Value::undefined(
        fmt::format("'{} object' has no attribute {}", obj.type_name(), key.repr()));
  }

  Value get_slice(const Value& obj, const Value& b, const Value& e, const Value& s, int line) {
    if (obj.is_undefined()) undefined_error(obj, line);
    if (obj.is_list()) {
      List out;
      for (size_t i : slice_positions(static_cast<int64_t>(obj.items().size()), b, e, s, line))
        out.push_back(obj.items()[i]);
      return Value::list(std::move(out));
    }
    if (obj.is_string()) {
      const std::vector<char32_t> cps = code_points(obj.str());
      std::string out;
      for (size_t i : slice_positions(static_cast<int64_t>(cps.size()), b, e, s, line))
        utf8_append(out, cps[i]);
      return Value::string(std::move(out));
    }
    fail(line, fmt::format("TypeError: '{}' object is not subscriptable", obj.type_name()));
  }

  // Attribute access: Python attributes (methods) first, then items, as Jinja2's getattr.
  Value get_attr(const Value& obj, const std::string& name, int line, bool from_item = false) {
    switch (obj.kind()) {
      case Value::Kind::kUndefined:
        undefined_error(obj, line);
      case Value::Kind::kString:
        if (Value m = string_method(obj, name, line); !m.is_undefined()) return m;
        break;
      case Value::Kind::kDict: {
        if (!from_item)
          if (Value m = dict_method(obj, name, line); !m.is_undefined()) return m;
        if (const Value* v = obj.mapping().find(name)) return *v;
        if (from_item)
          if (Value m = dict_method(obj, name, line); !m.is_undefined()) return m;
        return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
      }
      case Value::Kind::kNamespace:
        if (const Value* v = obj.mapping().find(name)) return *v;
        break;
      default:
        break;
    }
    std::string tn = obj.type_name();
    if (obj.is_none()) tn = "None";
    return Value::undefined(
        fmt::format("'{}{}' has no attribute '{}'", tn, obj.is_none() ? "" : " object", name));
  }

  static Value arg(std::vector<Value>& args, KwArgs& kwargs, size_t i, const char* name) {
    if (i < args.size()) return args[i];
    for (auto& [k, v] : kwargs)
      if (k == name) return v;
    return Value::undefined();
  }

  Value dict_method(const Value& obj, const std::string& name, int line) {
    const std::shared_ptr<Dict> keep;  // dicts are shared: capture the value itself
    if (name == "items" || name == "keys" || name == "values") {
      return Value::function(name, [obj, name](std::vector<Value>&, KwArgs&) {
        List out;
        for (const auto& [k, v] : obj.mapping().items) {
          if (name == "items") {
            out.push_back(Value::tuple({k, v}));
          } else {
            out.push_back(name == "keys" ? k : v);
          }
        }
        return Value::list(std::move(out));
      });
    }
    if (name == "get") {
      return Value::function("get", [obj, line](std::vector<Value>& args, KwArgs& kw) {
        if (args.empty()) fail(line, "TypeError: get expected at least 1 argument");
        if (const Value* v = obj.mapping().find(args[0])) return *v;
        Value d = arg(args, kw, 1, "default");
        return d.is_undefined() ? Value::none() : d;
      });
    }
    return Value::undefined();
  }

  Value string_method(const Value& obj, const std::string& name, int line) {
    const std::string s = obj.str();
    auto method = [&](auto fn) { return Value::function(name, fn); };
    if (name == "startswith" || name == "endswith") {
      const bool starts = name == "startswith";
      return method([s, starts, line](std::vector<Value>& args, KwArgs&) {
        if (args.empty()) fail(line, "TypeError: startswith/endswith takes at least 1 argument");
        List prefixes = args[0].is_list() ? args[0].items() : List{args[0]};
        for (const Value& p : prefixes) {
          if (!p.is_string())
            fail(line, "TypeError: startswith/endswith first arg must be str or a tuple of str");
          const std::string& x = p.str();
          if (x.size() <= s.size() && (starts ? s.compare(0, x.size(), x) == 0
                                              : s.compare(s.size() - x.size(), x.size(), x) == 0))
            return Value::boolean(true);
        }
        return Value::boolean(false);
      });
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const bool left = name != "rstrip", right = name != "lstrip";
      return method([s, left, right, line](std::vector<Value>& args, KwArgs& kw) {
        return Value::string(py_strip(s, arg(args, kw, 0, "chars"), left, right, line));
      });
    }
    if (name == "split" || name == "rsplit") {
      const bool right = name == "rsplit";
      return method([s, right, line](std::vector<Value>& args, KwArgs& kw) {
        const Value m = arg(args, kw, 1, "maxsplit");
        return py_split(s, arg(args, kw, 0, "sep"),
                        m.is_int() ? static_cast<int64_t>(m.as_int()) : -1, right, line);
      });
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      return method([s, name](std::vector<Value>&, KwArgs&) {
        if (name == "upper") return Value::string(py_upper(s));
        if (name == "lower") return Value::string(py_lower(s));
        return Value::string(py_title(s, name == "capitalize"));
      });
    }
    if (name == "replace") {
      return method([s, line](std::vector<Value>& args, KwArgs&) {
        if (args.size() < 2 || !args[0].is_string() || !args[1].is_string())
          fail(line, "TypeError: replace expects two strings");
        const int64_t count =
            args.size() > 2 && args[2].is_int() ? static_cast<int64_t>(args[2].as_int()) : -1;
        const std::string &from = args[0].str(), &to = args[1].str();
        std::string out;
        if (from.empty()) {  // Python inserts `to` between every character
          const std::vector<char32_t> cps = code_points(s);
          int64_t n = 0;
          for (size_t i = 0; i <= cps.size(); ++i) {
            if (count < 0 || n < count) out += to, ++n;
            if (i < cps.size()) utf8_append(out, cps[i]);
          }
          return Value::string(std::move(out));
        }
        size_t pos = 0;
        for (int64_t n = 0; count < 0 || n < count; ++n) {
          const size_t f = s.find(from, pos);
          if (f == std::string::npos) break;
          out.append(s, pos, f - pos);
          out += to;
          pos = f + from.size();
        }
        out.append(s, pos);
        return Value::string(std::move(out));
      });
    }
    if (name == "find" || name == "rfind" || name == "count" || name == "index") {
      return method([s, name, line](std::vector<Value>& args, KwArgs&) {
        if (args.empty() || !args[0].is_string())
          fail(line, "TypeError: expects a string argument");
        const std::string& sub = args[0].str();
        if (name == "count") {
          if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
          int64_t n = 0;
          for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
          return Value::integer(n);
        }
        const size_t f = name == "rfind" ? s.rfind(sub) : s.find(sub);
        if (f == std::string::npos) {
          if (name == "index") fail(line, "ValueError: substring not found");
          return Value::integer(-1);
        }
        return Value::integer(static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, f))));
      });
    }
    if (name == "join") {
      return method([s, this, line](std::vector<Value>& args, KwArgs&) {
        if (args.empty()) fail(line, "TypeError: join() takes exactly one argument");
        std::string out;
        bool first = true;
        for (const Value& v : iterate(args[0], line)) {
          if (!v.is_string())
            fail(line, fmt::format("TypeError: sequence item: expected str instance, {} found",
                                   v.type_name()));
          if (!first) out += s;
          out += v.str();
          first = false;
        }
        return Value::string(std::move(out));
      });
    }
    if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" ||
        name == "islower" || name == "isupper") {
      return method([s, name](std::vector<Value>&, KwArgs&) {
        if (s.empty()) return Value::boolean(false);
        if (name == "isspace") {
          for (char32_t c : code_points(s))
            if (!py_isspace(c)) return Value::boolean(false);
          return Value::boolean(true);
        }
        if (name == "islower" || name == "isupper") {
          const std::string u = py_upper(s), l = py_lower(s);
          if (u == l) return Value::boolean(false);
          return Value::boolean(name == "islower" ? s == l : s == u);
        }
        if (!is_ascii(s)) fail(0, "str." + name + " on non-ASCII text is not supported");
        for (char c : s) {
          const auto uc = static_cast<unsigned char>(c);
          const bool ok = name == "isdigit"   ? std::isdigit(uc)
                          : name == "isalpha" ? std::isalpha(uc)
                                              : std::isalnum(uc);
          if (!ok) return Value::boolean(false);
        }
        return Value::boolean(true);
      });
    }
    return Value::undefined();
  }

  // ----- filters and tests

  Value apply_filter(const Expr& e) {
    Value in = eval(*e.a);
    std::vector<Value> args;
    KwArgs kw;
    for (const ExprP& a : e.args) args.push_back(eval(*a));
    for (const auto& [k, a] : e.kwargs) kw.emplace_back(k, eval(*a));
    const std::string& f = e.name;
    const int line = e.line;
    if (f == "tojson") {
      JsonDumpOptions opt;
      const Value indent = arg(args, kw, 0, "indent");
      if (indent.is_int()) opt.indent = static_cast<int>(indent.as_int());
      const Value ea = arg(args, kw, 1, "ensure_ascii");
      if (!ea.is_undefined()) opt.ensure_ascii = ea.truthy();
      const Value sep = arg(args, kw, 2, "separators");
      if (sep.is_list() && sep.items().size() == 2 && sep.items()[0].is_string() &&
          sep.items()[1].is_string()) {
        opt.item_sep = sep.items()[0].str();
        opt.key_sep = sep.items()[1].str();
      }
      const Value sk = arg(args, kw, 3, "sort_keys");
      if (!sk.is_undefined()) opt.sort_keys = sk.truthy();
      try {
        return Value::string(py_json_dumps(in, opt));
      } catch (const TemplateError& err) {
        fail(line, err.what());
      }
    }
    if (f == "length" || f == "count") {
      switch (in.kind()) {
        case Value::Kind::kString:
          return Value::integer(static_cast<int64_t>(utf8_length(in.str())));
        case Value::Kind::kList:
          return Value::integer(static_cast<int64_t>(in.items().size()));
        case Value::Kind::kDict:
        case Value::Kind::kNamespace:
          return Value::integer(static_cast<int64_t>(in.mapping().items.size()));
        case Value::Kind::kUndefined:
          return Value::integer(0);
        default:
          fail(line, fmt::format("TypeError: object of type '{}' has no len()", in.type_name()));
      }
    }
    if (f == "string") return Value::string(in.to_str());
    if (f == "trim") {
      return Value::string(py_strip(in.to_str(), arg(args, kw, 0, "chars"), true, true, line));
    }
    if (f == "upper") return Value::string(py_upper(in.to_str()));
    if (f == "lower") return Value::string(py_lower(in.to_str()));
    if (f == "capitalize") return Value::string(py_title(py_lower(in.to_str()), true));
    if (f == "title") return Value::string(py_title(in.to_str(), false));
    if (f == "safe" || f == "e" || f == "escape" || f == "forceescape") {
      if (f == "safe") return in;
      fail(line, "filter 'escape' is not supported (autoescape is off in chat templates)");
    }
    if (f == "default" || f == "d") {
      const Value dflt = arg(args, kw, 0, "default_value");
      const bool boolean = arg(args, kw, 1, "boolean").truthy();
      if (in.is_undefined() || (boolean && !in.truthy()))
        return dflt.is_undefined() ? Value::string("") : dflt;
      return in;
    }
    if (f == "join") {
      const Value sep = arg(args, kw, 0, "d");
      const Value attr = arg(args, kw, 1, "attribute");
      std::string out;
      bool first = true;
      for (const Value& v : iterate(in, line)) {
        if (!first) out += sep.is_undefined() ? "" : sep.to_str();
        out += (attr.is_undefined() ? v : get_item(v, attr, line)).to_str();
        first = false;
      }
      return Value::string(std::move(out));
    }
    if (f == "first" || f == "last") {
      List items = iterate(in, line);
      if (items.empty()) return Value::undefined("No first/last item, sequence was empty.");
      return f == "first" ? items.front() : items.back();
    }
    if (f == "list") return Value::list(iterate(in, line));
    if (f == "reverse") {
      if (in.is_string()) {
        std::vector<char32_t> cps = code_points(in.str());
        std::reverse(cps.begin(), cps.end());
        return Value::string(from_code_points(cps, 0, cps.size()));
      }
      List items = iterate(in, line);
      std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    }
    if (f == "items") {
      if (in.is_undefined()) return Value::list();
      if (!in.is_mapping()) fail(line, "TypeError: items filter expects a mapping");
      List out;
      for (const auto& [k, v] : in.mapping().items) out.push_back(Value::tuple({k, v}));
      return Value::list(std::move(out));
    }
    if (f == "int") {
      if (in.is_number())
        return Value::integer(in.kind() == Value::Kind::kFloat
                                  ? static_cast<__int128>(std::trunc(in.as_double()))
                                  : in.as_int());
      if (in.is_string()) {
        try {
          size_t used = 0;
          const std::string t = py_strip(in.str(), Value(), true, true, line);
          const long long v = std::stoll(t, &used);
          if (used == t.size()) return Value::integer(v);
        } catch (...) {
        }
      }
      const Value dflt = arg(args, kw, 0, "default");
      return dflt.is_undefined() ? Value::integer(0) : dflt;
    }
    if (f == "float") {
      if (in.is_number()) return Value::number(in.as_double());
      if (in.is_string()) {
        char* end = nullptr;
        const std::string t = py_strip(in.str(), Value(), true, true, line);
        const double v = std::strtod(t.c_str(), &end);
        if (!t.empty() && end == t.c_str() + t.size()) return Value::number(v);
      }
      const Value dflt = arg(args, kw, 0, "default");
      return dflt.is_undefined() ? Value::number(0.0) : dflt;
    }
    if (f == "abs") {
      if (!in.is_number()) fail(line, "TypeError: bad operand type for abs()");
      return in.kind() == Value::Kind::kFloat
                 ? Value::number(std::fabs(in.as_double()))
                 : Value::integer(in.as_int() < 0 ? -in.as_int() : in.as_int());
    }
    if (f == "replace") {
      if (args.size() < 2) fail(line, "replace filter expects two arguments");
      std::vector<Value> margs = args;
      KwArgs none;
      return string_method(Value::string(in.to_str()), "replace", line).fn()(margs, none);
    }
    if (f == "indent") {
      const Value w = arg(args, kw, 0, "width");
      const bool first = arg(args, kw, 1, "first").truthy();
      const bool blank = arg(args, kw, 2, "blank").truthy();
      const std::string pad =
          w.is_string() ? w.str()
                        : std::string(w.is_int() ? static_cast<size_t>(w.as_int()) : 4, ' ');
      const std::string s = in.to_str();
      std::string out;
      size_t pos = 0;
      bool first_line = true;
      for (;;) {
        const size_t nl = s.find('\n', pos);
        const std::string_view ln =
            std::string_view(s).substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
        if ((!first_line || first) && (blank || !ln.empty())) out += pad;
        out += ln;
        if (nl == std::string::npos) break;
        out += '\n';
        pos = nl + 1;
        first_line = false;
      }
      return Value::string(std::move(out));
    }
    if (f == "map" || f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
      List items = iterate(in, line), out;
      const Value attr = arg(args, kw, 0, "attribute");
      for (Value& v : items) {
        if (f == "map") {
          if (!kw.empty() && kw[0].first == "attribute") {
            Value r = get_item(v, kw[0].second, line);
            if (r.is_undefined() && kw.size() > 1 && kw[1].first == "default") r = kw[1].second;
            out.push_back(r);
          } else if (!args.empty() && args[0].is_string()) {
            out.push_back(
                call_filter_by_name(args[0].str(), v, {args.begin() + 1, args.end()}, line));
          } else {
            fail(line, "map filter needs attribute= or a filter name");
          }
          continue;
        }
        const bool by_attr = f == "selectattr" || f == "rejectattr";
        const Value subject = by_attr ? get_item(v, attr, line) : v;
        const size_t test_at = by_attr ? 1 : 0;
        bool r;
        if (args.size() > test_at) {
          if (!args[test_at].is_string()) fail(line, "select filters expect a test name");
          r = run_test(args[test_at].str(), subject, {args.begin() + test_at + 1, args.end()},
                       line);
        } else {
          r = subject.truthy();
        }
        const bool keep = (f == "select" || f == "selectattr") ? r : !r;
        if (keep) out.push_back(v);
      }
      return Value::list(std::move(out));
    }
    if (f == "unique") {
      List out;
      for (const Value& v : iterate(in, line))
        if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return py_equal(o, v); }))
          out.push_back(v);
      return Value::list(std::move(out));
    }
    if (f == "sort" || f == "min" || f == "max" || f == "sum") {
      List items = iterate(in, line);
      const Value attr = arg(args, kw, f == "sort" ? 2 : (f == "sum" ? 0 : 1), "attribute");
      auto key = [&](const Value& v) { return attr.is_undefined() ? v : get_item(v, attr, line); };
      try {
        if (f == "sum") {
          Value total = arg(args, kw, 1, "start");
          if (total.is_undefined()) total = Value::integer(0);
          for (const Value& v : items) total = binary("+", total, key(v), line);
          return total;
        }
        std::stable_sort(items.begin(), items.end(),
                         [&](const Value& a, const Value& b) { return py_less(key(a), key(b)); });
      } catch (const TemplateError& err) {
        fail(line, err.what());
      }
      if (f == "min") return items.empty() ? Value::undefined() : items.front();
      if (f == "max") return items.empty() ? Value::undefined() : items.back();
      if (arg(args, kw, 0, "reverse").truthy()) std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    }
    fail(line, fmt::format("unsupported filter '{}'", f));
  }

  Value call_filter_by_name(const std::string& name, const Value& v, std::vector<Value> args,
                            int line) {
    Expr fake;
    fake.k = Expr::K::kFilter;
    fake.name = name;
    fake.line = line;
    fake.a = std::make_unique<Expr>();
    fake.a->k = Expr::K::kConst;
    fake.a->value = v;
    for (Value& a : args) {
      auto c = std::make_unique<Expr>();
      c->k = Expr::K::kConst;
      c->value = std::move(a);
      fake.args.push_back(std::move(c));
    }
    return apply_filter(fake);
  }

  bool apply_test(const Expr& e) {
    const Value v = eval(*e.a);
    std::vector<Value> args;
    for (const ExprP& a : e.args) args.push_back(eval(*a));
    return run_test(e.name, v, args, e.line);
  }

  bool run_test(const std::string& t, const Value& v, const std::vector<Value>& args,
                int line) const {
    auto need_arg = [&]() -> const Value& {
      if (args.empty()) fail(line, fmt::format("test '{}' needs an argument", t));
      return args[0];
    };
    if (t == "defined") return !v.is_undefined();
    if (t == "undefined") return v.is_undefined();
    if (t == "none") return v.is_none();
    if (t == "boolean") return v.is_bool();
    if (t == "true") return v.is_bool() && v.as_bool();
    if (t == "false") return v.is_bool() && !v.as_bool();
    if (t == "integer") return v.kind() == Value::Kind::kInt;
    if (t == "float") return v.kind() == Value::Kind::kFloat;
    if (t == "number") return v.is_number();
    if (t == "string") return v.is_string();
    if (t == "mapping") return v.is_dict();
    if (t == "sequence") return v.is_list() || v.is_string() || v.is_dict();
    if (t == "iterable") return v.is_list() || v.is_string() || v.is_dict();
    if (t == "callable") return v.is_callable();
    if (t == "odd" || t == "even") {
      if (!v.is_int()) fail(line, "TypeError: odd/even test needs an integer");
      return (v.as_int() % 2 != 0) == (t == "odd");
    }
    if (t == "divisibleby") {
      const Value& d = need_arg();
      if (!v.is_int() || !d.is_int() || d.as_int() == 0) fail(line, "divisibleby needs integers");
      return v.as_int() % d.as_int() == 0;
    }
    if (t == "eq" || t == "equalto" || t == "==") return py_equal(v, need_arg());
    if (t == "ne" || t == "!=") return !py_equal(v, need_arg());
    if (t == "lt" || t == "lessthan" || t == "<") return compare("<", v, need_arg(), line);
    if (t == "le" || t == "<=") return compare("<=", v, need_arg(), line);
    if (t == "gt" || t == "greaterthan" || t == ">") return compare(">", v, need_arg(), line);
    if (t == "ge" || t == ">=") return compare(">=", v, need_arg(), line);
    if (t == "in") return contains(need_arg(), v, line);
    if (t == "sameas") {
      const Value& o = need_arg();
      if (v.kind() != o.kind()) return false;
      if (v.is_none() || v.is_undefined()) return true;
      if (v.is_bool()) return v.as_bool() == o.as_bool();
      if (v.is_list()) return &v.items() == &o.items();
      if (v.is_mapping()) return &v.mapping() == &o.mapping();
      return py_equal(v, o);
    }
    if (t == "lower" || t == "upper") {
      if (!v.is_string()) return false;
      return t == "lower" ? py_lower(v.str()) == v.str() : py_upper(v.str()) == v.str();
    }
    fail(line, fmt::format("unsupported test '{}'", t));
  }

  // ----- globals

  void install_globals() {
    Scope& g = scopes_.back();
    g["range"] = Value::function("range", [](std::vector<Value>& args, KwArgs&) {
      int64_t b = 0, e = 0, s = 1;
      for (const Value& a : args)
        if (!a.is_int()) fail(0, "TypeError: range() arguments must be integers");
      if (args.size() == 1) {
        e = static_cast<int64_t>(args[0].as_int());
      } else if (args.size() >= 2) {
        b = static_cast<int64_t>(args[0].as_int());
        e = static_cast<int64_t>(args[1].as_int());
        if (args.size() > 2) s = static_cast<int64_t>(args[2].as_int());
      } else {
        fail(0, "TypeError: range expected at least 1 argument");
      }
      if (s == 0) fail(0, "ValueError: range() arg 3 must not be zero");
      const __int128 count = s > 0 ? (e > b ? (static_cast<__int128>(e) - b + s - 1) / s : 0)
                                   : (b > e ? (static_cast<__int128>(b) - e - s - 1) / -s : 0);
      if (count > kMaxRange)
        fail(0, fmt::format("range() of {} items is too large", py_int_str(count)));
      List out;
      for (int64_t i = b; s > 0 ? i < e : i > e; i += s) {
        if (static_cast<int64_t>(out.size()) >= kMaxRange) fail(0, "range() too large");
        out.push_back(Value::integer(i));
      }
      return Value::list(std::move(out));
    });
    g["namespace"] = Value::function("namespace", [](std::vector<Value>& args, KwArgs& kw) {
      Dict d;
      for (const Value& a : args) {
        if (!a.is_mapping()) fail(0, "TypeError: namespace() positional argument must be a dict");
        for (const auto& [k, v] : a.mapping().items) d.set(k, v);
      }
      for (auto& [k, v] : kw) d.set(Value::string(k), v);
      return Value::ns(std::move(d));
    });
    g["dict"] = Value::function("dict", [](std::vector<Value>& args, KwArgs& kw) {
      Dict d;
      for (const Value& a : args)
        if (a.is_mapping())
          for (const auto& [k, v] : a.mapping().items) d.set(k, v);
      for (auto& [k, v] : kw) d.set(Value::string(k), v);
      return Value::dict(std::move(d));
    });
    g["raise_exception"] =
        Value::function("raise_exception", [](std::vector<Value>& args, KwArgs&) -> Value {
          fail(0, "TemplateError: " + (args.empty() ? std::string() : args[0].to_str()));
        });
    g["strftime_now"] = Value::function("strftime_now", [](std::vector<Value>& args, KwArgs&) {
      if (args.empty() || !args[0].is_string()) fail(0, "strftime_now expects a format string");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[512];
      const size_t n = std::strftime(buf, sizeof(buf), args[0].str().c_str(), &tm);
      return Value::string(std::string(buf, n));
    });
  }

  std::string& out_;
  std::vector<Scope> scopes_;
};

}  // namespace

Result<Template> Template::parse(std::string_view source) {
  if (!utf8_valid(source)) return Status::invalid("chat template is not valid UTF-8");
  // Jinja2 normalizes newlines to "\n" and drops one trailing newline (keep_trailing_newline off).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  try {
    auto program = std::make_shared<Program>();
    program->body = Parser(Lexer(std::move(src)).run()).parse_template();
    return Template(std::move(program));
  } catch (const TemplateError& e) {
    return Status::invalid("chat template syntax: {}", e.what());
  }
}

Result<std::string> Template::render(const Dict& vars) const {
  std::string out;
  try {
    Interp interp(vars, out);
    interp.run(program_->body);
  } catch (const TemplateError& e) {
    return Status::invalid("chat template: {}", e.what());
  }
  return out;
}

}  // namespace tf::tok::jinja
