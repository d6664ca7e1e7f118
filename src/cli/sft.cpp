// kestrel sft: supervised fine-tuning with verl's sft_trainer.yaml key names,
// and kestrel builtin: writes the built-in arith task data and model folders.
//
// The run configuration is the SFT key table below (defaults) <- --config
// FILE.yaml <- `key=value` overrides (Hydra style, values parsed as YAML).
// `builtin:arith` as a data file and `builtin:tiny` / `builtin:small` as
// model.partial_pretrain are materialised under
// {trainer.default_local_dir}/builtin/ so a run needs nothing downloaded.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/loader_source.h"
#include "core/files.h"
#include "core/parallel_for.h"
#include "data/arith.h"
#include "data/builtin_tokenizer.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "rl/reward_rules.h"
#include "rollout/engine.h"
#include "train/builtin_model.h"
#include "train/checkpoint.h"
#include "train/sft_trainer.h"

namespace kestrel::cli {

int cmd_sft(const Args& args);
int cmd_builtin(const Args& args);

namespace {

namespace fs = std::filesystem;
using oj = nlohmann::ordered_json;

struct SftKey {
  const char* path;
  const char* default_yaml;
  const char* doc;
};

// verl's sft_trainer.yaml names where they exist; Kestrel additions are marked.
const SftKey kSftKeys[] = {
    {"data.train_files", "builtin:arith", "SFT JSONL file(s); builtin:arith = the built-in task's train split."},
    {"data.val_files", "builtin:arith", "Validation JSONL file(s); builtin:arith = the task's test split; null = none."},
    {"data.prompt_key", "prompt", "Row field with the prompt (string or chat messages)."},
    {"data.response_key", "response", "Row field with the response text."},
    {"data.multiturn.messages_key", "messages", "Row field with a whole conversation (loss on assistant turns)."},
    {"data.max_length", "512", "Maximum tokens per sample (prompt + response)."},
    {"data.truncation", "error", "Longer samples: error | left | right | middle."},
    {"data.train_batch_size", "64", "Samples per optimizer step."},
    {"data.micro_batch_size_per_gpu", "8", "Samples per micro-batch when use_dynamic_bsz is false."},
    {"data.use_dynamic_bsz", "true", "Micro-batches by token budget (max_token_len_per_gpu) instead of count."},
    {"data.max_token_len_per_gpu", "4096", "Token budget of one micro-batch (dynamic batch size)."},
    {"data.shuffle", "true", "Shuffle the training set every epoch."},
    {"data.seed", "null", "Shuffle seed; null = trainer.seed."},
    {"data.skip_malformed", "false", "Skip (and count) malformed rows instead of failing. [Kestrel]"},
    {"data.train_max_samples", "-1", "Use at most this many training rows; -1 = all."},
    {"data.val_max_samples", "-1", "Use at most this many validation rows; -1 = all."},
    {"data.max_response_length", "128", "Generation length for evaluation by generation. [Kestrel]"},
    {"data.arith.num_train", "20000", "builtin:arith training problems. [Kestrel]"},
    {"data.arith.num_test", "500", "builtin:arith test problems. [Kestrel]"},
    {"data.arith.seed", "1234", "builtin:arith generator seed. [Kestrel]"},
    {"data.arith.min_steps", "1", "builtin:arith fewest events per problem. [Kestrel]"},
    {"data.arith.max_steps", "2", "builtin:arith most events per problem. [Kestrel]"},
    {"data.arith.max_operand", "20", "builtin:arith largest +/- operand. [Kestrel]"},
    {"model.partial_pretrain", "builtin:tiny", "HF model folder, or builtin:tiny | builtin:small (random init)."},
    {"model.tokenizer_path", "null", "Tokenizer folder; null = the model folder."},
    {"model.dtype", "f32", "Compute dtype: f32 | bf16 (bf16 keeps f32 masters). [Kestrel]"},
    {"optim.lr", "1e-5", "Peak learning rate."},
    {"optim.betas", "[0.9, 0.95]", "AdamW betas."},
    {"optim.eps", "1e-8", "AdamW epsilon."},
    {"optim.weight_decay", "0.01", "AdamW decoupled weight decay."},
    {"optim.warmup_steps_ratio", "0.1", "Warmup steps as a fraction of the total steps."},
    {"optim.clip_grad", "1.0", "Global gradient-norm clip; <= 0 disables."},
    {"optim.lr_scheduler", "cosine", "cosine | constant | linear."},
    {"optim.min_lr_ratio", "0.0", "Floor of the decayed learning rate, as a fraction of optim.lr."},
    {"trainer.default_local_dir", "checkpoints/sft", "Checkpoint root: global_step_N folders and the latest pointer."},
    {"trainer.project_name", "kestrel-sft", "Project name (logs)."},
    {"trainer.experiment_name", "arith", "Run name (logs)."},
    {"trainer.total_epochs", "1", "Passes over the training set."},
    {"trainer.total_training_steps", "null", "Stop after this many steps; null = steps per epoch * total_epochs."},
    {"trainer.logger", "[console]", "Metric sinks: console, file (metrics.jsonl), tensorboard."},
    {"trainer.seed", "1", "Seed of the built-in model's init and the default shuffle seed."},
    {"trainer.save_freq", "-1", "Checkpoint every N steps and at the end; -1 = never."},
    {"trainer.test_freq", "-1", "Validate every N steps and at the end; -1 = never."},
    {"trainer.val_before_train", "false", "Validate before the first step."},
    {"trainer.max_ckpt_to_keep", "null", "Keep the newest N checkpoints; null = all."},
    {"trainer.resume_mode", "auto", "auto | disable | resume_path."},
    {"trainer.resume_from_path", "null", "global_step_N folder for resume_mode=resume_path."},
    {"trainer.export_dir", "null", "Write the final model as an HF folder here. [Kestrel]"},
    {"trainer.val_generations", "0", "Validation prompts greedy-decoded for val/acc; 0 = off. [Kestrel]"},
    {"trainer.threads", "0", "CPU threads; 0 = all cores. [Kestrel]"},
};

const SftKey* find_sft_key(const std::string& p) {
  for (const auto& k : kSftKeys)
    if (p == k.path) return &k;
  return nullptr;
}

oj yaml_to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return nullptr;
    case YAML::NodeType::Sequence: {
      oj a = oj::array();
      for (const auto& e : n) a.push_back(yaml_to_json(e));
      return a;
    }
    case YAML::NodeType::Map: {
      oj o = oj::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = yaml_to_json(kv.second);
      return o;
    }
    default: {
      const std::string s = n.Scalar();
      if (n.Tag() == "!" || n.Tag() == "tag:yaml.org,2002:str") return s;  // quoted
      if (s == "null" || s == "~" || s.empty()) return nullptr;
      if (s == "true" || s == "True") return true;
      if (s == "false" || s == "False") return false;
      try {
        size_t used = 0;
        const long long i = std::stoll(s, &used);
        if (used == s.size()) return int64_t(i);
        const double d = std::stod(s, &used);
        if (used == s.size()) return d;
      } catch (...) {
      }
      return s;
    }
  }
}

