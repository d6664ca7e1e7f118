// Recursive-descent parser following jinja2/parser.py's grammar and operator
// precedence (filters bind tighter than arithmetic; `is` tests hang off filters).
#include <algorithm>
#include <set>

#include "chat/ast.h"

namespace kestrel::chat::detail {

bool is_known_filter(const std::string& n) {
  static const std::set<std::string> k = {"abs",  "capitalize", "count", "d",      "default", "first",  "float",
                                          "int",  "items",      "join",  "last",   "length",  "list",   "lower",
                                          "reject", "replace",  "select", "string", "title",  "tojson", "trim",
                                          "upper"};
  return k.count(n) > 0;
}

bool is_known_test(const std::string& n) {
  static const std::set<std::string> k = {
      "boolean", "callable", "defined", "divisibleby", "eq",  "equalto", "even", "false", "float",    "ge",
      "gt",      "in",       "integer", "iterable",    "le",  "lower",   "lt",   "mapping", "ne",     "none",
      "number",  "odd",      "sameas",  "sequence",    "string", "true", "undefined", "upper", "==", "!=",
      "<",       "<=",       ">",       ">="};
  return k.count(n) > 0;
}

namespace {

ExprPtr mk(EK kind, size_t pos) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

// Nesting the parser allows: blocks inside blocks, brackets, unary and
// operator chains (a+a+...+a is a left-deep tree as deep as it is long). The
// renderer and the tree's destructor recurse once per level, so a template
// nested 5000 deep would overflow the stack; real templates nest < 20.
constexpr int kMaxNesting = 500;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& toks) : t_(toks) {}

  Body parse_template() {
    std::string end;
    return parse_body({}, &end);
  }

 private:
  const std::vector<Token>& t_;
  size_t i_ = 0;
  int nest_ = 0;

  // One more level of nesting for the guard's lifetime (and one more per deeper()).
  class Nest {
   public:
    explicit Nest(Parser& p) : p_(p), saved_(p.nest_) { deeper(); }
    ~Nest() { p_.nest_ = saved_; }
    void deeper() {
      if (++p_.nest_ > kMaxNesting)
        p_.fail("nested deeper than " + std::to_string(kMaxNesting) + " levels (the chat template limit)");
    }

   private:
    Parser& p_;
    int saved_;
  };

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  [[noreturn]] void fail(const std::string& msg) const { throw SourceError{cur().pos, msg}; }
  std::string describe(const Token& tk) const {
    switch (tk.type) {
      case Tok::Eof: return "end of template";
      case Tok::VarEnd: return "end of print statement '}}'";
      case Tok::BlockEnd: return "end of statement block '%}'";
      case Tok::String: return "string literal";
      default: return "'" + tk.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
    ++i_;
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail("expected a name, got " + describe(cur()));
    return t_[i_++].text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) fail("expected end of statement block '%}', got " + describe(cur()));
    ++i_;
  }

