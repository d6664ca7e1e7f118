// Coercion to declared types and the value checks: allowed values, supported
// values, and "only the default" for keys that are not supported yet.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "config/config.h"
#include "config/internal.h"

namespace kestrel::config::detail {

namespace {

// How a value reads in messages: strings and scalars as written.
std::string show(const Value& v) {
  if (v.kind == Value::Kind::String) return v.s;
  if (v.is_scalar() && !v.s.empty()) return v.s;
  return to_flow_yaml(v);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool nullable(const KeyDecl& d) {
  return d.nullable || d.default_yaml == "null" || d.default_yaml.find("${") != std::string::npos;
}

Type element_type(Type t) {
  switch (t) {
    case Type::IntList: return Type::Int;
    case Type::FloatList: return Type::Float;
    default: return Type::String;
  }
}

// Scalar coercion; false when the value cannot be read as `t`. Strings that
// spell a number or bool are accepted for typed keys, as OmegaConf does.
bool coerce_scalar(Value& v, Type t) {
  const std::string o = v.origin;
  switch (t) {
    case Type::Bool: {
      if (v.kind == Value::Kind::Bool) return true;
      if (v.kind != Value::Kind::String) return false;
      const std::string l = lower(v.s);
      if (l == "true" || l == "yes" || l == "on") v.kind = Value::Kind::Bool, v.b = true;
      else if (l == "false" || l == "no" || l == "off") v.kind = Value::Kind::Bool, v.b = false;
      return v.kind == Value::Kind::Bool;
    }
    case Type::Int: {
      if (v.kind == Value::Kind::String) v = infer_scalar(v.s, o);
      return v.kind == Value::Kind::Int;
    }
    case Type::Float: {
      if (v.kind == Value::Kind::String) v = infer_scalar(v.s, o);
      if (v.kind == Value::Kind::Int) {
        v.kind = Value::Kind::Float;
        v.f = static_cast<double>(v.i);
      }
      return v.kind == Value::Kind::Float;
    }
    case Type::String:
      if (v.kind == Value::Kind::String) return true;
      if (!v.is_scalar()) return false;
      if (v.s.empty()) v.s = to_flow_yaml(v);
      v.kind = Value::Kind::String;
      return true;
    default: return false;
  }
}

bool coerce(Value& v, const KeyDecl& d) {
  if (v.is_null()) {
    if (d.type == Type::Map) v = Value::empty_map(v.origin);
    return d.type == Type::Map || nullable(d);
  }
  switch (d.type) {
    case Type::Map: return v.is_map();
    case Type::IntList:
    case Type::FloatList:
    case Type::StringList: {
      if (v.is_scalar()) {  // "data.train_files=x.parquet" is a one-element list
        Value one = v;
        v = Value{};
        v.kind = Value::Kind::List;
        v.origin = one.origin;
        v.list.push_back(std::move(one));
      }
      if (!v.is_list()) return false;
      for (auto& e : v.list)
        if (!coerce_scalar(e, element_type(d.type))) return false;
      return true;
    }
    default: return coerce_scalar(v, d.type);
  }
}

bool contains(const std::vector<std::string>& set, const std::string& s) {
  return std::find(set.begin(), set.end(), s) != set.end();
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// The string values a membership check looks at: the value, or each list element.
std::vector<std::string> members(const Value& v) {
  std::vector<std::string> out;
  if (v.kind == Value::Kind::String) out.push_back(v.s);
  for (const auto& e : v.list)
    if (e.kind == Value::Kind::String) out.push_back(e.s);
  return out;
}

bool numeric(Type t) { return t == Type::Int || t == Type::Float || t == Type::IntList || t == Type::FloatList; }

// The range check of one numeric value (a scalar or a list element): empty when
// valid, else why not. Floats are finite whatever the range; nulls were
// checked by coerce.
std::string out_of_range(const KeyDecl& d, const Value& e) {
  if (e.kind != Value::Kind::Int && e.kind != Value::Kind::Float) return "";
  const double x = e.kind == Value::Kind::Int ? static_cast<double>(e.i) : e.f;
  const std::string valid = d.range ? d.range->describe() : "a finite number";
  if (e.kind == Value::Kind::Float && !std::isfinite(x) && !(d.range && d.range->contains(x)))
    return "must be finite (" + valid + ")";
  if (d.range && !d.range->contains(x)) return "must be " + valid;
  return "";
}

// Range and finiteness of a numeric key; empty when valid.
std::string range_error(const KeyDecl& d, const Value& v) {
  if (!numeric(d.type) || v.is_null()) return "";
  if (v.is_list()) {
    for (size_t i = 0; i < v.list.size(); ++i) {
      const std::string why = out_of_range(d, v.list[i]);
      if (!why.empty())
        return "config key '" + d.path + "' element " + std::to_string(i) + " " + why + ", got '" +
               show(v.list[i]) + "' in " + to_flow_yaml(v) + from(v.origin);
    }
    return "";
  }
  const std::string why = out_of_range(d, v);
  return why.empty() ? "" : "config key '" + d.path + "' " + why + ", got '" + show(v) + "'" + from(v.origin);
}

}  // namespace

namespace {
// The key a value copies when it is exactly "${key}" or "${oc.select:key,...}".
std::string copied_key(const Value* raw, const std::string& path) {
  if (!raw || raw->kind != Value::Kind::String || raw->s.rfind("${", 0) != 0 || raw->s.back() != '}') return "";
  std::string key = raw->s.substr(2, raw->s.size() - 3);
  if (key.rfind("oc.select:", 0) == 0) key = key.substr(10, key.find(',') == std::string::npos ? std::string::npos
                                                                                                  : key.find(',') - 10);
  if (key.find_first_of("${}:") != std::string::npos) return "";
  if (key[0] != '.') return key;
  size_t dots = 0;
  while (dots < key.size() && key[dots] == '.') ++dots;
  auto parts = split_path(path);
  for (size_t i = 0; i < dots && !parts.empty(); ++i) parts.pop_back();
  std::string base;
  for (const auto& p : parts) base += (base.empty() ? "" : ".") + p;
  return base.empty() ? key.substr(dots) : base + "." + key.substr(dots);
}
}  // namespace

void validate(const Schema& schema, Value& resolved, const Value& raw, std::vector<std::string>& all_errors,
              std::vector<std::string>& notices) {
  // One message per mistake: a key that only copies a rejected key is not reported again.
  std::vector<std::pair<std::string, std::string>> found;
  for (const auto& d : schema.keys()) {
    auto report = [&](std::string msg) { found.emplace_back(d.path, std::move(msg)); };
    Value* v = lookup(resolved, d.path);
    KS_CHECK(v, "config key missing after merge: ", d.path);
    const Value before = *v;
    if (!coerce(*v, d)) {
      report("config key '" + d.path + "' expects " + type_name(d.type) +
                       (before.is_null() ? ", got null" : ", got '" + show(before) + "'") + from(before.origin));
      continue;
    }
    const auto ms = members(*v);
    bool bad_value = false;
    for (const auto& m : ms) {
      if (!d.allowed.empty() && !contains(d.allowed, m)) {
        report("config key '" + d.path + "' must be one of [" + join(d.allowed) + "], got '" + m + "'" +
                         from(v->origin));
        bad_value = true;
        break;
      }
    }
    if (bad_value) continue;
    if (std::string why = range_error(d, *v); !why.empty()) {
      report(std::move(why));
      continue;
    }
    const std::string shown = d.path + "=" + to_flow_yaml(*v);
    bool unsupported = false;
    for (const auto& m : ms) {
      auto why = std::find_if(d.noted.begin(), d.noted.end(), [&](const auto& n) { return n.first == m; });
      if (why != d.noted.end()) {
        notices.push_back("note: " + d.path + " has '" + m + "' (from " + v->origin + "): " + why->second);
        continue;
      }
      unsupported |= !d.supported.empty() && !contains(d.supported, m);
    }
    if (unsupported) {
      report("not supported yet: " + shown + " (from " + v->origin + "; supported: " + join(d.supported) + ")");
      continue;
    }
    if (d.status != Support::Supported) {
      // Compared with the default resolved in this config: a ref key that
      // follows the actor's value is still "the default".
      auto def = resolve_as(schema, raw, parse_default(d), d.path);
      Value dv = def.is_ok() ? std::move(def).value() : Value::null();
      const bool is_default = (coerce(dv, d) && dv == *v) || contains(d.as_default, to_flow_yaml(*v));
      if (d.status == Support::NotSupportedYet && !is_default)
        report("not supported yet: " + shown + " (from " + v->origin + "; only the default " +
                         to_flow_yaml(dv) + " works)");
      if (d.status == Support::NoEffect && !is_default)
        notices.push_back("note: " + shown + " (from " + v->origin + ") has no effect in Kestrel: " + d.doc);
    }
  }
  std::set<std::string> failed;
  for (const auto& [p, m] : found) failed.insert(p);
  for (const auto& [p, m] : found) {
    const std::string src = copied_key(lookup(raw, p), p);
    if (!src.empty() && failed.count(src)) continue;
    all_errors.push_back(m);
  }
}

}  // namespace kestrel::config::detail