// The SFT configuration: a flat map from dotted key to value.
class SftConfig {
 public:
  static SftConfig load(const std::string& file, const std::vector<std::string>& overrides) {
    SftConfig c;
    for (const auto& k : kSftKeys) c.set(k.path, yaml_to_json(YAML::Load(k.default_yaml)), "default");
    if (!file.empty()) {
      YAML::Node root;
      try {
        root = YAML::LoadFile(file);
      } catch (const YAML::Exception& e) {
        KS_FAIL(file, ": ", e.what());
      }
      c.merge(yaml_to_json(root), "", file);
    }
    for (const auto& o : overrides) {
      const size_t eq = o.find('=');
      if (eq == std::string::npos || eq == 0)
        KS_FAIL("kestrel sft: '", o, "' is not a key=value override (e.g. optim.lr=1e-4)");
      std::string key = o.substr(0, eq);
      while (!key.empty() && key[0] == '+') key.erase(0, 1);
      oj v;
      try {
        v = yaml_to_json(YAML::Load(o.substr(eq + 1)));
      } catch (const YAML::Exception& e) {
        KS_FAIL("command line: ", key, ": cannot parse value '", o.substr(eq + 1), "': ", e.what());
      }
      c.set(key, v, "command line");
    }
    return c;
  }
  void merge(const oj& node, const std::string& prefix, const std::string& origin) {
    if (!node.is_object()) KS_FAIL(origin, ": expected a mapping at '", prefix.empty() ? "<root>" : prefix, "'");
    for (const auto& [k, v] : node.items()) {
      const std::string p = prefix.empty() ? k : prefix + "." + k;
      if (v.is_object() && !find_sft_key(p)) merge(v, p, origin);
      else set(p, v, origin);
    }
  }
  void set(const std::string& key, const oj& v, const std::string& origin) {
    if (!find_sft_key(key)) {
      // Nearest key by edit distance, to catch typos.
      auto dist = [](const std::string& a, const std::string& b) {
        std::vector<size_t> row(b.size() + 1);
        for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
        for (size_t i = 1; i <= a.size(); ++i) {
          size_t diag = row[0];
          row[0] = i;
          for (size_t j = 1; j <= b.size(); ++j) {
            const size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
            diag = up;
          }
        }
        return row[b.size()];
      };
      std::string near;
      size_t best = std::max<size_t>(4, key.size() / 3) + 1;
      for (const auto& k : kSftKeys) {
        const size_t d = dist(key, k.path);
        if (d < best) { best = d; near = k.path; }
      }
      KS_FAIL(origin, ": unknown SFT config key '", key, "'", near.empty() ? "" : " (did you mean '" + near + "'?)",
              "; 'kestrel sft --help' lists the keys");
    }
    values_[key] = v;
    origins_[key] = origin;
  }
  const oj& at(const std::string& k) const { return values_.at(k); }
  bool is_null(const std::string& k) const { return at(k).is_null(); }
  template <class T>
  T get(const std::string& k) const {
    try {
      return at(k).get<T>();
    } catch (const nlohmann::json::exception&) {
      KS_FAIL(origins_.at(k), ": ", k, " = ", at(k).dump(), " has the wrong type (", doc(k), ")");
    }
  }
  std::string str(const std::string& k) const { return at(k).is_string() ? at(k).get<std::string>() : at(k).dump(); }
  std::vector<std::string> str_list(const std::string& k) const {
    if (is_null(k)) return {};
    if (at(k).is_string()) return {at(k).get<std::string>()};
    return get<std::vector<std::string>>(k);
  }
  static std::string doc(const std::string& k) { return find_sft_key(k)->doc; }
  // The resolved configuration as nested YAML (saved in every checkpoint).
  std::string to_yaml() const {
    oj nested = oj::object();
    for (const auto& k : kSftKeys) {
      oj* node = &nested;
      std::string p = k.path;
      size_t dot;
      while ((dot = p.find('.')) != std::string::npos) {
        node = &(*node)[p.substr(0, dot)];
        p = p.substr(dot + 1);
      }
      (*node)[p] = values_.at(k.path);
    }
    YAML::Emitter e;
    emit(e, nested);
    return std::string(e.c_str()) + "\n";
  }

