// Sources and merging: defaults <- YAML files <- Hydra-style overrides.
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>

#include "config/config.h"
#include "config/internal.h"

namespace kestrel::config {

namespace detail {

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> out;
  if (path.empty()) return out;
  size_t start = 0;
  for (size_t dot; (dot = path.find('.', start)) != std::string_view::npos; start = dot + 1)
    out.emplace_back(path.substr(start, dot - start));
  out.emplace_back(path.substr(start));
  return out;
}

const Value* lookup(const Value& root, std::string_view path) {
  const Value* v = &root;
  for (const auto& part : split_path(path)) {
    if (!v->is_map()) return nullptr;
    v = v->find(part);
    if (!v) return nullptr;
  }
  return v;
}

Value* lookup(Value& root, std::string_view path) {
  return const_cast<Value*>(lookup(static_cast<const Value&>(root), path));
}

Value& ensure(Value& root, std::string_view path) {
  Value* v = &root;
  for (const auto& part : split_path(path)) {
    if (!v->is_map()) {
      const std::string o = v->origin;
      *v = Value::empty_map(o);
    }
    v = &v->at_or_insert(part);
  }
  return *v;
}

Value parse_default(const KeyDecl& d) {
  auto r = parse_override_value(d.default_yaml, kDefaultOrigin);
  KS_CHECK(r.is_ok(), "bad default for config key ", d.path, ": ", r.status().message());
  Value v = std::move(r).value();
  if (d.type == Type::Map && v.is_null()) v = Value::empty_map(kDefaultOrigin);
  return v;
}

const Value& default_tree(const Schema& s) {
  static std::mutex mu;
  static std::map<const Schema*, Value> trees;
  std::lock_guard<std::mutex> lock(mu);
  auto it = trees.find(&s);
  if (it != trees.end()) return it->second;
  Value root = Value::empty_map(kDefaultOrigin);
  for (const auto& d : s.keys()) ensure(root, d.path) = parse_default(d);
  return trees.emplace(&s, std::move(root)).first->second;
}

std::string from(const std::string& origin) { return " (from " + origin + ")"; }

}  // namespace detail

