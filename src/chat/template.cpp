// The evaluator: walks the syntax tree with jinja's scoping (a for-loop body is
// a fresh scope per iteration; if/else share the enclosing one) and jinja's
// default Undefined (prints as "", is falsy and iterates as empty, but any
// attribute, item or arithmetic on it raises).
#include "chat/template.h"

#include <unordered_map>

#include "chat/ast.h"
#include "chat/builtins.h"

namespace kestrel::chat {

using namespace detail;

struct Template::Impl {
  std::string source;  // newline-normalised, as jinja sees it
  Body body;
};

namespace {

struct RenderError {
  size_t pos;
  std::string msg;
  bool raised = false;  // from raise_exception(): the template's own message
};

std::string where(const std::string& src, size_t pos) {
  size_t line = 1, col = 1;
  for (size_t k = 0; k < pos && k < src.size(); ++k) {
    if (src[k] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(src[k]) & 0xC0) != 0x80) {
      ++col;
    }
  }
  return "chat template line " + std::to_string(line) + ", col " + std::to_string(col);
}

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  Renderer(const RenderOptions& opt, std::unordered_map<std::string, Value> globals) : opt_(opt) {
    frames_.push_back(std::move(globals));
  }

  Flow exec_body(const Body& body, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec(*s, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

 private:
  const RenderOptions& opt_;
  std::vector<std::unordered_map<std::string, Value>> frames_;
  int64_t iterations_left_ = kMaxLoopIterations;  // for-loop iterations left in this render, all loops together

  void append(std::string& out, const std::string& piece, size_t pos) {
    if (out.size() + piece.size() > kMaxStringBytes)
      fail(pos, "the rendered text exceeds the chat template limit of " + std::to_string(kMaxStringBytes >> 20) + " MiB");
    out += piece;
  }
  void count_iteration(size_t pos) {
    if (--iterations_left_ < 0)
      fail(pos, "more than " + std::to_string(kMaxLoopIterations) +
                    " loop iterations in one render (the chat template limit; nested loops over large ranges?)");
  }
  static bool holds_namespace(const Value& v, int depth) {
    if (v.kind == Kind::Namespace) return true;
    if (depth > 2 * kMaxValueDepth) return false;  // unreachable: deeper values are refused when built
    if (v.kind == Kind::List)
      for (const Value& e : *v.list)
        if (holds_namespace(e, depth + 1)) return true;
    if (v.kind == Kind::Dict)
      for (const auto& kv : v.dict->items)
        if (holds_namespace(kv.second, depth + 1)) return true;
    return false;
  }

  [[noreturn]] static void fail(size_t pos, std::string msg) { throw RenderError{pos, std::move(msg)}; }

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto hit = it->find(name);
      if (hit != it->end()) return hit->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  void assign(const Stmt& s, const std::vector<std::string>& names, const Value& v) {
    if (names.size() == 1) {
      frames_.back()[names[0]] = v;
      return;
    }
    std::vector<Value> items;
    try {
      items = iterate(v);
    } catch (const ValueError& e) {
      fail(s.pos, "cannot unpack: " + e.msg);
    }
    if (items.size() != names.size())
      fail(s.pos, items.size() < names.size()
                      ? "not enough values to unpack (expected " + std::to_string(names.size()) + ", got " +
                            std::to_string(items.size()) + ")"
                      : "too many values to unpack (expected " + std::to_string(names.size()) + ")");
    for (size_t k = 0; k < names.size(); ++k) frames_.back()[names[k]] = items[k];
  }

  Flow exec(const Stmt& s, std::string& out) {
    switch (s.kind) {
      case SK::Text: append(out, s.text, s.pos); return Flow::Normal;
      case SK::Output: append(out, py_str(eval(*s.expr)), s.pos); return Flow::Normal;
      case SK::If:
        for (const auto& [cond, body] : s.branches)
          if (!cond || truthy(eval(*cond))) return exec_body(body, out);
        return Flow::Normal;
      case SK::For: return exec_for(s, out);
      case SK::Set: {
        Value v = eval(*s.expr);
        if (s.ns_attr.empty()) {
          assign(s, s.targets, v);
          return Flow::Normal;
        }
        Value ns = lookup(s.targets[0]);
        if (ns.kind != Kind::Namespace)
          fail(s.pos, "cannot assign attribute '" + s.ns_attr + "' on '" + s.targets[0] +
                          "': it is not a namespace() object");
        if (!s.ns_attr.empty() && s.ns_attr[0] == '_')
          fail(s.pos, "chat templates cannot store underscore-prefixed attributes on a namespace");
        // A namespace is the one mutable container: one stored in another
        // (or in itself) could form a cycle that printing never leaves.
        if (holds_namespace(v, 0))
          fail(s.pos, "not supported yet: storing a namespace() object inside a namespace (attribute '" + s.ns_attr + "')");
        if (v.depth + 1 > kMaxValueDepth)
          fail(s.pos, "a value nested deeper than " + std::to_string(kMaxValueDepth) + " levels (the chat template limit)");
        ns.dict->set(s.ns_attr, std::move(v));
        return Flow::Normal;
      }
      case SK::SetBlock: {
        std::string captured;
        frames_.emplace_back();
        exec_body(s.body, captured);
        frames_.pop_back();
        frames_.back()[s.targets[0]] = Value::string(std::move(captured));
        return Flow::Normal;
      }
      case SK::Break: return Flow::Break;
      case SK::Continue: return Flow::Continue;
      case SK::Generation: return exec_body(s.body, out);
    }
    return Flow::Normal;
  }

  Flow exec_for(const Stmt& s, std::string& out) {
    const Value seq = eval(*s.expr);
    std::vector<Value> items;
    try {
      items = iterate(seq);
    } catch (const ValueError& e) {
      fail(s.expr->pos, e.msg);
    }
    if (s.filter) {
      std::vector<Value> kept;
      for (const Value& it : items) {
        count_iteration(s.pos);
        frames_.emplace_back();
        assign(s, s.targets, it);
        const bool keep = truthy(eval(*s.filter));
        frames_.pop_back();
        if (keep) kept.push_back(it);
      }
      items = std::move(kept);
    }
    const int64_t n = int64_t(items.size());
    for (int64_t k = 0; k < n; ++k) {
      count_iteration(s.pos);
      frames_.emplace_back();
      assign(s, s.targets, items[size_t(k)]);
      Dict loop;
      loop.set("index0", Value::integer(k));
      loop.set("index", Value::integer(k + 1));
      loop.set("revindex0", Value::integer(n - k - 1));
      loop.set("revindex", Value::integer(n - k));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k == n - 1));
      loop.set("length", Value::integer(n));
      loop.set("depth", Value::integer(1));
      loop.set("depth0", Value::integer(0));
      loop.set("previtem", k > 0 ? items[size_t(k - 1)] : Value::undefined("there is no previous item"));
      loop.set("nextitem", k + 1 < n ? items[size_t(k + 1)] : Value::undefined("there is no next item"));
      frames_.back()["loop"] = Value::make_dict(std::move(loop));
      const Flow f = exec_body(s.body, out);
      frames_.pop_back();
      if (f == Flow::Break) break;
    }
    if (n == 0) return exec_body(s.else_body, out);
    return Flow::Normal;
  }