 private:
  static void emit(YAML::Emitter& e, const oj& v) {
    if (v.is_object()) {
      e << YAML::BeginMap;
      for (const auto& [k, x] : v.items()) {
        e << YAML::Key << k << YAML::Value;
        emit(e, x);
      }
      e << YAML::EndMap;
    } else if (v.is_array()) {
      e << YAML::Flow << YAML::BeginSeq;
      for (const auto& x : v) emit(e, x);
      e << YAML::EndSeq;
    } else if (v.is_null()) {
      e << YAML::Null;
    } else if (v.is_string()) {
      e << v.get<std::string>();
    } else {
      e << v.dump();
    }
  }
  std::map<std::string, oj> values_;
  std::map<std::string, std::string> origins_;
};

std::string help_text() {
  std::string s =
      "usage: kestrel sft [--config FILE.yaml] [key=value ...]\n\n"
      "Supervised fine-tuning (verl sft_trainer names). Keys and defaults:\n";
  for (const auto& k : kSftKeys) {
    char line[512];
    std::snprintf(line, sizeof line, "  %-32s %-16s %s\n", k.path, k.default_yaml, k.doc);
    s += line;
  }
  return s;
}

data::ArithOptions arith_options(const SftConfig& c) {
  data::ArithOptions o;
  o.seed = c.get<uint64_t>("data.arith.seed");
  o.min_steps = c.get<int>("data.arith.min_steps");
  o.max_steps = c.get<int>("data.arith.max_steps");
  o.max_operand = c.get<int>("data.arith.max_operand");
  return o;
}

