// Sources and merging: defaults <- YAML files <- Hydra-style overrides.
#include <yaml-cpp/yaml.h>

#include <algorithm>
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

void deep_merge(Value& dst, const Value& src) { detail::merge_values(dst, src); }

// A section given as a copy of another section, as verl's yaml writes it
// (ref.megatron.override_transformer_config:
// ${oc.select:actor_rollout_ref.actor.megatron.override_transformer_config,{}}):
// each key of `path` copies the same key of the other section.
// The section `v` copies when it is "${<section>}" or "${oc.select:<section>,...}"; "" otherwise.
std::string copied_section(const Schema& s, const Value& v) {
  static const std::regex copy_re(R"(^\$\{\s*(?:oc\.select:)?\s*([A-Za-z0-9_.]+)\s*(?:,.*)?\}$)");
  std::smatch m;
  if (v.kind != Value::Kind::String || !std::regex_match(v.s, m, copy_re)) return "";
  return s.is_section(m[1].str()) ? m[1].str() : "";
}

bool copy_section(const Schema& s, Value& tree, const std::string& path, const Value& v) {
  const std::string src = copied_section(s, v);
  if (src.empty()) return false;
  for (const auto& d : s.keys()) {
    if (d.path.rfind(path + ".", 0) != 0) continue;
    const std::string from_key = src + d.path.substr(path.size());
    if (s.find(from_key)) detail::ensure(tree, d.path) = Value::string("${" + from_key + "}", v.origin);
  }
  return true;
}

std::string not_supported_entry(const std::string& path, const Value& v, const std::string& open) {
  return "not supported yet: " + path + "=" + to_flow_yaml(v) + " (Kestrel acts on the keys of " + open +
         " that 'kestrel config docs' lists; this one it does not know)";
}

std::string first_key_under(const Schema& s, const std::string& section) {
  for (const auto& d : s.keys())
    if (d.path.rfind(section + ".", 0) == 0) return d.path;
  return section;
}

// Puts `v` at `path`, which must be the root, a section, a key or an entry of a
// free-form map. Sections merge key by key; free-form maps merge deeply.
void merge_at(const Schema& s, Value& tree, const std::string& path, const Value& v, std::vector<std::string>& errors) {
  // OmegaConf's "???" (mandatory, no value yet: verl's rollout.name) keeps Kestrel's default.
  if (v.kind == Value::Kind::String && !v.quoted && v.s == "???") return;
  if (path.empty() || s.is_section(path)) {
    if (v.is_null()) return;  // "actor:" with nothing below it
    if (!path.empty() && copy_section(s, tree, path, v)) return;
    if (!v.is_map()) {
      errors.push_back(located(v.origin, "config key '" + path + "' is a section, not a value; set one of its keys, e.g. '" +
                                             first_key_under(s, path) + "=...'"));
      return;
    }
    for (const auto& [k, child] : v.map) {
      if (k == "_target_") continue;  // verl names a Python dataclass here; nothing to build in C++
      if (path.empty() && (k == "defaults" || k == "hydra")) continue;  // composed by compose_config
      merge_at(s, tree, join(path, k), child, errors);
    }
    return;
  }
  if (const KeyDecl* d = s.find(path)) {
    // A free-form map given as a copy of a section (verl: the reward model's
    // override_transformer_config follows the actor's) keeps its default.
    if (d->type == Type::Map && v.kind == Value::Kind::String && !copied_section(s, v).empty()) return;
    Value& slot = detail::ensure(tree, path);
    if (d->type == Type::Map && v.is_map() && slot.is_map()) deep_merge(slot, v);
    else slot = v;
    return;
  }
  if (s.free_form_ancestor(path)) {
    deep_merge(detail::ensure(tree, path), v);
    return;
  }
  if (const std::string open = s.open_ancestor(path); !open.empty()) {
    errors.push_back(located(v.origin, not_supported_entry(path, v, open)));
    return;
  }
  errors.push_back(located(v.origin, unknown_key_message(path, s)));
}

