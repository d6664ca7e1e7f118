// kestrel sft: supervised fine-tuning with verl's sft_trainer.yaml key names,
// and kestrel builtin: writes the built-in arith task data and model folders.
//
// The run configuration is the SFT key table below (defaults) <- --config
// FILE.yaml <- `key=value` overrides (Hydra style, values parsed as YAML).
// `builtin:arith` as a data file and `builtin:tiny` / `builtin:small` as
// model.partial_pretrain are materialised under
// {trainer.default_local_dir}/builtin/ so a run needs nothing downloaded.
//
// Under mpirun -np N: a process grid of trainer.tensor_model_parallel_size x
// trainer.pipeline_model_parallel_size ranks per model replica (Kestrel's
// keys) and dp = N / (tp * pp) replicas; world rank 0 alone writes the
// metrics, console and report, every rank joins the checkpoints.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/loader_source.h"
#include "cli/options.h"
#include "comm/world.h"
#include "core/files.h"
#include "core/parallel_for.h"
#include "data/arith.h"
#include "data/builtin_tokenizer.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "io/model_config.h"
#include "model/parallel_setup.h"
#include "parallel/setup.h"
#include "rl/reward_rules.h"
#include "rollout/engine.h"
#include "train/builtin_model.h"
#include "train/checkpoint.h"
#include "train/sft_trainer.h"