// builtin:arith -> the task's JSONL files, written once per settings.
std::vector<std::string> resolve_files(const SftConfig& c, const std::string& key, const std::string& builtin_root,
                                       bool train) {
  std::vector<std::string> out;
  for (const auto& f : c.str_list(key)) {
    if (f != "builtin:arith") {
      out.push_back(f);
      continue;
    }
    const auto o = arith_options(c);
    const int64_t ntr = c.get<int64_t>("data.arith.num_train"), nte = c.get<int64_t>("data.arith.num_test");
    char tag[128];
    std::snprintf(tag, sizeof tag, "arith_s%llu_%d-%d_op%d_%lld_%lld", (unsigned long long)o.seed, o.min_steps,
                  o.max_steps, o.max_operand, (long long)ntr, (long long)nte);
    const std::string dir = builtin_root + "/" + tag;
    if (!fs::exists(dir + "/sft_test.jsonl")) data::write_arith_dataset(dir, ntr, nte, o).throw_if_error();
    out.push_back(dir + (train ? "/sft_train.jsonl" : "/sft_test.jsonl"));
  }
  return out;
}

// builtin:tiny|small -> a materialised folder (config + arith tokenizer + random weights).
std::string resolve_model(const std::string& spec, const std::string& builtin_root, uint64_t seed) {
  if (spec.rfind("builtin:", 0) != 0) return spec;
  const std::string name = spec.substr(8);
  const std::string dir = builtin_root + "/model_" + name + "_seed" + std::to_string(seed);
  if (fs::exists(dir + "/model.safetensors")) return dir;
  const auto tf = data::arith_tokenizer();
  auto cfg = train::builtin_model_config(name, tf.vocab_size, tf.eos_id);
  if (!cfg) KS_FAIL("model.partial_pretrain: ", cfg.status().message());
  train::materialize_model(dir, *cfg,
                           {{"tokenizer.json", tf.tokenizer_json}, {"tokenizer_config.json", tf.tokenizer_config_json}},
                           seed)
      .throw_if_error();
  return dir;
}

