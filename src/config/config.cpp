// Config getters, `config show` (to_yaml), `config docs` and the defaults file.
#include "config/config.h"

#include <algorithm>

#include "config/internal.h"

namespace kestrel::config {

const Value& Config::leaf(const std::string& path, std::initializer_list<Type> types) const {
  const KeyDecl* d = schema().find(path);
  if (!d) KS_FAIL("Config: no config key '", path, "' (a programming error; ", unknown_key_message(path, schema()), ")");
  if (std::find(types.begin(), types.end(), d->type) == types.end())
    KS_FAIL("Config: config key '", path, "' is a ", type_name(d->type), "; use the matching getter");
  const Value* v = detail::lookup(root_, path);
  KS_CHECK(v, "config value missing for declared key ", path);
  reads_->insert(path);
  return *v;
}

namespace {
[[noreturn]] void null_value(const std::string& path) {
  KS_FAIL("config key '", path, "' is null; set it (e.g. ", path, "=...) or read it with a *_or getter");
}
}  // namespace

bool Config::get_bool(const std::string& path) const {
  const Value& v = leaf(path, {Type::Bool});
  if (v.is_null()) null_value(path);
  return v.b;
}

int64_t Config::get_int(const std::string& path) const {
  const Value& v = leaf(path, {Type::Int});
  if (v.is_null()) null_value(path);
  return v.i;
}

double Config::get_float(const std::string& path) const {
  const Value& v = leaf(path, {Type::Float});
  if (v.is_null()) null_value(path);
  return v.f;
}

std::string Config::get_string(const std::string& path) const {
  const Value& v = leaf(path, {Type::String});
  if (v.is_null()) null_value(path);
  return v.s;
}

std::vector<int64_t> Config::get_int_list(const std::string& path) const {
  const Value& v = leaf(path, {Type::IntList});
  if (v.is_null()) null_value(path);
  std::vector<int64_t> out;
  for (const auto& e : v.list) out.push_back(e.i);
  return out;
}

std::vector<double> Config::get_float_list(const std::string& path) const {
  const Value& v = leaf(path, {Type::FloatList});
  if (v.is_null()) null_value(path);
  std::vector<double> out;
  for (const auto& e : v.list) out.push_back(e.f);
  return out;
}

std::vector<std::string> Config::get_string_list(const std::string& path) const {
  const Value& v = leaf(path, {Type::StringList});
  if (v.is_null()) null_value(path);
  std::vector<std::string> out;
  for (const auto& e : v.list) out.push_back(e.s);
  return out;
}

namespace {
nlohmann::ordered_json to_json(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Null: return nullptr;
    case Value::Kind::Bool: return v.b;
    case Value::Kind::Int: return v.i;
    case Value::Kind::Float: return v.f;
    case Value::Kind::String: return v.s;
    case Value::Kind::List: {
      auto a = nlohmann::ordered_json::array();
      for (const auto& e : v.list) a.push_back(to_json(e));
      return a;
    }
    case Value::Kind::Map: {
      auto o = nlohmann::ordered_json::object();
      for (const auto& [k, e] : v.map) o[k] = to_json(e);
      return o;
    }
  }
  return nullptr;
}
}  // namespace

nlohmann::ordered_json Config::get_map(const std::string& path) const { return to_json(leaf(path, {Type::Map})); }

int64_t Config::get_int_or(const std::string& path, int64_t if_null) const {
  const Value& v = leaf(path, {Type::Int});
  return v.is_null() ? if_null : v.i;
}

double Config::get_float_or(const std::string& path, double if_null) const {
  const Value& v = leaf(path, {Type::Float});
  return v.is_null() ? if_null : v.f;
}

std::string Config::get_string_or(const std::string& path, const std::string& if_null) const {
  const Value& v = leaf(path, {Type::String});
  return v.is_null() ? if_null : v.s;
}

bool Config::is_null(const std::string& path) const {
  const KeyDecl* d = schema().find(path);
  return leaf(path, {d ? d->type : Type::Bool}).is_null();
}

std::string Config::origin(const std::string& path) const {
  // Not a read: error messages name where a value came from.
  const Value* v = schema().find(path) ? detail::lookup(root_, path) : nullptr;
  if (!v) KS_FAIL("Config: no config key '", path, "' (a programming error)");
  return v->origin;
}