namespace kestrel::cli {

int cmd_sft(const Args& args);
int cmd_sft_world(const Args& args);
int cmd_builtin(const Args& args);

namespace {

namespace fs = std::filesystem;
using oj = nlohmann::ordered_json;

std::string help_text() {
  return std::string("usage: kestrel sft [--config FILE.yaml | --config-path DIR --config-name NAME] [key=value ...]\n\n"
         "Supervised fine-tuning with verl's sft_trainer keys (Hydra overrides: key=value, +key=value, ~key).\n"
         "'kestrel config show sft_trainer ...' prints the resolved config. The keys ('kestrel config docs sft_trainer'):\n\n") +
         config::docs(config::sft_schema());
}

// builtin:arith -> the task's JSONL files, written once per settings.
std::vector<std::string> resolve_files(const SftInputs& in, const std::vector<std::string>& files,
                                       const std::string& builtin_root, bool train) {
  std::vector<std::string> out;
  for (const auto& f : files) {
    if (f != "builtin:arith") {
      out.push_back(f);
      continue;
    }
    const auto& o = in.arith;
    const int64_t ntr = in.arith_num_train, nte = in.arith_num_test;
    char tag[128];
    std::snprintf(tag, sizeof tag, "arith_s%llu_%d-%d_op%d_%lld_%lld", (unsigned long long)o.seed, o.min_steps,
                  o.max_steps, o.max_operand, (long long)ntr, (long long)nte);
    const std::string dir = builtin_root + "/" + tag;
    if (!fs::exists(dir + "/sft_test.jsonl")) data::write_arith_dataset(dir, ntr, nte, o).throw_if_error();
    out.push_back(dir + (train ? "/sft_train.jsonl" : "/sft_test.jsonl"));
  }
  return out;
}

// builtin:tiny|small|tiny-qwen3-moe|tiny-deepseek-v3 -> a materialised folder (config + arith tokenizer + random weights).
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
  // The SFT tree has no rollout keys: a fixed 256 MiB evaluation cache (greedy, <= 64 sequences).
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

// The launch against trainer.tensor_model_parallel_size x pipeline_model_parallel_size.
void check_sft_layout(const config::Config& c, const SftInputs& in, int world_size) {
  const std::string tk = "trainer.tensor_model_parallel_size", pk = "trainer.pipeline_model_parallel_size";
  const int64_t ranks = in.tp * in.pipeline.pp * in.cp.cp;
  const std::string cps = in.cp.cp > 1 ? " x " + in.cp.size_key + "=" + std::to_string(in.cp.cp) + " (from " +
                                             c.origin(in.cp.size_key) + ")"
                                       : "";
  const std::string sizes = tk + "=" + std::to_string(in.tp) + " (from " + c.origin(tk) + ") x " + pk + "=" +
                            std::to_string(in.pipeline.pp) + " (from " + c.origin(pk) + ")" + cps + " = " +
                            std::to_string(ranks) + " ranks per model replica";
  if (world_size % ranks != 0)
    KS_FAIL(sizes, " must divide the number of processes (", world_size, "); launch with mpirun -np <a multiple of ",
            ranks, "> kestrel sft ..., or choose sizes whose product divides ", world_size);
  if (in.val_generations > 0 && ranks > 1)
    KS_FAIL(c.origin("trainer.val_generations"), ": not supported yet: trainer.val_generations (evaluation by "
            "generation) with tensor, pipeline or context parallelism (", sizes, "); set trainer.val_generations=0 "
            "or run with tp = pp = cp = 1");
}

// Under mpirun: the process grid (tp x pp per replica, dp = world / (tp * pp)),
// this rank's share of the model (its tp group and, under pp, its stage's
// chunks of the layers) and the trainer's groups.
std::unique_ptr<parallel::ProcessGrid> setup_parallel(const comm::World& world, const SftInputs& in,
                                                      const std::string& model_dir, model::ModelOptions& mopt,
                                                      train::SftOptions& o) {
  auto mc = io::load_model_config(model_dir);
  if (!mc) KS_FAIL(mc.status().message());
  parallel::ParallelDims dims = parallel::dims_for(int(in.tp), false);
  dims.pp = in.pipeline.pp;
  dims.cp = int(in.cp.cp);
  auto g = parallel::make_process_grid(world, dims, model::model_facts(*mc, dims.pp > 1));
  if (!g) KS_FAIL("kestrel sft: ", g.status().message());
  std::unique_ptr<parallel::ProcessGrid> grid = std::move(g).value();
  mopt.parallel = model::model_parallel_for(*grid);
  model::set_context_parallel(mopt.parallel, world, *grid, in.cp.algo, int(in.cp.ulysses_degree));
  mopt.parallel.vpp_microbatch_group = in.pipeline.microbatch_group_size;
  if (dims.pp > 1) {
    auto chunks = parallel::pipeline_chunks(in.pipeline, mc->num_hidden_layers);
    if (!chunks)
      KS_FAIL("kestrel sft: trainer.pipeline_model_parallel_size / virtual_pipeline_model_parallel_size: ",
              chunks.status().message());
    model::set_pipeline_stage(mopt, (*chunks)[size_t(grid->coords().pp)]);
  }
  o.world = world.group();
  o.dp = grid->group(parallel::GroupKind::Dp);
  if (dims.cp > 1) o.dp_cp = grid->group(parallel::GroupKind::DpCp);
  return grid;
}

}  // namespace

namespace {

// world: the launch's processes that run this SFT together (nullptr = this process alone).
int run_sft(const Args& argv, const comm::World* world) {
  for (const auto& a : argv)
    if (a == "--help" || a == "-h") {
      std::printf("%s", help_text().c_str());
      return 0;
    }
  const config::Config c = load_command_config(config::sft_schema(), argv);
  const SftInputs in = sft_inputs(c);
  const int world_size = world ? world->size() : 1;
  const bool leader = !world || world->rank() == 0;
  check_sft_layout(c, in, world_size);
  set_num_threads(in.threads);
  // Rank 0's one-time work (the GEMM choice, the built-in data and model)
  // is waited for untimed; the default timeout is back after it.
  std::optional<comm::UntimedCollectives> start_up_window(std::in_place);
  init_gemm_for_job();
  const std::string root = in.ckpt_root;
  const std::string builtin_root = root + "/builtin";
  // Rank 0 materialises the built-in data and model first; the others then read them.
  if (world_size > 1 && !leader) world->group()->barrier();

  // The data files and their columns before any model (see check_sft_files).
  data::check_sft_files(resolve_files(in, in.train_files, builtin_root, true), in.data).throw_if_error();
  data::check_sft_files(resolve_files(in, in.val_files, builtin_root, false), in.data).throw_if_error();
  const std::string model_dir = resolve_model(in.model_spec, builtin_root, in.seed);
  if (world_size > 1 && leader) world->group()->barrier();
  start_up_window.reset();
  const std::string tok_dir = in.tokenizer_path.empty() ? model_dir : in.tokenizer_path;
  auto tok_r = data::ChatTokenizer::from_dir(tok_dir);
  if (!tok_r) KS_FAIL(tok_r.status().message());
  const data::ChatTokenizer& tok = *tok_r;

  data::SftDatasetOptions dopt = in.data;
  data::LoadStats tst, vst;
  auto train_rows = data::load_sft_dataset(resolve_files(in, in.train_files, builtin_root, true), tok, dopt, &tst);
  if (!train_rows) KS_FAIL(train_rows.status().message());
  dopt.max_samples = in.val_max_samples;
  std::vector<data::SftSample> val_rows;
  if (!in.val_files.empty()) {
    auto v = data::load_sft_dataset(resolve_files(in, in.val_files, builtin_root, false), tok, dopt, &vst);
    if (!v) KS_FAIL(v.status().message());
    val_rows = std::move(v).value();
  }
  if (leader) {
    std::fprintf(stderr, "sft: train %s; val %s\n", tst.summary().c_str(), vst.summary().c_str());
    for (const auto& s : tst.first_skipped) std::fprintf(stderr, "  skipped: %s\n", s.c_str());
  }

  const int64_t batch = in.train_batch_size;
  auto source = std::make_unique<LoaderSource>(int64_t(train_rows->size()), batch, in.shuffle, in.data_seed);
  const int64_t per_epoch = source->batches_per_epoch();
  train::SftOptions o = sft_options(c, per_epoch);
  o.progress = leader;

  model::ModelOptions mopt;
  mopt.dtype = in.dtype;
  mopt.recompute = in.recompute;
  {  // MoE router options against config.json (routing keys, the expert bias)
    auto mc = io::load_model_config(model_dir);
    if (!mc) KS_FAIL(mc.status().message());
    mopt.moe = moe_train_options(in.moe, *mc, model_dir + " (model.partial_pretrain)");
  }
  std::unique_ptr<parallel::ProcessGrid> grid;
  if (world_size > 1) grid = setup_parallel(*world, in, model_dir, mopt, o);
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
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    if (fs::exists(tok_dir + "/" + f)) o.model_extra_files[f] = read_file(tok_dir + "/" + f).value();
  }

