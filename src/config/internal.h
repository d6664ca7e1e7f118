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