  CallArgs eval_args(const Expr& e, size_t first) {
    CallArgs a;
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k]));
    for (const auto& [key, ex] : e.kwargs) a.kw.emplace_back(key, eval(*ex));
    return a;
  }

  static Value get_attr(const Value& obj, const std::string& name) {
    switch (obj.kind) {
      case Kind::Undefined: fail_undefined(obj);
      case Kind::Dict:
      case Kind::Namespace: {
        const Value* hit = obj.dict->find(name);
        if (hit) return *hit;
        return Value::undefined(std::string("'") + (obj.kind == Kind::Dict ? "dict" : "Namespace") +
                                " object' has no attribute '" + name + "'");
      }
      case Kind::None: return Value::undefined("'None' has no attribute '" + name + "'");
      default: return Value::undefined(std::string("'") + type_name(obj) + " object' has no attribute '" + name + "'");
    }
  }

  static Value get_item(const Value& obj, const Value& key) {
    if (obj.is_undefined()) fail_undefined(obj);
    if ((obj.kind == Kind::List || obj.is_string()) && (key.kind == Kind::Int || key.kind == Kind::Bool)) {
      const int64_t len = obj.is_string() ? int64_t(utf8_decode(obj.s).size()) : int64_t(obj.list->size());
      const int64_t idx = key.as_int() < 0 ? key.as_int() + len : key.as_int();
      if (idx < 0 || idx >= len)
        return Value::undefined(std::string("'") + type_name(obj) + " object' has no element " + py_str(key));
      if (obj.is_string()) {
        auto cps = utf8_decode(obj.s);
        return Value::string(utf8_encode(cps, size_t(idx), size_t(idx) + 1));
      }
      return (*obj.list)[size_t(idx)];
    }
    if (key.is_string()) return get_attr(obj, key.s);
    return Value::undefined(std::string("'") + type_name(obj) + " object' has no element " + py_repr(key));
  }

  Value call_global(const Expr& e, const std::string& fn, const CallArgs& a) {
    if (fn == "raise_exception") {
      throw RenderError{e.pos, a.pos.empty() ? std::string() : py_str(a.pos[0]), true};
    }
    if (fn == "strftime_now") {
      if (a.pos.empty() || !a.pos[0].is_string()) fail(e.pos, "strftime_now() needs a format string");
      std::tm tm{};
      if (opt_.now) {
        tm = *opt_.now;
      } else {
        const std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
      }
      char buf[512];
      const size_t len = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
      return Value::string(std::string(buf, len));
    }
    if (fn == "namespace" || fn == "dict") {
      Dict d;
      if (!a.pos.empty()) {
        if (a.pos.size() > 1 || a.pos[0].kind != Kind::Dict) fail(e.pos, fn + "() takes a single mapping argument");
        d = *a.pos[0].dict;
      }
      for (const auto& [k, v] : a.kw) d.set(k, v);
      if (fn == "namespace") {
        for (const auto& kv : d.items)
          if (!kv.first.empty() && kv.first[0] == '_')
            fail(e.pos, "chat templates cannot store underscore-prefixed attributes on a namespace");
        return Value::make_namespace(std::move(d));
      }
      return Value::make_dict(std::move(d));
    }
    if (fn == "range") {
      std::vector<int64_t> v;
      for (const Value& x : a.pos) {
        if (x.kind != Kind::Int && x.kind != Kind::Bool) fail(e.pos, "range() arguments must be integers");
        v.push_back(x.as_int());
      }
      if (v.empty() || v.size() > 3) fail(e.pos, "range() takes 1 to 3 arguments");
      const int64_t start = v.size() > 1 ? v[0] : 0, stop = v.size() > 1 ? v[1] : v[0], step = v.size() > 2 ? v[2] : 1;
      if (step == 0) fail(e.pos, "range() arg 3 must not be zero");
      List out;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        if (out.size() >= 100000) fail(e.pos, "range too big (the sandbox limit is 100000 items)");
        out.push_back(Value::integer(k));
      }
      return Value::make_list(std::move(out));
    }
    fail(e.pos, "not supported yet: function '" + fn + "'");
  }

  Value eval(const Expr& e) {
    try {
      return eval_inner(e);
    } catch (const ValueError& err) {
      throw RenderError{e.pos, err.msg};
    }
  }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case EK::Const: return e.value;
      case EK::Name: return lookup(e.name);
      case EK::GetAttr: return get_attr(eval(*e.args[0]), e.name);
      case EK::GetItem: return get_item(eval(*e.args[0]), eval(*e.args[1]));
      case EK::Slice: {
        Value obj = eval(*e.args[0]);
        std::optional<int64_t> b[3];
        for (int k = 0; k < 3; ++k) {
          if (!e.args[size_t(k) + 1]) continue;
          Value x = eval(*e.args[size_t(k) + 1]);
          if (x.kind == Kind::None) continue;
          if (x.kind != Kind::Int && x.kind != Kind::Bool)
            fail(e.args[size_t(k) + 1]->pos, "slice indices must be integers or None");
          b[k] = x.as_int();
        }
        return py_slice(obj, b[0], b[1], b[2]);
      }
      case EK::Call: {
        const Expr& callee = *e.args[0];
        if (callee.kind == EK::GetAttr) {
          Value obj = eval(*callee.args[0]);
          return call_method(obj, callee.name, eval_args(e, 1));
        }
        Value fn = eval(callee);
        if (fn.is_undefined()) fail_undefined(fn);
        if (fn.kind != Kind::Function) fail(e.pos, std::string("'") + type_name(fn) + "' object is not callable");
        return call_global(e, fn.s, eval_args(e, 1));
      }
      case EK::Filter: return apply_filter(e.name, eval(*e.args[0]), eval_args(e, 1));
      case EK::Test: {
        const bool r = apply_test(e.name, eval(*e.args[0]), eval_args(e, 1));
        return Value::boolean(r != e.negated);
      }
      case EK::Neg:
      case EK::Pos: {
        Value v = eval(*e.args[0]);
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_numeric())
          fail(e.pos, std::string("bad operand type for unary ") + (e.kind == EK::Neg ? "-" : "+") + ": '" +
                          type_name(v) + "'");
        if (e.kind == EK::Pos) return v.kind == Kind::Bool ? Value::integer(v.as_int()) : v;
        if (v.kind != Kind::Float && v.as_int() == INT64_MIN)
          fail(e.pos, "integer overflow in unary '-' (chat template integers are 64-bit)");
        return v.kind == Kind::Float ? Value::number(-v.f) : Value::integer(-v.as_int());
      }
      case EK::Binary: return binary_op(e.name, eval(*e.args[0]), eval(*e.args[1]));
      case EK::Compare: {
        Value left = eval(*e.args[0]);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.args[k + 1]);
          const std::string& op = e.ops[k];
          bool r;
          if (op == "==") r = py_equal(left, right);
          else if (op == "!=") r = !py_equal(left, right);
          else if (op == "in" || op == "notin") {
            r = contains(right, left) == (op == "in");
          } else {
            if (left.is_undefined()) fail_undefined(left);
            if (right.is_undefined()) fail_undefined(right);
            if (op == "<") r = py_less(left, right);
            else if (op == "<=") r = !py_less(right, left);
            else if (op == ">") r = py_less(right, left);
            else r = !py_less(left, right);
          }
          if (!r) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case EK::And: {
        Value l = eval(*e.args[0]);
        return truthy(l) ? eval(*e.args[1]) : l;
      }
      case EK::Or: {
        Value l = eval(*e.args[0]);
        return truthy(l) ? l : eval(*e.args[1]);
      }
      case EK::Not: return Value::boolean(!truthy(eval(*e.args[0])));
      case EK::Concat: {
        std::string s;
        for (const auto& a : e.args) {
          s += py_str(eval(*a));
          check_string_size(s.size());
        }
        return Value::string(std::move(s));
      }
      case EK::Cond:
        if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("the inline if-expression had no else branch");
      case EK::ListLit:
      case EK::TupleLit: {
        List l;
        for (const auto& a : e.args) l.push_back(eval(*a));
        return Value::make_list(std::move(l), e.kind == EK::TupleLit);
      }
      case EK::DictLit: {
        Dict d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k]);
          if (!key.is_string()) fail(e.args[k]->pos, "not supported yet: non-string dict keys");
          d.set(key.s, eval(*e.args[k + 1]));
        }
        return Value::make_dict(std::move(d));
      }
    }
    fail(e.pos, "internal error: unknown expression");
  }
};