// Greedy decoding of validation prompts through the rollout engine, scored
// with the rule of each row's data_source (arith / gsm8k / MATH).
std::map<std::string, double> generation_eval(const model::CausalLM& m, const std::vector<data::SftSample>& val,
                                              const data::ChatTokenizer& tok, int64_t n, int64_t max_tokens) {
  rollout::EngineConfig ec;
  ec.kv_cache_bytes = int64_t(256) << 20;
  ec.max_num_seqs = 64;
  auto eng = rollout::Engine::create(m, ec);
  if (!eng) KS_FAIL("evaluation: ", eng.status().message());
  rollout::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  if (tok.eos_id()) sp.stop_token_ids = {*tok.eos_id()};
  std::vector<const data::SftSample*> rows;
  for (const auto& s : val) {
    if (int64_t(rows.size()) >= n) break;
    if (s.ground_truth.empty() || s.prompt_length == 0) continue;
    std::vector<int32_t> prompt(s.ids.begin(), s.ids.begin() + s.prompt_length);
    (*eng)->add_request(std::to_string(rows.size()), std::move(prompt), sp).throw_if_error();
    rows.push_back(&s);
  }
  if (rows.empty()) return {};
  const auto outs = (*eng)->run_to_completion();
  double correct = 0, len = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const auto& c = outs[i].outputs.at(0);
    const std::string text = tok.tokenizer().decode(c.token_ids, true);
    const auto* r = rows[size_t(std::stoll(outs[i].request_id))];
    const std::string src = r->data_source.empty() ? "openai/gsm8k" : r->data_source;
    correct += rl::rule_score(src, text, r->ground_truth).value_or(0.0) >= 1.0 ? 1 : 0;
    len += double(c.token_ids.size());
  }
  return {{"val/acc", correct / double(outs.size())}, {"val/response_length", len / double(outs.size())},
          {"val/num_generated", double(outs.size())}};
}

}  // namespace

