// The one declaration of every config key. Parsing, validation, defaults,
// `kestrel config docs` and `kestrel config show` all derive from this table.
//
// The PPO tree is the union of verl's two generated trees (FSDP
// _generated_ppo_trainer.yaml and Megatron _generated_ppo_megatron_trainer.yaml;
// Kestrel has one engine, so fsdp_config.* and megatron.* both describe it),
// with the Megatron tree's defaults; --config-name=ppo_trainer applies the FSDP
// tree's where they differ (config/hydra.cpp). Where verl's default asks for
// something Kestrel does not do (wandb logging, vLLM, CUDA graphs, distributed
// optimizer), the default is what Kestrel does and the doc says "verl default: ...".
#pragma once
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kestrel::config {

enum class Type { Bool, Int, Float, String, IntList, FloatList, StringList, Map };

// Supported: every valid value works, and code reads the key and acts on it
// (tests/cli/consumers_test.cpp fails for a Supported key nothing reads).
// NotSupportedYet: only the default is accepted (the default names what
// Kestrel does); anything else fails with "not supported yet: <key>=<value>".
// Flip the field when a feature lands.
// NoEffect: verl has the key, Kestrel has nothing it would change (the doc
// says why: no Ray, no torch.compile, ...). Any valid value is accepted; a
// non-default one prints a one-line notice on stderr.
enum class Support { Supported, NotSupportedYet, NoEffect };
const char* support_name(Support s);  // "supported", "not supported yet", "no effect in Kestrel"

// The valid range of a numeric key (Int, Float, and each element of IntList /
// FloatList), declared on the key's line: `b.k(...).at_least(1)`. Checked by
// config/validate.cpp for every source (files, overrides, defaults), so
// `config show`, `train` and `sft` refuse the same values. A Float is always
// finite (nan/inf refused) unless `allow_inf` says otherwise. `also` lists
// sentinel values outside the range (-1 = "all", "never", "fill in").
struct Range {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_inclusive = true, max_inclusive = true;
  std::vector<double> also;
  bool contains(double x) const;
  std::string describe() const;  // "in [0, 1]", ">= 1", "in (0, 1]", "> 0 or -1"
};

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
  // null is a valid value although the default is not null (data.val_files=null: no validation).
  bool nullable = false;
  // Values (flow YAML, e.g. "true", "1", "safetensors") that mean what Kestrel
  // does although they are not the default: a NotSupportedYet key accepts them
  // like its default, a NoEffect key without a notice
  // (override_transformer_config.use_flash_attn=true: Kestrel's attention is
  // always fused; expert_tensor_parallel_size=1).
  std::vector<std::string> as_default;
  // Values (list keys: elements) accepted with a one-line notice saying what
  // Kestrel does instead (rollout.name=vllm runs the built-in engine;
  // trainer.logger's wandb goes to console, JSONL and TensorBoard).
  std::vector<std::pair<std::string, std::string>> noted;
  // Numeric keys: the valid range (nullopt: any finite value; a Supported key
  // without a range must be `unbounded` with the reason, tests/config/range_test.cpp).
  std::optional<Range> range;
  std::string unbounded;  // why any finite value is valid (seeds, signed offsets)

  // Declaration helpers, chained on the declaring line.
  KeyDecl& in(double lo, double hi, bool lo_inclusive = true, bool hi_inclusive = true);
  KeyDecl& at_least(double lo) { return in(lo, std::numeric_limits<double>::infinity()); }
  KeyDecl& above(double lo) { return in(lo, std::numeric_limits<double>::infinity(), false); }
  // An extra valid value outside the range (a sentinel such as -1); after in/at_least/above.
  KeyDecl& or_value(double v);
  KeyDecl& any_value(std::string why) {
    unbounded = std::move(why);
    return *this;
  }
};

const char* type_name(Type t);

// One command tree's keys. Each tree has one table: verl's PPO trainer tree
// (ppo_megatron_trainer.yaml; `kestrel train`), verl's SFT trainer tree
// (sft_trainer.yaml; `kestrel sft`), and two views of the PPO tree for the
// commands that run one piece of it: `kestrel generate` (the rollout engine)
// and `kestrel logprobs` (scoring). A view holds copies of the PPO
// declarations it applies (a view may restate a default for its command,
// said in the doc); a PPO key outside the view "does not apply" there.
class Schema {
 public:
  Schema(std::string name, std::string command, std::vector<KeyDecl> keys, const Schema* parent = nullptr);
  const std::string& name() const { return name_; }        // "ppo_trainer", "sft_trainer", "generate", "logprobs"
  const std::string& command() const { return command_; }  // "kestrel train", ...
  // All keys in declaration order (the order of `config show` and the yaml file).
  const std::vector<KeyDecl>& keys() const { return keys_; }
  // nullptr when `path` is not a key.
  const KeyDecl* find(std::string_view path) const;
  // True for a strict prefix of some key ("actor_rollout_ref.actor.optim").
  bool is_section(std::string_view path) const;
  // The Map-typed key at or above `path` (free-form section), or nullptr.
  const KeyDecl* free_form_ancestor(std::string_view path) const;
  // An open section takes Hydra `+key=value` additions: the parent section of
  // an `addable` key (override_transformer_config, model.override_config).
  // An added key it does not declare is "not supported yet", not unknown.
  // Returns the open section at or above `path` ("" when none).
  std::string open_ancestor(std::string_view path) const;
  // Every key path and section path, for suggestions.
  const std::vector<std::string>& all_paths() const { return paths_; }
  // The tree a view was cut from (nullptr for a full tree).
  const Schema* parent() const { return parent_; }

