#include "config/value.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>

namespace kestrel::config {

Value::Value() = default;
Value::~Value() = default;
Value::Value(const Value&) = default;
Value::Value(Value&&) noexcept = default;
Value& Value::operator=(const Value&) = default;
Value& Value::operator=(Value&&) noexcept = default;

Value Value::null(std::string origin) {
  Value v;
  v.origin = std::move(origin);
  return v;
}

Value Value::string(std::string s, std::string origin) {
  Value v;
  v.kind = Kind::String;
  v.s = std::move(s);
  v.origin = std::move(origin);
  return v;
}

Value Value::empty_map(std::string origin) {
  Value v;
  v.kind = Kind::Map;
  v.origin = std::move(origin);
  return v;
}

const Value* Value::find(const std::string& key) const {
  for (const auto& [k, v] : map)
    if (k == key) return &v;
  return nullptr;
}

Value* Value::find(const std::string& key) {
  for (auto& [k, v] : map)
    if (k == key) return &v;
  return nullptr;
}

Value& Value::at_or_insert(const std::string& key) {
  if (Value* v = find(key)) return *v;
  map.emplace_back(key, Value{});
  return map.back().second;
}

bool Value::erase(const std::string& key) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (it->first == key) {
      map.erase(it);
      return true;
    }
  }
  return false;
}

void Value::set_origin_recursive(const std::string& o) {
  origin = o;
  for (auto& e : list) e.set_origin_recursive(o);
  for (auto& [k, e] : map) e.set_origin_recursive(o);
}

bool Value::operator==(const Value& o) const {
  if (kind != o.kind) {
    // 1 and 1.0 are the same number once coerced to a float key.
    const bool num_a = kind == Kind::Int || kind == Kind::Float, num_b = o.kind == Kind::Int || o.kind == Kind::Float;
    if (num_a && num_b) return (kind == Kind::Int ? double(i) : f) == (o.kind == Kind::Int ? double(o.i) : o.f);
    return false;
  }
  switch (kind) {
    case Kind::Null: return true;
    case Kind::Bool: return b == o.b;
    case Kind::Int: return i == o.i;
    case Kind::Float: return f == o.f || (std::isnan(f) && std::isnan(o.f));
    case Kind::String: return s == o.s;
    case Kind::List: return list == o.list;
    case Kind::Map: return map == o.map;
  }
  return false;
}

namespace {

// [-+]?[0-9]+
// Digits with optional '_' between them (YAML 1.1 / PyYAML, which verl's
// yaml uses: trace_alloc_max_entries: 100_000).
bool is_int_text(const std::string& t) {
  size_t i = (t[0] == '+' || t[0] == '-') ? 1 : 0;
  if (i == t.size()) return false;
  for (size_t start = i; i < t.size(); ++i) {
    if (t[i] == '_' && i > start && i + 1 < t.size() && t[i - 1] != '_') continue;
    if (t[i] < '0' || t[i] > '9') return false;
  }
  return true;
}

// [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
bool is_float_text(const std::string& t) {
  size_t i = (t[0] == '+' || t[0] == '-') ? 1 : 0;
  auto digits = [&] {
    const size_t s0 = i;
    while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
    return i - s0;
  };
  const size_t whole = digits();
  size_t frac = 0;
  if (i < t.size() && t[i] == '.') {
    ++i;
    frac = digits();
  }
  if (whole == 0 && frac == 0) return false;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == t.size();
}

bool parse_special_float(const std::string& t, double* out) {
  static const char* const kInf[] = {".inf", ".Inf", ".INF", "inf", "Inf"};
  for (const char* s : kInf) {
    if (t == s || t == std::string("+") + s) { *out = INFINITY; return true; }
    if (t == std::string("-") + s) { *out = -INFINITY; return true; }
  }
  if (t == ".nan" || t == ".NaN" || t == ".NAN" || t == "nan" || t == "NaN") { *out = NAN; return true; }
  return false;
}

}  // namespace

Value infer_scalar(const std::string& t, const std::string& origin) {
  Value v;
  v.origin = origin;
  v.s = t;
  if (t.empty() || t == "~" || t == "null" || t == "Null" || t == "NULL") {
    v.kind = Value::Kind::Null;
    v.s.clear();
    return v;
  }
  if (t == "true" || t == "True" || t == "TRUE" || t == "false" || t == "False" || t == "FALSE") {
    v.kind = Value::Kind::Bool;
    v.b = t[0] == 't' || t[0] == 'T';
    return v;
  }
  if (is_int_text(t)) {
    std::string digits;
    for (char c : t)
      if (c != '_') digits += c;
    const char* first = digits.data() + (digits[0] == '+' ? 1 : 0);
    auto [p, ec] = std::from_chars(first, digits.data() + digits.size(), v.i);
    if (ec == std::errc() && p == digits.data() + digits.size()) {
      v.kind = Value::Kind::Int;
      return v;
    }
  }
  double d;
  if (is_float_text(t) || parse_special_float(t, &d)) {
    if (!parse_special_float(t, &d)) d = std::strtod(t.c_str(), nullptr);
    v.kind = Value::Kind::Float;
    v.f = d;
    return v;
  }
  v.kind = Value::Kind::String;
  return v;
}