int cmd_sft(const Args& argv) {
  ParsedArgs args("sft", {{"config", "YAML file with SFT keys (see below)", true, ""}}, argv);
  if (args.help()) {
    std::printf("%s%s", args.usage().c_str(), help_text().c_str());
    return 0;
  }
  const SftConfig c = SftConfig::load(args.get("config"), args.positional());
  set_num_threads(c.get<int>("trainer.threads"));
  // Settings checked before any work is done.
  const std::string mode = c.str("trainer.resume_mode");
  if (mode != "auto" && mode != "disable" && mode != "resume_path")
    KS_FAIL("trainer.resume_mode: '", mode, "' is not one of auto, disable, resume_path");
  for (const auto& l : c.str_list("trainer.logger"))
    if (l != "console" && l != "file" && l != "tensorboard")
      KS_FAIL("trainer.logger: '", l, "' is not one of console, file, tensorboard");
  (void)data::parse_truncation(c.str("data.truncation"), "data.truncation").value();
  (void)optim::parse_lr_style(c.str("optim.lr_scheduler"), "optim.lr_scheduler").value();
  const std::string root = c.str("trainer.default_local_dir");
  const std::string builtin_root = root + "/builtin";
  const uint64_t seed = c.get<uint64_t>("trainer.seed");

  const std::string model_dir = resolve_model(c.str("model.partial_pretrain"), builtin_root, seed);
  const std::string tok_dir = c.is_null("model.tokenizer_path") ? model_dir : c.str("model.tokenizer_path");
  auto tok_r = data::ChatTokenizer::from_dir(tok_dir);
  if (!tok_r) KS_FAIL(tok_r.status().message());
  const data::ChatTokenizer& tok = *tok_r;

  data::SftDatasetOptions dopt;
  dopt.prompt_key = c.str("data.prompt_key");
  dopt.response_key = c.str("data.response_key");
  dopt.messages_key = c.str("data.multiturn.messages_key");
  dopt.max_length = c.get<int64_t>("data.max_length");
  dopt.truncation = data::parse_truncation(c.str("data.truncation"), "data.truncation").value();
  dopt.skip_malformed = c.get<bool>("data.skip_malformed");
  dopt.max_samples = c.get<int64_t>("data.train_max_samples");
  data::LoadStats tst, vst;
  auto train_rows = data::load_sft_dataset(resolve_files(c, "data.train_files", builtin_root, true), tok, dopt, &tst);
  if (!train_rows) KS_FAIL(train_rows.status().message());
  dopt.max_samples = c.get<int64_t>("data.val_max_samples");
  std::vector<data::SftSample> val_rows;
  if (!c.is_null("data.val_files")) {
    auto v = data::load_sft_dataset(resolve_files(c, "data.val_files", builtin_root, false), tok, dopt, &vst);
    if (!v) KS_FAIL(v.status().message());
    val_rows = std::move(v).value();
  }
  std::fprintf(stderr, "sft: train %s; val %s\n", tst.summary().c_str(), vst.summary().c_str());
  for (const auto& s : tst.first_skipped) std::fprintf(stderr, "  skipped: %s\n", s.c_str());

  model::ModelOptions mopt;
  if (!parse_dtype(c.str("model.dtype"), &mopt.dtype) || (mopt.dtype != DType::F32 && mopt.dtype != DType::BF16))
    KS_FAIL("model.dtype must be f32 or bf16, got '", c.str("model.dtype"), "'");
  auto loaded = model::CausalLM::load(model_dir, mopt);
  if (!loaded) KS_FAIL(loaded.status().message());
  model::CausalLM& m = **loaded;
  const int64_t V = m.config().vocab_size;
  if (tok.tokenizer().vocab_size() > V)
    KS_FAIL(tok_dir, ": the tokenizer has ", tok.tokenizer().vocab_size(), " ids but the model's vocab_size is ", V);

  auto to_examples = [](const std::vector<data::SftSample>& rows) {
    std::vector<train::SftExample> out;
    for (const auto& r : rows) out.push_back({r.ids, r.loss_mask});
    return out;
  };
  const int64_t batch = c.get<int64_t>("data.train_batch_size");
  const uint64_t data_seed = c.is_null("data.seed") ? seed : c.get<uint64_t>("data.seed");
  auto source = std::make_unique<LoaderSource>(int64_t(train_rows->size()), batch, c.get<bool>("data.shuffle"), data_seed);

  train::SftOptions o;
  const int64_t per_epoch = source->batches_per_epoch();
  o.total_steps = c.is_null("trainer.total_training_steps") ? per_epoch * c.get<int64_t>("trainer.total_epochs")
                                                            : c.get<int64_t>("trainer.total_training_steps");
  if (o.total_steps <= 0) KS_FAIL("kestrel sft: no steps to run (check trainer.total_epochs / total_training_steps)");
  o.micro_batch_size = c.get<int64_t>("data.micro_batch_size_per_gpu");
  o.max_token_len_per_micro = c.get<bool>("data.use_dynamic_bsz") ? c.get<int64_t>("data.max_token_len_per_gpu") : 0;
  const auto betas = c.get<std::vector<double>>("optim.betas");
  if (betas.size() != 2) KS_FAIL("optim.betas must hold two numbers");
  o.adamw = {betas[0], betas[1], c.get<double>("optim.eps"), c.get<double>("optim.weight_decay")};
  o.lr.lr = c.get<double>("optim.lr");
  o.lr.style = optim::parse_lr_style(c.str("optim.lr_scheduler"), "optim.lr_scheduler").value();
  o.lr.total_steps = o.total_steps;
  o.lr.warmup_steps = int64_t(c.get<double>("optim.warmup_steps_ratio") * double(o.total_steps));
  o.lr.min_lr_ratio = c.get<double>("optim.min_lr_ratio");
  o.clip_grad = c.get<double>("optim.clip_grad");
  o.save_freq = c.get<int64_t>("trainer.save_freq");
  o.test_freq = c.get<int64_t>("trainer.test_freq");
  o.val_before_train = c.get<bool>("trainer.val_before_train");
  o.max_ckpt_to_keep = c.is_null("trainer.max_ckpt_to_keep") ? 0 : c.get<int64_t>("trainer.max_ckpt_to_keep");
  o.ckpt_root = root;
  o.resume_mode = c.str("trainer.resume_mode");
  o.resume_from_path = c.is_null("trainer.resume_from_path") ? "" : c.str("trainer.resume_from_path");
  o.export_dir = c.is_null("trainer.export_dir") ? "" : c.str("trainer.export_dir");
  o.resolved_config_yaml = c.to_yaml();
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    if (fs::exists(tok_dir + "/" + f)) o.model_extra_files[f] = read_file(tok_dir + "/" + f).value();
  }

  train::MetricsOptions mo;
  mo.console = false;
  for (const auto& l : c.str_list("trainer.logger")) {
    if (l == "console") mo.console = true;
    else if (l == "file") mo.jsonl_path = root + "/metrics.jsonl";
    else if (l == "tensorboard") mo.tensorboard_dir = root + "/tensorboard";
    else KS_FAIL("trainer.logger: '", l, "' is not one of console, file, tensorboard");
  }
  fs::create_directories(root);
  // A resumed run keeps the metrics up to its checkpoint.
  int64_t resume_step = -1;
  if (o.resume_mode == "auto") {
    auto latest = train::latest_checkpoint_step(root);
    if (latest && latest->has_value()) resume_step = **latest;
  } else if (o.resume_mode == "resume_path" && !o.resume_from_path.empty()) {
    auto s = train::checkpoint_step_of(o.resume_from_path);
    if (s) resume_step = *s;
  }
  auto logger = train::MetricsLogger::open(mo, resume_step);
  if (!logger) KS_FAIL(logger.status().message());

  train::SftHooks hooks;
  const int64_t ngen = c.get<int64_t>("trainer.val_generations");
  const int64_t max_resp = c.get<int64_t>("data.max_response_length");
  if (ngen > 0) {
    hooks.generate_eval = [&](const model::CausalLM& mm) { return generation_eval(mm, val_rows, tok, ngen, max_resp); };
  }
  std::fprintf(stderr, "sft: model %s (%lld params), %lld steps of %lld samples, %lld steps per epoch\n",
               model_dir.c_str(), (long long)m.num_parameters(), (long long)o.total_steps, (long long)batch,
               (long long)per_epoch);
  train::SftTrainer trainer(m, to_examples(*train_rows), to_examples(val_rows), std::move(source), o, logger->get(),
                            hooks);
  trainer.fit().throw_if_error();
  return 0;
}