namespace {
// Resolved strings are final: a literal "${" must not interpolate when read back.
void escape_interpolation(Value& v) {
  if (v.kind == Value::Kind::String) {
    for (size_t pos = 0; (pos = v.s.find("${", pos)) != std::string::npos; pos += 3) v.s.insert(pos, "\\");
  }
  for (auto& e : v.list) escape_interpolation(e);
  for (auto& [k, e] : v.map) escape_interpolation(e);
}
}  // namespace

std::string Config::to_yaml() const {
  std::string out = "# Kestrel config, resolved (kestrel config show). Loads back as-is with --config.\n";
  Value escaped = root_;
  escape_interpolation(escaped);
  emit_block_yaml(escaped, 0, out);
  return out;
}

std::string docs(const Schema& s) {
  std::string out = "Kestrel configuration keys of " + s.command() + " (" + s.name() +
                    "): verl's names and defaults (kestrel config docs " + s.name() + ").\n"
      "Set them in a YAML file (--config FILE) or on the command line: key=value, +key=value, ++key=value, ~key.\n"
      "Status 'not supported yet': only the default value is accepted.\n"
      "Status 'no effect in Kestrel': verl's key, accepted, changes nothing here (the doc says why).\n";
  if (s.parent())
    out += "The keys of " + s.parent()->command() + " that apply to " + s.command() + "; the others are refused.\n";
  std::string section;
  for (const auto& d : s.keys()) {
    const std::string top = d.path.substr(0, d.path.find('.'));
    if (top != section) out += "\n## " + (section = top) + "\n";
    out += "\n" + d.path + "\n";
    out += "    " + std::string(type_name(d.type)) + ", default " + d.default_yaml + ", " +
           support_name(d.status) + "\n";
    out += "    " + d.doc + "\n";
    if (d.range) out += "    valid: " + d.range->describe() + "\n";
    if (!d.allowed.empty()) {
      out += "    allowed:";
      for (const auto& a : d.allowed) out += " " + a;
      if (!d.supported.empty()) {
        out += "; supported:";
        for (const auto& s : d.supported) out += " " + s;
      }
      out += "\n";
    }
  }
  return out;
}

namespace {
// Block YAML of the default tree with each key's doc as a comment above it.
void emit_commented(const Schema& s, const Value& map, const std::string& path, int indent, std::string& out) {
  for (const auto& [k, v] : map.map) {
    const std::string p = path.empty() ? k : path + "." + k;
    const std::string pad(indent, ' ');
    if (const KeyDecl* d = s.find(p)) {
      out += pad + "# " + d->doc + "\n";
      if (!d->allowed.empty()) {
        out += pad + "# one of:";
        for (const auto& a : d->allowed) out += " " + a;
        if (!d->supported.empty()) {
          out += " (supported:";
          for (const auto& s : d->supported) out += " " + s;
          out += ")";
        }
        out += "\n";
      }
      if (d->status == Support::NotSupportedYet) out += pad + "# not supported yet: only this default works\n";
      if (d->status == Support::NoEffect) out += pad + "# no effect in Kestrel\n";
      out += pad + k + ": " + to_flow_yaml(v) + "\n\n";
    } else {
      if (indent == 0) out += "\n";
      out += pad + k + ":\n";
      emit_commented(s, v, p, indent + 2, out);
    }
  }
}
}  // namespace

std::string defaults_yaml(const Schema& s) {
  if (&s != &ppo_schema()) {
    std::string out = "# Kestrel " + s.command() + " config (" + s.name() +
                      "): generated from src/config/schema_*.cpp (kestrel config defaults " + s.name() + ").\n";
    emit_commented(s, detail::default_tree(s), "", 0, out);
    return out;
  }
  std::string out =
      "# Kestrel PPO/GRPO trainer config: the keys of verl's two trees (ppo_trainer.yaml, FSDP, and\n"
      "# ppo_megatron_trainer.yaml) with the Megatron tree's defaults.\n"
      "# Generated from src/config/schema_*.cpp; edit the schema, then regenerate with\n"
      "#   kestrel config defaults > configs/ppo_trainer.yaml   (or: KESTREL_UPDATE_GOLDEN=1 test_config\n"
      "#   --gtest_filter=ConfigYaml.ShippedDefaultsFileMatchesSchema)\n"
      "# Use: kestrel train --config-path=configs --config-name=ppo_trainer key=value ...\n";
  emit_commented(s, detail::default_tree(s), "", 0, out);
  return out;
}

}  // namespace kestrel::config
