// The config tree: a small YAML-like value (null, scalar, list, ordered map)
// that remembers where every value came from, so errors can say
// "from configs/x.yaml:12" or "from command line".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace YAML { class Node; }

namespace kestrel::config {

struct Value {
  // Scalars stay as their source text until validation coerces them to the
  // declared type: "1" is a valid string, int and float, depending on the key.
  enum class Kind { Null, Bool, Int, Float, String, List, Map };
  Kind kind = Kind::Null;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;       // String: the value; Bool/Int/Float: the source text
  bool quoted = false; // written in quotes: always a string, never inferred
  std::vector<Value> list;
  std::vector<std::pair<std::string, Value>> map;  // insertion-ordered
  std::string origin;  // "default", "file.yaml:12", "command line"

  // Out of line (value.cpp), where Value is complete: clang (the fuzz preset)
  // refuses to instantiate pair<string, Value>'s members inside the class.
  Value();
  ~Value();
  Value(const Value&);
  Value(Value&&) noexcept;
  Value& operator=(const Value&);
  Value& operator=(Value&&) noexcept;

  static Value null(std::string origin = {});
  static Value string(std::string s, std::string origin = {});
  static Value empty_map(std::string origin = {});

  bool is_null() const { return kind == Kind::Null; }
  bool is_map() const { return kind == Kind::Map; }
  bool is_list() const { return kind == Kind::List; }
  bool is_scalar() const { return kind != Kind::Null && kind != Kind::List && kind != Kind::Map; }

  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  // Inserts key at the end when absent; returns the slot.
  Value& at_or_insert(const std::string& key);
  bool erase(const std::string& key);
  void set_origin_recursive(const std::string& o);

  bool operator==(const Value& o) const;  // structural; ignores origin and quoting
};

// Plain (unquoted) scalar text -> typed value with YAML 1.2 core-schema rules,
// plus OmegaConf's `1e-6` floats: null/~, true/false, ints, floats, else string.
Value infer_scalar(const std::string& text, const std::string& origin);

// A command-line value in Hydra syntax: plain scalars are inferred, quoted
// strings stay strings, `[a,b]` / `{k: v}` are flow collections.
Result<Value> parse_override_value(const std::string& text, const std::string& origin);

// yaml-cpp node -> Value; `file` names origins "file:line" (1-based).
// Aliases are expanded, so a node nested deeper than kMaxYamlDepth (a
// self-referencing alias, `a: &a [*a]`, is infinitely deep) or a tree of more
// than kMaxYamlNodes expanded nodes ("billion laughs": nine aliases of nine
// aliases ...) is an error naming the file and the limit, not a stack
// overflow or gigabytes of memory. verl's deepest config nests 8 levels and
// its trees hold a few thousand nodes.
inline constexpr int kMaxYamlDepth = 64;
inline constexpr int64_t kMaxYamlNodes = 50'000;
Result<Value> from_yaml(const YAML::Node& node, const std::string& file, int line_hint);

// One scalar or flow collection as YAML text that reads back to the same value
// (strings that would be misread, e.g. "1" or "true", are double-quoted).
std::string to_flow_yaml(const Value& v);
// Block YAML for a map, `indent` spaces deep; scalars and lists stay on one line.
void emit_block_yaml(const Value& map, int indent, std::string& out);

// Shortest text that parses back to exactly d, always recognisably a float.
std::string format_float(double d);

}  // namespace kestrel::config