int cmd_builtin(const Args& argv) {
  ParsedArgs args("builtin",
                  {{"out", "output folder", true, ""},
                   {"num-train", "arith: training problems", true, "20000"},
                   {"num-test", "arith: test problems", true, "500"},
                   {"seed", "generator seed (arith) or init seed (model)", true, "1234"},
                   {"min-steps", "arith: fewest events per problem", true, "1"},
                   {"max-steps", "arith: most events per problem", true, "2"},
                   {"max-operand", "arith: largest +/- operand", true, "20"}},
                  argv);
  const std::string usage = "usage: kestrel builtin arith --out DIR [...] | model tiny|small --out DIR [--seed S] | tokenizer --out DIR\n";
  if (args.help() || args.positional().empty()) {
    std::printf("%s%s", usage.c_str(), args.usage().c_str());
    return args.help() ? 0 : 2;
  }
  const auto& pos = args.positional();
  const std::string out = args.require("out");
  if (pos[0] == "arith") {
    data::ArithOptions o;
    o.seed = uint64_t(args.get_int("seed"));
    o.min_steps = int(args.get_int("min-steps"));
    o.max_steps = int(args.get_int("max-steps"));
    o.max_operand = int(args.get_int("max-operand"));
    data::write_arith_dataset(out, args.get_int("num-train"), args.get_int("num-test"), o).throw_if_error();
  } else if (pos[0] == "tokenizer") {
    data::write_tokenizer_files(out, data::arith_tokenizer()).throw_if_error();
  } else if (pos[0] == "model" && pos.size() == 2) {
    const auto tf = data::arith_tokenizer();
    auto cfg = train::builtin_model_config(pos[1], tf.vocab_size, tf.eos_id);
    if (!cfg) KS_FAIL(cfg.status().message());
    train::materialize_model(out, *cfg,
                             {{"tokenizer.json", tf.tokenizer_json}, {"tokenizer_config.json", tf.tokenizer_config_json}},
                             uint64_t(args.get_int("seed")))
        .throw_if_error();
  } else {
    KS_FAIL(usage);
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace kestrel::cli