namespace {

struct YamlBudget {
  std::string file;  // "" for the command line
  int64_t nodes_left = kMaxYamlNodes;
};

// The error names the file and the line of the node that went past a limit.
Status yaml_limit(const YamlBudget& b, const YAML::Node& node, const std::string& what) {
  const std::string where = b.file.empty() ? std::string("command-line value")
                                           : b.file + ":" + std::to_string(node.Mark().line + 1);
  return KS_ERR(where, ": ", what,
                " (is an alias inside the node it names, or do aliases expand exponentially? Write the values out)");
}

Result<Value> from_yaml_at(const YAML::Node& node, int line_hint, int depth, YamlBudget& b) {
  if (depth > kMaxYamlDepth)
    return yaml_limit(b, node, "YAML nested deeper than " + std::to_string(kMaxYamlDepth) + " levels once aliases expand");
  if (--b.nodes_left < 0)
    return yaml_limit(b, node, "YAML expands to more than " + std::to_string(kMaxYamlNodes) + " nodes once aliases expand");
  const int line = node.Mark().line >= 0 && !node.IsNull() ? node.Mark().line + 1 : line_hint;
  const std::string origin = b.file.empty() ? std::string("command line") : b.file + ":" + std::to_string(line);
  Value v;
  v.origin = origin;
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null: return v;
    case YAML::NodeType::Scalar:
      if (node.Tag() == "!") {  // quoted: a string whatever it looks like
        v = Value::string(node.Scalar(), origin);
        v.quoted = true;
        return v;
      }
      return infer_scalar(node.Scalar(), origin);
    case YAML::NodeType::Sequence:
      v.kind = Value::Kind::List;
      for (const auto& e : node) {
        KS_ASSIGN(Value item, from_yaml_at(e, line, depth + 1, b));
        v.list.push_back(std::move(item));
      }
      return v;
    case YAML::NodeType::Map:
      v.kind = Value::Kind::Map;
      for (const auto& kv : node) {
        const int kline = kv.first.Mark().line + 1;
        KS_ASSIGN(Value item, from_yaml_at(kv.second, kline, depth + 1, b));
        v.at_or_insert(kv.first.Scalar()) = std::move(item);
      }
      return v;
  }
  return v;
}

}  // namespace

Result<Value> from_yaml(const YAML::Node& node, const std::string& file, int line_hint) {
  YamlBudget b;
  b.file = file;
  return from_yaml_at(node, line_hint, 0, b);
}

Result<Value> parse_override_value(const std::string& text, const std::string& origin) {
  // Hydra: `key=` sets the empty string.
  if (text.empty()) return Value::string("", origin);
  const char c = text.front();
  if (c == '[' || c == '{' || c == '\'' || c == '"') {
    try {
      YAML::Node n = YAML::Load(text);
      auto parsed = from_yaml(n, "", 0);
      if (!parsed) return KS_ERR("cannot parse value '", text.size() > 200 ? text.substr(0, 200) + "..." : text, "' (",
                                 origin, "): ", parsed.status().message());
      Value v = std::move(parsed).value();
      v.set_origin_recursive(origin);
      return v;
    } catch (const YAML::Exception& e) {
      return KS_ERR("cannot parse value '", text, "' (", origin, "): ", e.msg,
                    "; quote lists for the shell, e.g. 'key=[1,2]'");
    }
  }
  return infer_scalar(text, origin);
}

std::string format_float(double d) {
  if (std::isnan(d)) return ".nan";
  if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, p);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

namespace {

bool plain_safe(const std::string& s) {
  if (s.empty()) return false;
  // Anything that would read back as another type, or that YAML treats as syntax.
  if (infer_scalar(s, "").kind != Value::Kind::String) return false;
  static const std::string kBadFirst = "-?:,[]{}#&*!|>'\"%@` ";
  if (kBadFirst.find(s.front()) != std::string::npos) return false;
  if (s.back() == ' ' || s.back() == ':') return false;
  if (s.find(": ") != std::string::npos || s.find(" #") != std::string::npos) return false;
  for (char ch : s) {
    if (ch == '\n' || ch == '\t' || ch == ',' || ch == '[' || ch == ']' || ch == '{' || ch == '}' ||
        static_cast<unsigned char>(ch) < 0x20)
      return false;
  }
  return s != "yes" && s != "no" && s != "on" && s != "off" && s != "Yes" && s != "No";
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default: out += ch;
    }
  }
  return out + "\"";
}

std::string key_text(const std::string& k) { return plain_safe(k) ? k : quote(k); }

}  // namespace

std::string to_flow_yaml(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Null: return "null";
    case Value::Kind::Bool: return v.b ? "true" : "false";
    case Value::Kind::Int: return std::to_string(v.i);
    case Value::Kind::Float: return format_float(v.f);
    case Value::Kind::String: return plain_safe(v.s) ? v.s : quote(v.s);
    case Value::Kind::List: {
      std::string out = "[";
      for (size_t j = 0; j < v.list.size(); ++j) out += (j ? ", " : "") + to_flow_yaml(v.list[j]);
      return out + "]";
    }
    case Value::Kind::Map: {
      std::string out = "{";
      for (size_t j = 0; j < v.map.size(); ++j)
        out += (j ? ", " : "") + key_text(v.map[j].first) + ": " + to_flow_yaml(v.map[j].second);
      return out + "}";
    }
  }
  return "null";
}

void emit_block_yaml(const Value& map, int indent, std::string& out) {
  for (const auto& [k, v] : map.map) {
    out.append(indent, ' ');
    out += key_text(k) + ":";
    if (v.is_map() && !v.map.empty()) {
      out += "\n";
      emit_block_yaml(v, indent + 2, out);
    } else {
      out += " " + to_flow_yaml(v) + "\n";
    }
  }
}

}  // namespace kestrel::config