  train::MetricsOptions mo;
  mo.console = false;
  mo.console_full = in.console_full;
  // metrics.jsonl is always written next to the checkpoints (as kestrel train
  // does): the run report and a resumed run read it.
  mo.jsonl_path = root + "/metrics.jsonl";
  for (const auto& l : in.loggers) {
    if (l == "console") mo.console = true;
    else if (l == "file") continue;
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
  std::unique_ptr<train::MetricsLogger> logger;  // world rank 0 only
  if (leader) {
    auto l = train::MetricsLogger::open(mo, resume_step);
    if (!l) KS_FAIL(l.status().message());
    logger = std::move(l).value();
  }

  train::SftHooks hooks;
  const int64_t ngen = in.val_generations;
  const int64_t max_resp = in.max_response_length;
  // Greedy decoding of the whole model: one process, or world rank 0 of a
  // dp-only run (every rank holds the whole model; check_sft_layout refuses tp/pp).
  if (ngen > 0 && leader) {
    hooks.generate_eval = [&](const model::CausalLM& mm) { return generation_eval(mm, val_rows, tok, ngen, max_resp); };
  }
  if (leader) {
    const bool split = in.pipeline.pp > 1 || in.tp > 1;
    const std::string layout =
        world_size == 1 ? "" : ", tp " + std::to_string(in.tp) + " x pp " + std::to_string(in.pipeline.pp) + " x dp " +
                                   std::to_string(world_size / (in.tp * in.pipeline.pp));
    std::fprintf(stderr, "sft: model %s (%lld params%s), %lld steps of %lld samples, %lld steps per epoch%s\n",
                 model_dir.c_str(), (long long)m.num_parameters(), split ? " on rank 0: its stage and tp shard" : "",
                 (long long)o.total_steps, (long long)batch, (long long)per_epoch, layout.c_str());
  }
  train::SftTrainer trainer(m, to_examples(*train_rows), to_examples(val_rows), std::move(source), o, logger.get(),
                            hooks);
  if (leader) write_run_info_file(root, "kestrel sft", world_size);
  trainer.fit().throw_if_error();
  if (leader) write_run_report_file(root, "kestrel sft");
  return 0;
}

}  // namespace

// In-process callers (kestrel train's SFT warm start, run by world rank 0
// alone while the other ranks wait) train in this process only, whatever the launch.
int cmd_sft(const Args& argv) { return run_sft(argv, nullptr); }

// The `kestrel sft` command: every rank of the launch (mpirun -np N) joins.
int cmd_sft_world(const Args& argv) {
  check_omp_num_threads("sft");  // before any parallel region (libgomp starts that many threads)
  return run_sft(argv, comm::World::current());
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
  const std::string usage = "usage: kestrel builtin arith --out DIR [...] | model tiny|small|tiny-qwen3-moe|tiny-deepseek-v3 --out DIR [--seed S] | tokenizer --out DIR\n";
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
