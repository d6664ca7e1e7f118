// Pieces shared by the config layer's .cpp files; not part of the public API.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "config/schema.h"
#include "config/value.h"
#include "core/status.h"

namespace kestrel::config::detail {

inline constexpr const char* kDefaultOrigin = "default";
inline constexpr const char* kCommandLine = "command line";

std::vector<std::string> split_path(std::string_view path);
// nullptr when any component is missing or not a map.
const Value* lookup(const Value& root, std::string_view path);
Value* lookup(Value& root, std::string_view path);
// Creates missing maps along the way (replacing non-map values).
Value& ensure(Value& root, std::string_view path);

// The schema's defaults as a tree, interpolations unresolved.
const Value& default_tree(const Schema& s);
// A declared default parsed from its YAML text.
Value parse_default(const KeyDecl& d);
// A path interpolations may name: a key, section or free-form entry of `s`,
// or (in a view) of its parent tree, where oc.select falls back to its default.
bool known_path(const Schema& s, const std::string& p);

// Deep merge (maps key by key, anything else replaces); dst takes src's origin.
void merge_values(Value& dst, const Value& src);

// Hydra composition (hydra.cpp). verl's tree names a --config-name or a
// defaults entry may give without a file: ppo_trainer, ppo_megatron_trainer.
bool is_builtin_config_name(const std::string& stem);
// "builtin:<stem>", the config file name that stands for Kestrel's built-in tree.
std::string builtin_config_file(const std::string& stem);
// The values the built-in tree `stem` sets over the table's defaults (verl's
// FSDP tree: strategy=fsdp ...; the Megatron tree: none).
Value builtin_tree(const std::string& stem);
// A YAML file (or "builtin:<stem>") with its Hydra defaults list composed:
// the whole tree from the root, `hydra:` and `defaults:` consumed.
Result<Value> compose_config(const std::string& file);

// "(from X)" suffix for messages.
std::string from(const std::string& origin);

// Resolves every ${...} in `raw`. Errors are appended to `errors`.
Value resolve_all(const Schema& s, const Value& raw, std::vector<std::string>& errors);
// Resolves `v` as if it were the value at `path` of `raw` (for comparing a
// value with its declared default, which may itself interpolate).
Result<Value> resolve_as(const Schema& s, const Value& raw, const Value& v, const std::string& path);

// Coerces `resolved` in place to the declared types and checks allowed values
// and support status; `raw` tells which values the user set.
// Each key of status NoEffect set to a value other than its default adds a
// line to `notices`.
void validate(const Schema& s, Value& resolved, const Value& raw, std::vector<std::string>& errors,
              std::vector<std::string>& notices);

}  // namespace kestrel::config::detail