namespace {

using detail::kCommandLine;

std::string join(const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; }

// Messages about a YAML entry start with its location; command-line ones stand alone.
std::string located(const std::string& origin, const std::string& msg) {
  return origin == kCommandLine ? msg : origin + ": " + msg;
}

void deep_merge(Value& dst, const Value& src) {
  if (!dst.is_map() || !src.is_map()) {
    dst = src;
    return;
  }
  for (const auto& [k, v] : src.map) deep_merge(dst.at_or_insert(k), v);
  dst.origin = src.origin;
}

std::string first_key_under(const Schema& s, const std::string& section) {
  for (const auto& d : s.keys())
    if (d.path.rfind(section + ".", 0) == 0) return d.path;
  return section;
}

// Puts `v` at `path`, which must be the root, a section, a key or an entry of a
// free-form map. Sections merge key by key; free-form maps merge deeply.
void merge_at(const Schema& s, Value& tree, const std::string& path, const Value& v, std::vector<std::string>& errors) {
  if (path.empty() || s.is_section(path)) {
    if (v.is_null()) return;  // "actor:" with nothing below it
    if (!v.is_map()) {
      errors.push_back(located(v.origin, "config key '" + path + "' is a section, not a value; set one of its keys, e.g. '" +
                                             first_key_under(s, path) + "=...'"));
      return;
    }
    for (const auto& [k, child] : v.map) {
      if (k == "_target_") continue;  // verl names a Python dataclass here; nothing to build in C++
      if (path.empty() && k == "defaults") {
        errors.push_back(located(child.origin, "Hydra 'defaults' lists are not supported yet; merge the files into one "
                                               "or pass several --config FILE options"));
        continue;
      }
      merge_at(s, tree, join(path, k), child, errors);
    }
    return;
  }
  if (const KeyDecl* d = s.find(path)) {
    Value& slot = detail::ensure(tree, path);
    if (d->type == Type::Map && v.is_map() && slot.is_map()) deep_merge(slot, v);
    else slot = v;
    return;
  }
  if (s.free_form_ancestor(path)) {
    deep_merge(detail::ensure(tree, path), v);
    return;
  }
  errors.push_back(located(v.origin, unknown_key_message(path, s)));
}

Status apply_file(const Schema& s, Value& tree, const std::string& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return KS_ERR("config file not found: ", file);
  YAML::Node node;
  try {
    node = YAML::LoadFile(file);
  } catch (const YAML::Exception& e) {
    return KS_ERR(file, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML parse error: ", e.msg);
  }
  Value v = from_yaml(node, file, 1);
  if (!v.is_null() && !v.is_map())
    return KS_ERR(file, ": a config file must be a YAML mapping of sections (data:, trainer:, ...)");
  std::vector<std::string> errors;
  merge_at(s, tree, "", v, errors);
  if (!errors.empty()) {
    std::string msg;
    for (const auto& e : errors) msg += (msg.empty() ? "" : "\n") + e;
    return Status::error(msg);
  }
  return Status::ok();
}

Status apply_override(const Schema& s, Value& tree, const std::string& text) {
  static const std::regex key_re(R"([A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)*)");
  enum class Op { Set, Add, Force, Delete } op = Op::Set;
  std::string body = text;
  if (body.rfind("++", 0) == 0) op = Op::Force, body = body.substr(2);
  else if (body.rfind("+", 0) == 0) op = Op::Add, body = body.substr(1);
  else if (body.rfind("~", 0) == 0) op = Op::Delete, body = body.substr(1);
  const size_t eq = body.find('=');
  const std::string key = body.substr(0, eq);
  if (!std::regex_match(key, key_re) || (op != Op::Delete && eq == std::string::npos) ||
      (op == Op::Delete && eq != std::string::npos))
    return KS_ERR("bad override '", text, "': expected key=value, +key=value, ++key=value or ~key");

  const KeyDecl* d = s.find(key);
  const bool section = s.is_section(key);
  const bool free_entry = !d && !section && s.free_form_ancestor(key);
  if (!d && !section && !free_entry) return Status::error(unknown_key_message(key, s));
  const Value* existing = detail::lookup(tree, key);

  if (op == Op::Delete) {
    if (free_entry) {
      if (!existing) return KS_ERR("cannot delete config key '", key, "': it is not set");
      const size_t dot = key.rfind('.');
      detail::lookup(tree, key.substr(0, dot))->erase(key.substr(dot + 1));
    } else {
      // A declared key (or section) cannot vanish: deleting restores the default.
      detail::ensure(tree, key) = *detail::lookup(detail::default_tree(s), key);
    }
    return Status::ok();
  }

  KS_ASSIGN(Value v, parse_override_value(body.substr(eq + 1), kCommandLine));
  if (op == Op::Add && existing && !(d && d->addable))
    return KS_ERR("cannot add config key '", key, "': it already exists; use '", key, "=...' to override it or '++", key,
                  "=...' to add or override");
  if (op == Op::Set && free_entry && !existing)
    return KS_ERR("config key '", key, "' is not set; use '+", key, "=...' to add it");
  std::vector<std::string> errors;
  if (d && d->type == Type::Map) detail::ensure(tree, key) = v;  // `map=...` replaces the whole map
  else merge_at(s, tree, key, v, errors);
  if (free_entry) detail::lookup(tree, s.free_form_ancestor(key)->path)->origin = kCommandLine;
  if (!errors.empty()) return Status::error(errors.front());
  return Status::ok();
}

}  // namespace

Result<LoadOptions> options_from_args(const std::vector<std::string>& args, std::vector<std::string>* rest) {
  LoadOptions o;
  std::string cfg_path, cfg_name;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    // "--flag=value" or "--flag value"
    auto take = [&](const char* flag, const char* short_flag, std::string* out) -> Result<bool> {
      for (const char* f : {flag, short_flag}) {
        if (!f) continue;
        const std::string fs = f;
        if (a == fs) {
          if (i + 1 >= args.size()) return KS_ERR(fs, " needs a value");
          *out = args[++i];
          return true;
        }
        if (a.rfind(fs + "=", 0) == 0) {
          *out = a.substr(fs.size() + 1);
          return true;
        }
      }
      return false;
    };
    std::string file;
    KS_ASSIGN(bool is_config, take("--config", nullptr, &file));
    if (is_config) {
      o.config_files.push_back(file);
      continue;
    }
    KS_ASSIGN(bool is_path, take("--config-path", "-cp", &cfg_path));
    if (is_path) continue;
    KS_ASSIGN(bool is_name, take("--config-name", "-cn", &cfg_name));
    if (is_name) continue;
    if (!a.empty() && a[0] == '-') {
      if (!rest) return KS_ERR("unknown option '", a, "' (config options: --config FILE, --config-path DIR, --config-name NAME)");
      rest->push_back(a);
      continue;
    }
    o.overrides.push_back(a);
  }
  if (!cfg_path.empty() && cfg_name.empty())
    return KS_ERR("--config-path ", cfg_path, " needs --config-name NAME (the YAML file inside it)");
  if (!cfg_name.empty()) {
    if (std::filesystem::path(cfg_name).extension().empty()) cfg_name += ".yaml";
    // The primary config (Hydra's one file) comes first; --config files layer on top.
    o.config_files.insert(o.config_files.begin(), (cfg_path.empty() ? std::string("configs") : cfg_path) + "/" + cfg_name);
  }
  return o;
}

Result<Config> load(const LoadOptions& opts) {
  const Schema& s = opts.schema ? *opts.schema : ppo_schema();
  Value raw = detail::default_tree(s);
  for (const auto& f : opts.config_files) KS_TRY(apply_file(s, raw, f));
  std::vector<std::string> errors, notices;
  for (const auto& o : opts.overrides) {
    Status st = apply_override(s, raw, o);
    if (!st.is_ok()) errors.push_back(st.message());
  }
  // Bad overrides were skipped; still check the rest so one run reports everything.
  // (Values left unresolved by a bad interpolation would only add type errors.)
  const size_t override_errors = errors.size();
  Value resolved = detail::resolve_all(s, raw, errors);
  if (errors.size() == override_errors) detail::validate(s, resolved, raw, errors, notices);
  if (errors.empty()) {
    Config c;
    c.schema_ = &s;
    c.root_ = std::move(resolved);
    c.notices_ = std::move(notices);
    return c;
  }
  std::string msg;
  for (const auto& e : errors) msg += (msg.empty() ? "" : "\n") + e;
  return Status::error(msg);
}

}  // namespace kestrel::config