 private:
  std::string name_, command_;
  std::vector<KeyDecl> keys_;
  std::unordered_map<std::string, size_t> by_path_;
  std::set<std::string, std::less<>> sections_, open_;
  std::vector<std::string> paths_;
  const Schema* parent_;
};

const Schema& ppo_schema();
const Schema& sft_schema();
const Schema& generate_schema();
const Schema& logprobs_schema();
// By name() ("ppo_trainer" also answers to "ppo" and "train", "sft_trainer" to "sft"); nullptr otherwise.
const Schema* find_schema(std::string_view name);
const std::vector<const Schema*>& all_schemas();

// The PPO tree (ppo_schema()), for code that only knows `kestrel train`'s keys.
const std::vector<KeyDecl>& schema();
const KeyDecl* find_key(std::string_view path);
bool is_section(std::string_view path);
const KeyDecl* free_form_ancestor(std::string_view path);
const std::vector<std::string>& all_paths();

namespace schema_detail {

// Why the offload keys are "no effect in Kestrel" today (appended to their docs).
inline constexpr const char* kOffloadOnCpu =
    " On the CPU backend parameters, gradients, optimizer state and activations already live in host memory, so "
    "offloading moves nothing; on the GPU (trainer.device=cuda) it is not built yet and true is refused.";
// optimizer_offload (Megatron's and verl FSDP's): acts on the GPU.
inline constexpr const char* kOptimizerOffload =
    "Offload optimizer state to host memory between steps. On the GPU (trainer.device=cuda) AdamW's moments and "
    "f32 masters live in host memory and stream through the device for each step (bit-identical to keeping them "
    "there); on the CPU backend they are in host memory already, so it moves nothing.";
// param_offload / grad_offload (Megatron's, and verl FSDP's param_offload): act on the GPU.
inline constexpr const char* kPhaseOffload =
    " On the GPU (trainer.device=cuda) they wait in pinned host memory while the model is idle between phases "
    "(generation, old/ref log-probs, values, update) and come back on the phase's first use, as verl's "
    "offload_megatron_model_to_cpu / load_megatron_model_to_gpu (bit-identical results, less device memory "
    "while another model computes); on the CPU backend they are in host memory already, so nothing moves.";
// Builders used by the schema_*.cpp declaration files.
class Builder {
 public:
  explicit Builder(std::vector<KeyDecl>& out) : out_(out) {}
  // Keys below are declared relative to `prefix` ("" = root).
  void scope(std::string prefix) { prefix_ = std::move(prefix); }
  const std::string& prefix() const { return prefix_; }
  KeyDecl& k(const std::string& rel, Type t, std::string def, Support s, std::string doc,
             std::vector<std::string> allowed = {}, std::vector<std::string> supported = {});
  // A key declared earlier (full path), to amend; a missing one is a table bug.
  KeyDecl& existing(const std::string& path);

 private:
  std::vector<KeyDecl>& out_;
  std::string prefix_;
};
void declare_data_and_model(Builder& b);
void declare_actor_ref_critic(Builder& b);
void declare_rollout(Builder& b);
void declare_reward_algorithm_trainer(Builder& b);
void declare_sft(Builder& b);
// verl's keys beyond the Megatron tree (schema_verl_*.cpp): the FSDP tree's
// fsdp_config/ulysses/grad_clip keys, profilers, Ray, reward-model engine
// blocks, and amendments of earlier declarations for values verl scripts pass.
void declare_verl_fsdp(Builder& b);
void declare_verl_extra(Builder& b);
// The mixture-of-experts keys of one model's override_transformer_config at `scope` (schema_moe.cpp):
// router training options, switches without effect on one expert-parallel rank, and the routing keys
// Kestrel takes from config.json. `trained` false (the reference model) declares the loss and
// bias-update keys NoEffect; a non-empty `follow` is the scope whose values the keys default to.
void declare_moe_overrides(Builder& b, const std::string& scope, bool trained, const std::string& follow);
void amend_for_verl(Builder& b);
// The PPO key paths each view takes, with the defaults and docs it restates.
struct ViewKey {
  std::string path;
  std::string default_yaml;  // empty: the PPO default
  std::string doc;           // empty: the PPO doc
  std::optional<Support> status = std::nullopt;  // unset: the PPO status
};
std::vector<ViewKey> generate_view();
std::vector<ViewKey> logprobs_view();
}  // namespace schema_detail

}  // namespace kestrel::config