Status apply_file(const Schema& s, Value& tree, const std::string& file) {
  KS_ASSIGN(Value v, detail::compose_config(file));
  std::vector<std::string> errors;
  merge_at(s, tree, "", v, errors);
  if (!errors.empty()) {
    std::string msg;
    for (const auto& e : errors) msg += (msg.empty() ? "" : "\n") + e;
    return Status::error(msg);
  }
  return Status::ok();
}

Status apply_override(const Schema& s, Value& tree, const std::string& text, std::vector<std::string>& notices) {
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
  // The tree under a free-form section is as deep as the key path; printing
  // and merging recurse per level, as for YAML files.
  if (std::count(key.begin(), key.end(), '.') >= kMaxYamlDepth)
    return KS_ERR("bad override '", key.substr(0, 80), "...': a key path deeper than ", kMaxYamlDepth, " levels");

  const KeyDecl* d = s.find(key);
  const bool section = s.is_section(key);
  const bool free_entry = !d && !section && s.free_form_ancestor(key);
  if (!d && !section && !free_entry) {
    if (op == Op::Add || op == Op::Force) {
      // `+key=value` asks for a key verl's tree may not have either (recipe
      // code reads it): nothing in Kestrel would read it.
      KS_ASSIGN(Value v, parse_override_value(body.substr(eq + 1), kCommandLine));
      const std::string open = s.open_ancestor(key);
      const auto near = suggest_keys(key, s);
      // A near miss of a key the open section declares is a typo, not a new key.
      if (!open.empty() && !near.empty() && near.front().rfind(open + ".", 0) == 0) {
        const std::string a = key.substr(key.rfind('.') + 1), b = near.front().substr(near.front().rfind('.') + 1);
        if (key_edit_distance(a, b) <= std::max<size_t>(2, a.size() / 4)) return Status::error(unknown_key_message(key, s));
      }
      if (!open.empty()) return Status::error(not_supported_entry(key, v, open));
      return Status::error("not supported yet: " + key + "=" + to_flow_yaml(v) +
                           " (added with '+'; Kestrel has no such key, so nothing would read it" +
                           (near.empty() ? std::string(")") : "; did you mean '" + near.front() + "'?)"));
    }
    return Status::error(unknown_key_message(key, s));
  }
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
  // Hydra refuses both; verl scripts written for an older tree do them
  // (`+fsdp_config.model_dtype=...` once the key exists, `engine_kwargs.sglang.x=...`
  // without '+'). Kestrel sets the value and says so.
  if (op == Op::Add && existing && !(d && d->addable))
    notices.push_back("note: '+" + key + "=...' adds a key that exists (Hydra refuses this); Kestrel sets it as '" +
                      key + "=...'");
  if (op == Op::Set && free_entry && !existing)
    notices.push_back("note: '" + key + "=...' sets a key its map does not have (Hydra wants '+" + key +
                      "=...'); Kestrel adds it");
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
    std::string file = (cfg_path.empty() ? std::string("configs") : cfg_path) + "/" + cfg_name;
    // verl scripts name verl's trees (--config-path=config next to the script,
    // --config-name=ppo_megatron_trainer): without such a file, the built-in tree.
    const std::string stem = std::filesystem::path(cfg_name).stem().string();
    std::error_code ec;
    if (!std::filesystem::exists(file, ec) && detail::is_builtin_config_name(stem))
      file = detail::builtin_config_file(stem);
    // The primary config (Hydra's one file) comes first; --config files layer on top.
    o.config_files.insert(o.config_files.begin(), file);
  }
  return o;
}

Result<Config> load(const LoadOptions& opts) {
  const Schema& s = opts.schema ? *opts.schema : ppo_schema();
  Value raw = detail::default_tree(s);
  for (const auto& f : opts.config_files) KS_TRY(apply_file(s, raw, f));
  std::vector<std::string> errors, notices;
  for (const auto& o : opts.overrides) {
    Status st = apply_override(s, raw, o, notices);
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
