// Kestrel's run configuration, in verl's language: verl key names and
// defaults, Hydra-style sources and overrides, OmegaConf-style interpolation.
//
//   built-in defaults (config/schema_*.cpp)
//     <- YAML files (--config FILE, or --config-path DIR --config-name NAME)
//     <- command-line overrides: a.b=v, +a.b=v, ++a.b=v, ~a.b
//   then ${path} / ${oc.select:path,default} are resolved, values are coerced
//   to their declared types and checked (allowed values, support status).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "config/schema.h"
#include "config/value.h"
#include "core/status.h"

namespace kestrel::config {

struct LoadOptions {
  std::vector<std::string> config_files;  // merged in order, later files win
  std::vector<std::string> overrides;     // Hydra syntax, applied after the files
  const Schema* schema = nullptr;         // the command's tree; nullptr = ppo_schema()
};

// Splits command-line arguments into config files and overrides. Understands
// --config FILE, --config=FILE, --config-path/-cp DIR, --config-name/-cn NAME
// (NAME gets ".yaml" unless it has an extension). Arguments starting with "-"
// that are not config flags go to `rest` (or are an error when rest is null).
Result<LoadOptions> options_from_args(const std::vector<std::string>& args, std::vector<std::string>* rest = nullptr);

class Config {
 public:
  // Typed getters. The path must be a declared key of the right type: a wrong
  // path or type is a programming error and throws kestrel::Error. A null
  // value throws too; use is_null() or the *_or() forms for optional keys.
  bool get_bool(const std::string& path) const;
  int64_t get_int(const std::string& path) const;
  double get_float(const std::string& path) const;
  std::string get_string(const std::string& path) const;
  std::vector<int64_t> get_int_list(const std::string& path) const;
  std::vector<double> get_float_list(const std::string& path) const;
  std::vector<std::string> get_string_list(const std::string& path) const;
  nlohmann::ordered_json get_map(const std::string& path) const;  // free-form sections

  int64_t get_int_or(const std::string& path, int64_t if_null) const;
  double get_float_or(const std::string& path, double if_null) const;
  std::string get_string_or(const std::string& path, const std::string& if_null) const;

  bool is_null(const std::string& path) const;
  // Where the value came from: "default", "file.yaml:12", "command line".
  std::string origin(const std::string& path) const;

  // The resolved configuration as YAML (interpolations replaced by values).
  // load() of this text alone gives the same configuration.
  std::string to_yaml() const;

  const Value& tree() const { return root_; }
  const Schema& schema() const { return schema_ ? *schema_ : ppo_schema(); }

  // One line per key of status NoEffect set to a non-default value; the
  // commands print them on stderr (cli/config_load.h).
  const std::vector<std::string>& notices() const { return notices_; }

  // Every key read through a getter or is_null() since load (copies of a
  // Config share the record). tests/cli/consumers_test.cpp builds each
  // command's options and fails for a Supported key nobody read.
  std::set<std::string> reads() const { return *reads_; }

 private:
  friend Result<Config> load(const LoadOptions&);
  const Value& leaf(const std::string& path, std::initializer_list<Type> types) const;
  Value root_;
  const Schema* schema_ = nullptr;
  std::vector<std::string> notices_;
  std::shared_ptr<std::set<std::string>> reads_ = std::make_shared<std::set<std::string>>();
};

Result<Config> load(const LoadOptions& opts);

// Every key: path, type, default, allowed values, status and doc (for `kestrel config docs`).
std::string docs(const Schema& s = ppo_schema());
// The built-in defaults as a commented YAML file, interpolations kept
// (verl comment style: a comment above each field). configs/ppo_trainer.yaml is this text.
std::string defaults_yaml(const Schema& s = ppo_schema());

// Nearest valid keys for a mistyped path, empty when nothing is close:
// verl's renamed keys first (optim.grad_clip -> optim.clip_grad, FSDP <-> Megatron
// names), then typos inside the section the path names, then the right name in
// another section.
std::vector<std::string> suggest_keys(const std::string& path, const Schema& s = ppo_schema());
// Levenshtein distance, for "is this a near miss" checks.
size_t key_edit_distance(std::string_view a, std::string_view b);
// "unknown config key 'x' (did you mean 'y'?)"; in a view, a key of the
// parent tree "does not apply to kestrel generate".
std::string unknown_key_message(const std::string& path, const Schema& s = ppo_schema());

}  // namespace kestrel::config
