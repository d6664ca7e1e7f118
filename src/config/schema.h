// The one declaration of every config key. Parsing, validation, defaults,
// `kestrel config docs` and `kestrel config show` all derive from this table.
//
// Key names and defaults follow verl's ppo_megatron_trainer.yaml. Where verl's
// default asks for something Kestrel does not do (wandb logging, vLLM, CUDA
// graphs, distributed optimizer), the default is what Kestrel does and the doc
// says "verl default: ...".
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::config {

enum class Type { Bool, Int, Float, String, IntList, FloatList, StringList, Map };

// Supported: every valid value works. NotSupportedYet: only the default is
// accepted (the default names what Kestrel does); anything else fails with
// "not supported yet: <key>=<value>". Flip the field when a feature lands.
enum class Support { Supported, NotSupportedYet };

struct KeyDecl {
  std::string path;          // full dotted path, e.g. "actor_rollout_ref.actor.optim.lr"
  Type type;
  std::string default_yaml;  // YAML text: "1024", "null", "[console]", "${data.max_prompt_length}"
  Support status;
  std::string doc;           // one line
  std::vector<std::string> allowed;    // valid values (list types: valid elements); empty = any
  std::vector<std::string> supported;  // subset of `allowed` that works today; empty = all allowed
  // May be added with Hydra's `+key=value` although it already exists
  // (override_transformer_config: verl's yaml does not list these keys).
  bool addable = false;
};

const char* type_name(Type t);

// All keys in declaration order (the order of `config show` and the yaml file).
const std::vector<KeyDecl>& schema();
// nullptr when `path` is not a key.
const KeyDecl* find_key(std::string_view path);
// True for a strict prefix of some key ("actor_rollout_ref.actor.optim").
bool is_section(std::string_view path);
// The Map-typed key at or above `path` (free-form section), or nullptr.
const KeyDecl* free_form_ancestor(std::string_view path);
// Every key path and section path, for suggestions.
const std::vector<std::string>& all_paths();

namespace schema_detail {
// Builders used by the schema_*.cpp declaration files.
class Builder {
 public:
  explicit Builder(std::vector<KeyDecl>& out) : out_(out) {}
  // Keys below are declared relative to `prefix` ("" = root).
  void scope(std::string prefix) { prefix_ = std::move(prefix); }
  const std::string& prefix() const { return prefix_; }
  KeyDecl& k(const std::string& rel, Type t, std::string def, Support s, std::string doc,
             std::vector<std::string> allowed = {}, std::vector<std::string> supported = {});

 private:
  std::vector<KeyDecl>& out_;
  std::string prefix_;
};
void declare_data_and_model(Builder& b);
void declare_actor_ref_critic(Builder& b);
void declare_rollout(Builder& b);
void declare_reward_algorithm_trainer(Builder& b);
}  // namespace schema_detail

}  // namespace kestrel::config