std::string normalize_newlines(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t k = 0; k < src.size(); ++k) {
    if (src[k] == '\r') {
      out += '\n';
      if (k + 1 < src.size() && src[k + 1] == '\n') ++k;
    } else {
      out += src[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

Result<std::string> render_impl(const Template::Impl& impl, std::unordered_map<std::string, Value> vars,
                                const RenderOptions& opt) {
  std::unordered_map<std::string, Value> globals;
  for (const char* fn : {"raise_exception", "strftime_now", "namespace", "dict", "range"})
    globals[fn] = Value::function(fn);
  for (auto& kv : vars) globals[kv.first] = std::move(kv.second);
  Renderer r(opt, std::move(globals));
  std::string out;
  try {
    r.exec_body(impl.body, out);
  } catch (const RenderError& e) {
    if (e.raised) return KS_ERR(where(impl.source, e.pos), ": the template raised an exception: ", e.msg);
    return KS_ERR(where(impl.source, e.pos), ": ", e.msg);
  } catch (const ValueError& e) {  // from building loop variables, outside any expression
    return KS_ERR("chat template: ", e.msg);
  }
  return out;
}

template <class J>
Result<std::string> render_json(const Template::Impl& impl, const J& context, const RenderOptions& opt) {
  if (!context.is_object()) return KS_ERR("chat template context must be a JSON object, got ", context.type_name());
  RenderBudget budget;  // the context's conversion counts toward the render's work
  std::unordered_map<std::string, Value> vars;
  try {
    for (auto it = context.begin(); it != context.end(); ++it) vars[it.key()] = from_json(it.value());
  } catch (const ValueError& e) {
    return KS_ERR("chat template variables: ", e.msg);
  }
  return render_impl(impl, std::move(vars), opt);
}

template <class J>
Result<std::string> apply_impl(const Template& tmpl, const J& messages, bool add_generation_prompt, const J& extra,
                               const RenderOptions& opt) {
  if (!messages.is_array()) return KS_ERR("apply_chat_template: messages must be a JSON array of objects");
  if (messages.empty()) return KS_ERR("apply_chat_template: cannot apply a chat template to an empty conversation");
  if (!extra.is_object()) return KS_ERR("apply_chat_template: extra context must be a JSON object");
  J msgs = J::array();
  for (size_t k = 0; k < messages.size(); ++k) {
    const J& m = messages[k];
    if (!m.is_object()) return KS_ERR("apply_chat_template: message ", k, " is not a JSON object");
    J clean = J::object();  // transformers drops keys whose value is None
    for (auto it = m.begin(); it != m.end(); ++it)
      if (!it.value().is_null()) clean[it.key()] = it.value();
    // Reasoning is exposed under every name templates read: {"thinking": r, **message, "reasoning_content": r}.
    const J* reasoning = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"})
      if (!reasoning && clean.contains(key)) reasoning = &clean[key];
    if (reasoning) {
      J r = *reasoning;
      J aliased = J::object();
      aliased["thinking"] = r;
      for (auto it = clean.begin(); it != clean.end(); ++it) aliased[it.key()] = it.value();
      aliased["reasoning_content"] = r;
      clean = std::move(aliased);
    }
    msgs.push_back(std::move(clean));
  }
  J ctx = J::object();
  ctx["messages"] = std::move(msgs);
  ctx["tools"] = extra.contains("tools") ? extra["tools"] : J();
  ctx["documents"] = extra.contains("documents") ? extra["documents"] : J();
  ctx["add_generation_prompt"] = add_generation_prompt;
  for (auto it = extra.begin(); it != extra.end(); ++it)
    if (it.key() != "tools" && it.key() != "documents") ctx[it.key()] = it.value();
  return tmpl.render(ctx, opt);
}

}  // namespace

Result<Template> Template::parse(std::string source) {
  auto impl = std::make_shared<Impl>();
  impl->source = normalize_newlines(source);
  try {
    impl->body = detail::parse(detail::lex(impl->source));
  } catch (const SourceError& e) {
    return KS_ERR(where(impl->source, e.pos), ": ", e.msg);
  }
  Template t;
  t.impl_ = std::move(impl);
  return t;
}

const std::string& Template::source() const { return impl_->source; }

Result<std::string> Template::render(const nlohmann::ordered_json& context, const RenderOptions& opt) const {
  return render_json(*impl_, context, opt);
}
Result<std::string> Template::render(const nlohmann::json& context, const RenderOptions& opt) const {
  return render_json(*impl_, context, opt);
}

Result<std::string> apply_chat_template(const Template& tmpl, const nlohmann::ordered_json& messages,
                                        bool add_generation_prompt, const nlohmann::ordered_json& extra,
                                        const RenderOptions& opt) {
  return apply_impl(tmpl, messages, add_generation_prompt, extra, opt);
}
Result<std::string> apply_chat_template(const Template& tmpl, const nlohmann::json& messages,
                                        bool add_generation_prompt, const nlohmann::json& extra,
                                        const RenderOptions& opt) {
  return apply_impl(tmpl, messages, add_generation_prompt, extra, opt);
}

}  // namespace kestrel::chat