  // Parses statements until one of `ends` opens a block; leaves the cursor on that tag's name.
  Body parse_body(const std::vector<std::string>& ends, std::string* which) {
    Nest nest(*this);
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tok::Eof) {
        if (!ends.empty()) fail("unexpected end of template, expected '{% " + ends.back() + " %}'");
        return body;
      }
      if (tk.type == Tok::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = SK::Text;
        s->pos = tk.pos;
        s->text = tk.text;
        body.push_back(std::move(s));
        ++i_;
        continue;
      }
      if (tk.type == Tok::VarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = SK::Output;
        s->pos = tk.pos;
        ++i_;
        s->expr = parse_tuple(true);
        if (cur().type != Tok::VarEnd) fail("expected end of print statement '}}', got " + describe(cur()));
        ++i_;
        body.push_back(std::move(s));
        continue;
      }
      if (tk.type != Tok::BlockBegin) fail("unexpected " + describe(tk));
      ++i_;
      if (cur().type != Tok::Name) fail("expected a tag name after '{%', got " + describe(cur()));
      const std::string name = cur().text;
      if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
        *which = name;
        return body;
      }
      body.push_back(parse_statement(name));
    }
  }

  StmtPtr parse_statement(const std::string& name) {
    auto s = std::make_unique<Stmt>();
    s->pos = cur().pos;
    ++i_;
    std::string end;
    if (name == "if") {
      s->kind = SK::If;
      ExprPtr cond = parse_tuple(true);
      while (true) {
        expect_block_end();
        Body b = parse_body({"elif", "else", "endif"}, &end);
        s->branches.emplace_back(std::move(cond), std::move(b));
        ++i_;  // the end tag's name
        if (end == "elif") {
          cond = parse_tuple(true);
          continue;
        }
        if (end == "else") {
          expect_block_end();
          Body eb = parse_body({"endif"}, &end);
          s->branches.emplace_back(nullptr, std::move(eb));
          ++i_;
        }
        expect_block_end();
        return s;
      }
    }
    if (name == "for") {
      s->kind = SK::For;
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        ++i_;
        s->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail("expected 'in' in for loop, got " + describe(cur()));
      ++i_;
      s->expr = parse_tuple(false);
      if (is_name("if")) {
        ++i_;
        s->filter = parse_expression(true);
      }
      if (is_name("recursive")) fail("not supported yet: recursive for loops");
      expect_block_end();
      s->body = parse_body({"else", "endfor"}, &end);
      ++i_;
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, &end);
        ++i_;
      }
      expect_block_end();
      return s;
    }
    if (name == "set") {
      s->targets.push_back(expect_name());
      if (is_op(".")) {
        ++i_;
        s->ns_attr = expect_name();
      } else {
        while (is_op(",")) {
          ++i_;
          s->targets.push_back(expect_name());
        }
      }
      if (is_op("=")) {
        ++i_;
        s->kind = SK::Set;
        s->expr = parse_tuple(true);
        expect_block_end();
        return s;
      }
      if (!s->ns_attr.empty() || s->targets.size() != 1) fail("expected '=' in set statement");
      if (is_op("|")) fail("not supported yet: filtered block set");
      s->kind = SK::SetBlock;
      expect_block_end();
      s->body = parse_body({"endset"}, &end);
      ++i_;
      expect_block_end();
      return s;
    }
    if (name == "break" || name == "continue") {
      s->kind = name == "break" ? SK::Break : SK::Continue;
      expect_block_end();
      return s;
    }
    if (name == "generation") {  // transformers' AssistantTracker tag: renders its body unchanged
      s->kind = SK::Generation;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, &end);
      ++i_;
      expect_block_end();
      return s;
    }
    static const std::set<std::string> known = {"macro", "call",  "filter", "include", "import", "from",
                                                "extends", "block", "with", "raw", "do",     "autoescape"};
    --i_;
    if (known.count(name)) fail("not supported yet: tag '" + name + "'");
    fail("unknown tag '" + name + "'");
  }

  // ---- expressions ----

  ExprPtr parse_tuple(bool with_condexpr) {
    const size_t pos = cur().pos;
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto tup = mk(EK::TupleLit, pos);
    tup->args.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || is_op(")") || is_name("in")) break;
      tup->args.push_back(parse_expression(with_condexpr));
    }
    return tup;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Nest nest(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    Nest nest(*this);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      nest.deeper();
      auto c = mk(EK::Cond, cur().pos);
      ++i_;
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (is_name("else")) {
        ++i_;
        other = parse_condexpr();
      }
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(other));  // may be null: the ternary yields Undefined
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary_chain(EK kind, const char* word, ExprPtr (Parser::*next)()) {
    Nest nest(*this);
    ExprPtr left = (this->*next)();
    while (is_name(word)) {
      nest.deeper();
      auto n = mk(kind, cur().pos);
      ++i_;
      n->args.push_back(std::move(left));
      n->args.push_back((this->*next)());
      left = std::move(n);
    }
    return left;
  }
  ExprPtr parse_or() { return binary_chain(EK::Or, "or", &Parser::parse_and); }
  ExprPtr parse_and() { return binary_chain(EK::And, "and", &Parser::parse_not); }

  ExprPtr parse_not() {
    Nest nest(*this);
    if (is_name("not")) {
      auto n = mk(EK::Not, cur().pos);
      ++i_;
      n->args.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const size_t pos = cur().pos;
    ExprPtr first = parse_math1();
    auto cmp = mk(EK::Compare, pos);
    cmp->args.push_back(std::move(first));
    while (true) {
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        cmp->ops.push_back(cur().text);
        ++i_;
      } else if (is_name("in")) {
        cmp->ops.push_back("in");
        ++i_;
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        cmp->ops.push_back("notin");
        i_ += 2;
      } else {
        break;
      }
      cmp->args.push_back(parse_math1());
    }
    if (cmp->ops.empty()) return std::move(cmp->args[0]);
    return cmp;
  }

  ExprPtr binary_ops(std::initializer_list<const char*> ops, ExprPtr (Parser::*next)()) {
    Nest nest(*this);
    ExprPtr left = (this->*next)();
    while (cur().type == Tok::Op &&
           std::any_of(ops.begin(), ops.end(), [&](const char* o) { return cur().text == o; })) {
      nest.deeper();
      auto n = mk(EK::Binary, cur().pos);
      n->name = cur().text;
      ++i_;
      n->args.push_back(std::move(left));
      n->args.push_back((this->*next)());
      left = std::move(n);
    }
    return left;
  }
  ExprPtr parse_math1() { return binary_ops({"+", "-"}, &Parser::parse_concat); }
  ExprPtr parse_concat() {
    const size_t pos = cur().pos;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto c = mk(EK::Concat, pos);
    c->args.push_back(std::move(first));
    while (is_op("~")) {
      ++i_;
      c->args.push_back(parse_math2());
    }
    return c;
  }
  ExprPtr parse_math2() { return binary_ops({"*", "/", "//", "%"}, &Parser::parse_pow); }
  ExprPtr parse_pow() { return binary_ops({"**"}, &Parser::parse_unary_filtered); }
  ExprPtr parse_unary_filtered() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = mk(is_op("-") ? EK::Neg : EK::Pos, cur().pos);
      ++i_;
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    if (tk.type == Tok::Name) {
      ++i_;
      auto c = mk(EK::Const, tk.pos);
      if (tk.text == "true" || tk.text == "True") c->value = Value::boolean(true);
      else if (tk.text == "false" || tk.text == "False") c->value = Value::boolean(false);
      else if (tk.text == "none" || tk.text == "None") c->value = Value::none();
      else {
        c->kind = EK::Name;
        c->name = tk.text;
      }
      return c;
    }
    if (tk.type == Tok::String) {
      std::string s;
      const size_t pos = tk.pos;
      while (cur().type == Tok::String) s += t_[i_++].text;  // adjacent literals concatenate
      auto c = mk(EK::Const, pos);
      c->value = Value::string(std::move(s));
      return c;
    }
    if (tk.type == Tok::Int || tk.type == Tok::Float) {
      ++i_;
      auto c = mk(EK::Const, tk.pos);
      c->value = tk.type == Tok::Int ? Value::integer(tk.ival) : Value::number(tk.fval);
      return c;
    }
    if (is_op("(")) {
      ++i_;
      if (is_op(")")) {
        ++i_;
        return mk(EK::TupleLit, tk.pos);
      }
      ExprPtr first = parse_expression(true);
      if (is_op(")")) {
        ++i_;
        return first;
      }
      auto tup = mk(EK::TupleLit, tk.pos);
      tup->args.push_back(std::move(first));
      while (is_op(",")) {
        ++i_;
        if (is_op(")")) break;
        tup->args.push_back(parse_expression(true));
      }
      expect_op(")");
      return tup;
    }
    if (is_op("[")) {
      ++i_;
      auto l = mk(EK::ListLit, tk.pos);
      while (!is_op("]")) {
        if (!l->args.empty()) expect_op(",");
        if (is_op("]")) break;
        l->args.push_back(parse_expression(true));
      }
      ++i_;
      return l;
    }
    if (is_op("{")) {
      ++i_;
      auto d = mk(EK::DictLit, tk.pos);
      while (!is_op("}")) {
        if (!d->args.empty()) expect_op(",");
        if (is_op("}")) break;
        d->args.push_back(parse_expression(true));
        expect_op(":");
        d->args.push_back(parse_expression(true));
      }
      ++i_;
      return d;
    }
    fail("unexpected " + describe(tk));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    Nest nest(*this);
    while (true) {
      nest.deeper();
      if (is_op(".")) {
        const size_t pos = cur().pos;
        ++i_;
        if (cur().type == Tok::Int) {
          auto g = mk(EK::GetItem, pos);
          auto c = mk(EK::Const, cur().pos);
          c->value = Value::integer(cur().ival);
          ++i_;
          g->args.push_back(std::move(node));
          g->args.push_back(std::move(c));
          node = std::move(g);
          continue;
        }
        auto g = mk(EK::GetAttr, pos);
        g->name = expect_name();
        g->args.push_back(std::move(node));
        node = std::move(g);
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node), EK::Call);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const size_t pos = cur().pos;
    ++i_;  // '['
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (is_op("]")) {
        ++i_;
        auto g = mk(EK::GetItem, pos);
        g->args.push_back(std::move(obj));
        g->args.push_back(std::move(start));
        return g;
      }
      if (is_op(",")) fail("not supported yet: tuple subscripts");
    }
    auto sl = mk(EK::Slice, pos);
    expect_op(":");
    ExprPtr stop, step;
    if (!is_op("]") && !is_op(":")) stop = parse_expression(true);
    if (is_op(":")) {
      ++i_;
      if (!is_op("]")) step = parse_expression(true);
    }
    expect_op("]");
    sl->args.push_back(std::move(obj));
    sl->args.push_back(std::move(start));
    sl->args.push_back(std::move(stop));
    sl->args.push_back(std::move(step));
    return sl;
  }

  // Parses `(args)` into node->args[1..] / kwargs; args[0] is the callee or filtered value.
  void parse_call_args(Expr& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (n.args.size() > 1 || !n.kwargs.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("not supported yet: *args / **kwargs in calls");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string key = cur().text;
        i_ += 2;
        n.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!n.kwargs.empty()) fail("positional argument follows keyword argument");
        n.args.push_back(parse_expression(true));
      }
    }
    ++i_;
  }

  ExprPtr parse_call(ExprPtr callee, EK kind) {
    auto c = mk(kind, callee->pos);
    c->args.push_back(std::move(callee));
    parse_call_args(*c);
    return c;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    Nest nest(*this);
    while (true) {
      nest.deeper();
      if (is_op("|")) {
        ++i_;
        auto f = mk(EK::Filter, cur().pos);
        f->name = expect_name();
        if (!is_known_filter(f->name)) {
          --i_;
          fail("not supported yet: filter '" + f->name + "'");
        }
        f->args.push_back(std::move(node));
        if (is_op("(")) parse_call_args(*f);
        node = std::move(f);
      } else if (is_name("is")) {
        ++i_;
        auto t = mk(EK::Test, cur().pos);
        if (is_name("not")) {
          t->negated = true;
          ++i_;
          t->pos = cur().pos;
        }
        t->name = expect_name();
        if (!is_known_test(t->name)) {
          --i_;
          fail("not supported yet: test '" + t->name + "'");
        }
        t->args.push_back(std::move(node));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                    cur().type == Tok::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail("cannot chain multiple tests with 'is'");
          t->args.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(t);
      } else if (is_op("(")) {
        node = parse_call(std::move(node), EK::Call);
      } else {
        return node;
      }
    }
  }
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace kestrel::chat::detail
