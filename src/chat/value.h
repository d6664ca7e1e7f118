// The dynamic value model of the chat-template engine. It mirrors the Python
// objects that jinja2 sees when transformers renders a chat template: JSON data
// (dicts keep insertion order, as Python dicts do), tuples, jinja's Undefined,
// namespace() objects and the few global functions transformers registers.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kestrel::chat {

struct Value;
using List = std::vector<Value>;

// Insertion-ordered string-keyed map; chat data dicts are small, so a linear scan wins.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(const std::string& key, Value v);
};

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };

// Sandbox limits of one render. jinja2's sandbox bounds range() alone; these
// keep a hostile template from exhausting the stack, memory or time, far
// above what chat templates do (a few nesting levels, kilobytes of text,
// loops over the messages and their tool calls). Each is a ValueError that
// the renderer reports at the template position, naming the limit.
inline constexpr int kMaxValueDepth = 512;                    // list/dict nesting (printing, comparing recurse)
inline constexpr size_t kMaxStringBytes = size_t(16) << 20;   // any string, the output included (a 128k-token prompt is ~0.5 MB)
inline constexpr int64_t kMaxLoopIterations = 100'000;        // for-loop iterations (filters included), all loops (jinja2's MAX_RANGE)
inline constexpr int64_t kMaxRenderWork = 4'000'000;          // items built + 64-byte chunks of strings built

// Throws ValueError once the current render has built more than
// kMaxRenderWork units (quadratic `ns.l = ns.l + [x]` loops); no-op outside a render.
void charge_work(int64_t units);
// Throws ValueError when a string of n bytes would exceed kMaxStringBytes.
void check_string_size(size_t n);
// Starts a render's work budget on this thread; the previous one is restored on exit.
class RenderBudget {
 public:
  RenderBudget();
  ~RenderBudget();
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

 private:
  int64_t saved_;
  bool saved_active_;
};

struct Value {
  Kind kind = Kind::Undefined;
  int depth = 0;  // List/Dict/Namespace: 1 + the deepest element's depth (at construction)
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                // String text, Function name, or the Undefined's error hint
  std::shared_ptr<List> list;   // List (is_tuple marks Python tuples: repr and equality differ)
  bool is_tuple = false;
  std::shared_ptr<Dict> dict;   // Dict and Namespace (namespace objects are shared by reference)

  static Value undefined(std::string hint = "") { Value v; v.s = std::move(hint); return v; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value number(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value string(std::string x) {
    check_string_size(x.size());
    charge_work(int64_t(x.size() / 64));
    Value v;
    v.kind = Kind::String;
    v.s = std::move(x);
    return v;
  }
  static Value make_list(List items = {}, bool tuple = false);
  static Value make_dict(Dict d = {});
  static Value make_namespace(Dict d = {});
  static Value function(std::string name) { Value v; v.kind = Kind::Function; v.s = std::move(name); return v; }

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_string() const { return kind == Kind::String; }
  bool is_numeric() const { return kind == Kind::Bool || kind == Kind::Int || kind == Kind::Float; }
  double as_double() const { return kind == Kind::Float ? f : kind == Kind::Bool ? (b ? 1.0 : 0.0) : double(i); }
  int64_t as_int() const { return kind == Kind::Bool ? (b ? 1 : 0) : i; }
};

// Thrown by value operations that Python would raise on; the renderer adds the template position.
struct ValueError {
  std::string msg;
};

const char* type_name(const Value& v);  // Python's type name: str, int, dict, ...
bool truthy(const Value& v);
bool py_equal(const Value& a, const Value& b);
bool py_less(const Value& a, const Value& b);  // throws ValueError for unorderable types
std::string py_str(const Value& v);            // str(v); Undefined prints as ""
std::string py_repr(const Value& v);
std::string py_float_repr(double x);

struct JsonDumpOptions {
  int indent = -1;  // < 0: single line
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_sep, key_sep;  // empty: Python's defaults for the indent mode
};
std::string to_json(const Value& v, const JsonDumpOptions& opt);  // json.dumps

// Conversion from nlohmann JSON. nlohmann::json sorts object keys; pass
// nlohmann::ordered_json to keep the caller's key order (tojson output depends on it).
template <class J>
Value from_json(const J& j, int depth = 0) {
  if (depth > kMaxValueDepth)
    throw ValueError{"JSON data nested deeper than " + std::to_string(kMaxValueDepth) + " levels (the chat template limit)"};
  switch (j.type()) {
    case nlohmann::detail::value_t::null: return Value::none();
    case nlohmann::detail::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::detail::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case nlohmann::detail::value_t::number_unsigned: return Value::integer(int64_t(j.template get<uint64_t>()));
    case nlohmann::detail::value_t::number_float: return Value::number(j.template get<double>());
    case nlohmann::detail::value_t::string: return Value::string(j.template get<std::string>());
    case nlohmann::detail::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return Value::make_list(std::move(items));
    }
    case nlohmann::detail::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), from_json(it.value(), depth + 1));
      return Value::make_dict(std::move(d));
    }
    default: return Value::undefined("binary JSON values are not supported");
  }
}

// UTF-8 helpers: Python indexes strings by code point.
std::vector<uint32_t> utf8_decode(std::string_view s);
std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end);
void utf8_append(std::string& out, uint32_t cp);
bool py_isspace(uint32_t cp);

}  // namespace kestrel::chat
