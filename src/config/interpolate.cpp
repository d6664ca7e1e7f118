// OmegaConf-style interpolation, resolved once after all sources are merged:
//   ${a.b.c}                     value of another key (typed when it is the whole string)
//   ${.x} / ${..x}               relative to the key's own section / its parent
//   ${oc.select:a.b,default}     a.b when set, else default (may nest ${...})
//   "ckpt/${trainer.project_name}"  embedded: the result is a string
// `\${` is a literal "${".
#include <algorithm>
#include <map>
#include <set>

#include "config/config.h"
#include "config/internal.h"

namespace kestrel::config::detail {

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

struct Piece {
  bool is_expr;
  std::string text;  // literal text, or the expression between ${ and }
};

// Splits "a${x}b${y}" into pieces; nested ${...} stay inside their expression.
Result<std::vector<Piece>> split_pieces(const std::string& s) {
  std::vector<Piece> out;
  std::string lit;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 3, "\\${") == 0) {
      lit += "${";
      i += 3;
      continue;
    }
    if (s.compare(i, 2, "${") != 0) {
      lit += s[i++];
      continue;
    }
    int depth = 1;
    size_t j = i + 2;
    for (; j < s.size() && depth > 0; ++j) {
      if (s.compare(j, 2, "${") == 0) ++depth, ++j;
      else if (s[j] == '}') --depth;
    }
    if (depth != 0) return KS_ERR("missing '}'");
    if (!lit.empty()) out.push_back({false, lit}), lit.clear();
    out.push_back({true, s.substr(i + 2, j - 1 - (i + 2))});
    i = j;
  }
  if (!lit.empty()) out.push_back({false, lit});
  return out;
}

// Splits "path,default" at the first comma outside ${...}, [...], {...} and quotes.
std::pair<std::string, std::optional<std::string>> split_select(const std::string& args) {
  int depth = 0;
  char quote = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const char c = args[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == ',' && depth == 0) {
      return {trim(args.substr(0, i)), trim(args.substr(i + 1))};
    }
  }
  return {trim(args), std::nullopt};
}

std::string as_text(const Value& v) {
  if (v.kind == Value::Kind::String) return v.s;
  if (v.is_scalar() && !v.s.empty()) return v.s;  // keep "1e-6" as written
  return to_flow_yaml(v);
}

}  // namespace

bool known_path(const Schema& s, const std::string& p) {
  if (s.find(p) || s.is_section(p) || s.free_form_ancestor(p)) return true;
  return s.parent() && known_path(*s.parent(), p);
}

namespace {

class Resolver {
 public:
  Resolver(const Schema& s, const Value& raw) : schema_(s), raw_(raw) {}

  // Resolved value of the node at `path` in the merged tree.
  Result<Value> node(const std::string& path) {
    if (auto it = memo_.find(path); it != memo_.end()) return it->second;
    if (auto it = std::find(stack_.begin(), stack_.end(), path); it != stack_.end()) {
      std::string chain;
      for (; it != stack_.end(); ++it) chain += *it + " -> ";
      return KS_ERR("interpolation cycle: ", chain, path);
    }
    const Value* raw = lookup(raw_, path);
    KS_CHECK(raw, "no config node at ", path);
    stack_.push_back(path);
    Result<Value> r = compute(*raw, path);
    stack_.pop_back();
    if (r.is_ok()) memo_.emplace(path, r.value());
    return r;
  }

  // `v` resolved as though it sat at `path` (v need not be in the tree).
  Result<Value> value(const Value& v, const std::string& path) {
    switch (v.kind) {
      case Value::Kind::String:
        if (v.s.find("${") != std::string::npos) return string(v, path);
        return v;
      case Value::Kind::List: {
        Value out = v;
        for (auto& e : out.list) {
          KS_ASSIGN(e, value(e, path));
        }
        return out;
      }
      case Value::Kind::Map: {
        Value out = v;
        for (auto& [k, e] : out.map) {
          KS_ASSIGN(e, value(e, path.empty() ? k : path + "." + k));
        }
        return out;
      }
      default: return v;
    }
  }

 private:
  Result<Value> compute(const Value& raw, const std::string& path) {
    if (!raw.is_map()) return value(raw, path);
    Value out = Value::empty_map(raw.origin);
    for (const auto& [k, child] : raw.map) {
      KS_ASSIGN(out.at_or_insert(k), node(path.empty() ? k : path + "." + k));
    }
    return out;
  }

