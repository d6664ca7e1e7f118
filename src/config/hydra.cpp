// Hydra's config composition as verl scripts use it: a primary YAML file with
// a `defaults:` list (config groups `group@package: option`, relative groups
// `../engine@fsdp_config: fsdp`, plain configs `ppo_trainer`, `_self_`), the
// `hydra.searchpath` it extends, and verl's two trees by name (ppo_trainer,
// ppo_megatron_trainer) when no such file is there: Kestrel's built-in tree.
#include <yaml-cpp/yaml.h>

#include <filesystem>

#include "config/internal.h"

namespace kestrel::config::detail {

namespace {

namespace fs = std::filesystem;

constexpr const char* kBuiltinPrefix = "builtin:";

// verl's FSDP tree (ppo_trainer.yaml) differs from its Megatron tree, whose
// defaults Kestrel's table has, in these keys only (the backend names, the
// optimizer's spelling; reward_model.strategy too, for a reward model Kestrel
// does not build): none of them changes what Kestrel runs, and `config show`
// of an FSDP script then reads as verl's would.
const char* const kFsdpDefaults[] = {
    "actor_rollout_ref.actor.strategy=fsdp",
    "critic.strategy=fsdp",
    "actor_rollout_ref.actor.optim.optimizer=AdamW",
    "critic.optim.optimizer=AdamW",
};

std::string join_pkg(const std::string& a, const std::string& b) {
  if (b == "_global_") return "";
  if (b.rfind("_global_.", 0) == 0) return b.substr(9);
  return a.empty() ? b : b.empty() ? a : a + "." + b;
}

// `sub` placed at `pkg` of an otherwise empty tree.
Value at_package(const Value& sub, const std::string& pkg) {
  if (pkg.empty()) return sub;
  Value w = Value::empty_map(sub.origin);
  ensure(w, pkg) = sub;
  return w;
}

Result<Value> read_yaml(const std::string& file) {
  YAML::Node node;
  try {
    node = YAML::LoadFile(file);
  } catch (const YAML::Exception& e) {
    return KS_ERR(file, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML parse error: ", e.msg);
  }
  KS_ASSIGN(Value v, from_yaml(node, file, 1));
  if (v.is_null()) return Value::empty_map(file + ":1");
  if (!v.is_map()) return KS_ERR(file, ": a config file must be a YAML mapping of sections (data:, trainer:, ...)");
  return v;
}

// A search-path entry: a folder, or "" for verl's own config package
// (pkg://verl/trainer/config, or file://verl/trainer/config that is not here),
// which Kestrel's built-in tree stands for.
std::string search_dir(const std::string& entry, const fs::path& base) {
  std::string e = entry;
  const bool pkg = e.rfind("pkg://", 0) == 0;
  if (pkg || e.rfind("file://", 0) == 0) e = e.substr(pkg ? 6 : 7);
  for (char& c : e)
    if (pkg && c == '.') c = '/';
  if (!pkg) {
    std::error_code ec;
    for (const fs::path& p : {fs::path(e), base / e})
      if (fs::is_directory(p, ec)) return p.string();
  }
  return "";
}

struct Composer {
  std::vector<std::string> search;  // folders after the primary's own ("" = built-in)

  // The config `name` (no extension) relative to `dir`, then the search path;
  // "builtin:<stem>" for verl's tree names found nowhere; "" when missing.
  std::string find(const fs::path& dir, const std::string& name) const {
    std::error_code ec;
    std::vector<fs::path> dirs = {dir};
    for (const auto& s : search)
      if (!s.empty()) dirs.emplace_back(s);
    for (const auto& d : dirs) {
      const fs::path p = (d / (name + ".yaml")).lexically_normal();
      if (fs::is_regular_file(p, ec)) return p.string();
    }
    const std::string stem = fs::path(name).filename().string();
    return is_builtin_config_name(stem) ? kBuiltinPrefix + stem : "";
  }

  // `file` composed at package `pkg`: its defaults in order, its own content
  // at `_self_` (last when the list does not name it), later entries winning.
  Result<Value> compose(const std::string& file, const std::string& pkg, int depth) {
    if (depth > 32) return KS_ERR(file, ": Hydra defaults nest more than 32 deep (a cycle?)");
    if (file.rfind(kBuiltinPrefix, 0) == 0) return at_package(builtin_tree(file.substr(8)), pkg);
    KS_ASSIGN(Value v, read_yaml(file));
    const fs::path dir = fs::path(file).parent_path();
    if (depth == 0) {
      if (const Value* h = v.find("hydra"); h && h->is_map())
        if (const Value* sp = h->find("searchpath"); sp && sp->is_list())
          for (const auto& e : sp->list) search.push_back(search_dir(e.s, dir));
      v.erase("hydra");
    }
    Value defaults;
    if (const Value* d = v.find("defaults")) defaults = *d;
    v.erase("defaults");
    if (!defaults.is_null() && !defaults.is_list())
      return KS_ERR(defaults.origin, ": Hydra 'defaults' must be a list");
    Value out = Value::empty_map(v.origin);
    bool self_done = false;
    for (const Value& e : defaults.list) {
      std::string name, target;
      if (e.kind == Value::Kind::String) {
        if (e.s == "_self_") {
          merge_values(out, at_package(v, pkg));
          self_done = true;
          continue;
        }
        const size_t at = e.s.find('@');
        name = e.s.substr(0, at);
        target = at == std::string::npos ? pkg : join_pkg(pkg, e.s.substr(at + 1));
      } else if (e.is_map() && e.map.size() == 1) {
        std::string group = e.map[0].first;
        for (const char* word : {"optional ", "override "})
          if (group.rfind(word, 0) == 0) group = group.substr(std::string(word).size());
        const Value& option = e.map[0].second;
        if (option.is_null()) continue;  // `group: null` selects nothing
        if (option.kind != Value::Kind::String)
          return KS_ERR(e.origin, ": Hydra defaults entry '", group, "' needs a config name");
        const size_t at = group.find('@');
        std::string g = group.substr(0, at);
        name = g + "/" + option.s;
        while (g.rfind("../", 0) == 0) g = g.substr(3);
        for (char& c : g)
          if (c == '/') c = '.';
        target = at == std::string::npos ? join_pkg(pkg, g) : join_pkg(pkg, group.substr(at + 1));
      } else {
        return KS_ERR(e.origin, ": Hydra defaults entry must be a name or 'group@package: option'");
      }
      const std::string found = find(dir, name);
      if (found.empty())
        return KS_ERR(e.origin, ": Hydra defaults entry '", name, "': no ", name, ".yaml in ", dir.string(),
                      search.empty() ? "" : " or the hydra.searchpath", " (built-in trees: ppo_trainer, ppo_megatron_trainer, dapo_trainer, dapo_megatron_trainer, dapo_transfer_queue_trainer)");
      KS_ASSIGN(Value sub, compose(found, target, depth + 1));
      merge_values(out, sub);
    }
    if (!self_done) merge_values(out, at_package(v, pkg));
    return out;
  }
};

}  // namespace

void merge_values(Value& dst, const Value& src) {
  if (!dst.is_map() || !src.is_map()) {
    dst = src;
    return;
  }
  for (const auto& [k, v] : src.map) merge_values(dst.at_or_insert(k), v);
  dst.origin = src.origin;
}

// The DAPO recipe's trees (verl-recipe dapo/config/dapo_trainer.yaml,
// dapo_megatron_trainer.yaml, dapo_transfer_queue/config/...): verl's tree plus
// the recipe's defaults, which Kestrel's table declares; a recipe script that
// passes --config-path=config without the recipe folder gets them built in.
struct RecipeTree {
  const char* stem;
  const char* base;                       // the verl tree it extends
  std::vector<const char*> defaults;      // the recipe yaml's own settings, as overrides
};

const std::vector<RecipeTree>& recipe_trees() {
  static const std::vector<RecipeTree> t = {
      {"dapo_trainer", "ppo_trainer", {"reward.reward_manager.name=dapo", "trainer.project_name=verl-dapo"}},
      {"dapo_megatron_trainer", "ppo_megatron_trainer",
       {"reward.reward_manager.name=dapo", "trainer.project_name=verl-dapo"}},
      {"dapo_transfer_queue_trainer", "ppo_megatron_trainer",
       {"reward_model.reward_manager=dapo", "trainer.project_name=verl-dapo-transferqueue"}},
  };
  return t;
}

bool is_builtin_config_name(const std::string& stem) {
  if (stem == "ppo_trainer" || stem == "ppo_megatron_trainer") return true;
  for (const auto& r : recipe_trees())
    if (stem == r.stem) return true;
  return false;
}

namespace {
void apply_defaults(Value& t, const std::vector<const char*>& defaults, const std::string& origin) {
  for (const char* o : defaults) {
    const std::string s = o;
    const size_t eq = s.find('=');
    auto v = parse_override_value(s.substr(eq + 1), origin);
    KS_CHECK(v.is_ok(), "bad built-in default ", s);
    ensure(t, s.substr(0, eq)) = std::move(v).value();
  }
}
}  // namespace

Value builtin_tree(const std::string& stem) {
  for (const auto& r : recipe_trees()) {
    if (stem != r.stem) continue;
    Value t = builtin_tree(r.base);
    t.origin = "built-in " + stem;
    apply_defaults(t, r.defaults, "built-in " + stem + " (the DAPO recipe's defaults)");
    return t;
  }
  Value t = Value::empty_map("built-in " + stem);
  if (stem != "ppo_trainer") return t;  // ppo_megatron_trainer: the table's own defaults
  apply_defaults(t, std::vector<const char*>(std::begin(kFsdpDefaults), std::end(kFsdpDefaults)),
                 "built-in ppo_trainer (verl's FSDP defaults)");
  return t;
}

Result<Value> compose_config(const std::string& file) {
  if (file.rfind(kBuiltinPrefix, 0) == 0) return builtin_tree(file.substr(8));
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return KS_ERR("config file not found: ", file);
  Composer c;
  return c.compose(file, "", 0);
}

std::string builtin_config_file(const std::string& stem) { return kBuiltinPrefix + stem; }

}  // namespace kestrel::config::detail