  Status fail(const Value& holder, const std::string& path, const std::string& why) {
    return KS_ERR("bad interpolation '", holder.s, "' in config key '", path, "'", from(holder.origin), ": ", why);
  }

  Result<Value> string(const Value& holder, const std::string& path) {
    auto pieces = split_pieces(holder.s);
    if (!pieces.is_ok()) return fail(holder, path, pieces.status().message());
    const auto& ps = pieces.value();
    if (ps.size() == 1 && ps[0].is_expr) return expr(ps[0].text, holder, path);
    std::string out;
    for (const auto& p : ps) {
      if (!p.is_expr) {
        out += p.text;
        continue;
      }
      KS_ASSIGN(Value v, expr(p.text, holder, path));
      out += as_text(v);
    }
    return Value::string(out, holder.origin);
  }

  // "${.x}" is relative to the section holding `path`; each extra dot goes up one level.
  static std::string absolute(const std::string& key, const std::string& path) {
    if (key.empty() || key[0] != '.') return key;
    size_t dots = 0;
    while (dots < key.size() && key[dots] == '.') ++dots;
    auto parts = split_path(path);
    for (size_t i = 0; i < dots && !parts.empty(); ++i) parts.pop_back();
    std::string base;
    for (const auto& p : parts) base += (base.empty() ? "" : ".") + p;
    const std::string rest = key.substr(dots);
    return base.empty() ? rest : base + "." + rest;
  }

  Result<Value> expr(const std::string& e_raw, const Value& holder, const std::string& path) {
    const std::string e = trim(e_raw);
    std::string key = e;
    std::optional<std::string> def;
    bool select = false;
    if (e.rfind("oc.select:", 0) == 0) {
      select = true;
      std::tie(key, def) = split_select(e.substr(10));
    } else if (const size_t colon = e.find(':'); colon != std::string::npos) {
      return fail(holder, path, "unknown resolver '" + e.substr(0, colon) + "' (supported: oc.select)");
    }
    const std::string target = absolute(key, path);
    if (!known_path(schema_, target)) return fail(holder, path, unknown_key_message(target, schema_));
    if (lookup(raw_, target)) {
      KS_ASSIGN(Value v, node(target));
      return v;
    }
    if (!select) return fail(holder, path, "config key '" + target + "' is not set");
    if (!def) return Value::null(holder.origin);
    if (def->find("${") != std::string::npos) return string(Value::string(*def, holder.origin), path);
    auto parsed = parse_override_value(*def, holder.origin);
    if (!parsed.is_ok()) return fail(holder, path, parsed.status().message());
    return parsed;
  }

  const Schema& schema_;
  const Value& raw_;
  std::map<std::string, Value> memo_;
  std::vector<std::string> stack_;
};

void collect(Resolver& r, const Value& raw, const std::string& path, Value& out, std::vector<std::string>& errors,
             std::set<std::string>& seen) {
  if (raw.is_map()) {
    out = Value::empty_map(raw.origin);
    for (const auto& [k, child] : raw.map) collect(r, child, path.empty() ? k : path + "." + k, out.at_or_insert(k), errors, seen);
    return;
  }
  auto v = r.node(path);
  if (v.is_ok()) {
    out = std::move(v).value();
    return;
  }
  out = raw;
  const std::string& msg = v.status().message();
  // A cycle is reported once, not once per member or dependent.
  static const std::string kCycle = "interpolation cycle: ";
  if (msg.rfind(kCycle, 0) == 0) {
    std::vector<std::string> members;
    for (size_t pos = kCycle.size(), arrow; pos <= msg.size(); pos = arrow + 4) {
      arrow = msg.find(" -> ", pos);
      if (arrow == std::string::npos) arrow = msg.size();
      members.push_back(msg.substr(pos, arrow - pos));
    }
    bool known = false;
    for (const auto& m : members) known |= seen.count("cycle:" + m) > 0;
    for (const auto& m : members) seen.insert("cycle:" + m);
    if (known) return;
  }
  if (seen.insert(msg).second) errors.push_back(msg);
}

}  // namespace

Value resolve_all(const Schema& s, const Value& raw, std::vector<std::string>& errors) {
  Resolver r(s, raw);
  Value out;
  std::set<std::string> seen;
  collect(r, raw, "", out, errors, seen);
  return out;
}

Result<Value> resolve_as(const Schema& s, const Value& raw, const Value& v, const std::string& path) {
  Resolver r(s, raw);
  return r.value(v, path);
}

}  // namespace kestrel::config::detail
