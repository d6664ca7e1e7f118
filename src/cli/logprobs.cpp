// kestrel logprobs: scores token sequences with a model folder. Each input
// line {"input_ids": [...]} yields {"logprobs": [...], "entropy": [...]} for
// positions 1..n-1: logprobs[i-1] = log p(token_i | tokens before it), and
// entropy[i-1] the entropy of the distribution that predicted token i.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/files.h"
#include "core/parallel_for.h"
#include "comm/world.h"
#include "io/model_config.h"
#include "model/cp_batch.h"
#include "model/parallel_setup.h"
#include "model/scoring.h"
#include "train/pipeline.h"
#include "parallel/setup.h"

namespace kestrel::cli {

namespace {

// Under mpirun (or with tp/pp/cp above 1) the process grid, with this rank's
// share of the model set in opts: its tp/cp groups and pipeline stage. Null
// for a single process.
std::unique_ptr<parallel::ProcessGrid> logprobs_grid(const LogprobsSettings& ls, const std::string& model_dir,
                                                     model::ModelOptions& opts) {
  const int64_t tp = ls.tp, cp = ls.cp.cp;
  const int pp = ls.pipeline.pp;
  const comm::World* world = comm::World::current();
  if (!(tp > 1 || pp > 1 || cp > 1 || (world && world->size() > 1))) return nullptr;
  KS_CHECK(world, "no comm::World: main() constructs it");
  auto mc = io::load_model_config(model_dir);
  if (!mc.is_ok()) KS_FAIL(mc.status().message());
  const int64_t ranks = int64_t(tp) * pp * cp;
  if ((world->size() % ranks) != 0)
    KS_FAIL("kestrel logprobs: --tp ", tp, " x --pp ", pp, " x --cp ", cp, " = ", ranks,
            " must divide the number of processes (", world->size(), "); launch with mpirun -np <a multiple of ",
            ranks, ">");
  parallel::ParallelDims dims = parallel::dims_for(int(tp), ls.sequence_parallel);
  dims.pp = pp;
  dims.cp = int(cp);
  auto g = parallel::make_process_grid(*world, dims, model::model_facts(mc.value(), pp > 1));
  if (!g.is_ok()) KS_FAIL("kestrel logprobs: ", g.status().message());
  std::unique_ptr<parallel::ProcessGrid> grid = std::move(g).value();
  opts.parallel = model::model_parallel_for(*grid);
  model::set_context_parallel(opts.parallel, *world, *grid, ls.cp.algo, int(ls.cp.ulysses_degree));
  if (pp > 1) {  // this rank's stage of the layers; the scores come back from the last stage
    auto chunks = parallel::pipeline_chunks(ls.pipeline, mc->num_hidden_layers);
    if (!chunks) KS_FAIL("kestrel logprobs: ", chunks.status().message());
    model::set_pipeline_stage(opts, (*chunks)[size_t(grid->coords().pp)]);
  }
  return grid;
}

// The --input JSONL's sequences, each checked against the vocabulary (V
// ids) and the model's positions; an error names the line.
std::vector<std::vector<int32_t>> read_token_sequences(const std::string& in, int64_t V, int64_t max_positions) {
  std::vector<std::vector<int32_t>> seqs;
  Status st = for_each_jsonl(in, [&](const nlohmann::json& j, int64_t) -> Status {
    if (!j.is_object() || !j.contains("input_ids") || !j["input_ids"].is_array())
      return KS_ERR("expected an object with an \"input_ids\" array");
    std::vector<int32_t> ids;
    for (const auto& x : j["input_ids"]) {
      if (!x.is_number_integer()) return KS_ERR("\"input_ids\" must hold integers, found ", x.dump());
      int64_t v = x.get<int64_t>();
      if (v < 0 || v >= V) return KS_ERR("token id ", v, " is outside the vocabulary [0, ", V, ")");
      ids.push_back(int32_t(v));
    }
    if (ids.empty()) return KS_ERR("\"input_ids\" is empty");
    if (int64_t(ids.size()) > max_positions)
      return KS_ERR("sequence of ", ids.size(), " tokens exceeds max_position_embeddings ", max_positions);
    seqs.push_back(std::move(ids));
    return Status::ok();
  });
  if (!st.is_ok()) KS_FAIL(st.message());
  return seqs;
}

}  // namespace

int cmd_logprobs(const Args& argv) {
  // The help's defaults come from the logprobs key table (one source of truth).
  const auto table_default = [](const std::string& key) { return config::logprobs_schema().find(key)->default_yaml; };
  ParsedArgs args("logprobs",
                  {{"model", "HF model folder (config.json + safetensors)", true, ""},
                   {"input", "JSONL, one {\"input_ids\": [...]} per line", true, ""},
                   {"output", "JSONL written atomically, one line per input line", true, ""},
                   {"dtype", "compute dtype f32 | bf16 (actor_rollout_ref.actor.megatron.dtype)", true, "f32"},
                   {"threads", "CPU threads (0 = all cores)", true, "0"},
                   {"max-batch-tokens", "tokens packed into one forward pass "
                                        "(actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu)", true,
                    table_default("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu")},
                   {"tp", "tensor-parallel size, under mpirun -np N with N a multiple of it "
                          "(actor_rollout_ref.actor.megatron.tensor_model_parallel_size)", true,
                    table_default("actor_rollout_ref.actor.megatron.tensor_model_parallel_size")},
                   {"pp", "pipeline-parallel size: each rank scores through its stage of the layers, under mpirun "
                          "-np N with N a multiple of tp x pp (actor_rollout_ref.actor.megatron.pipeline_model_parallel_size)",
                    true, table_default("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size")},
                   {"cp", "context-parallel size: each sequence split over this many ranks, under mpirun -np N with "
                          "N a multiple of tp x pp x cp (actor_rollout_ref.actor.megatron.context_parallel_size)",
                    true, table_default("actor_rollout_ref.actor.megatron.context_parallel_size")},
                   {"cp-algo", "attention under context parallelism: megatron_cp_algo (ring), ulysses_cp_algo, "
                               "hybrid_cp_algo (actor_rollout_ref.actor.megatron.override_transformer_config."
                               "context_parallel_algo)",
                    true, "megatron_cp_algo"},
                   {"sequence-parallel", "shard activations along the sequence between TP regions", false, ""},
                   {"config", "YAML file of the keys below", true, ""}},
                  argv);
  if (args.help()) {
    std::printf("%s  key=value overrides: the keys 'kestrel config docs logprobs' lists.\n", args.usage().c_str());
    return 0;
  }
  // Flags that name keys come first; key=value overrides after them.
  const std::string M = "actor_rollout_ref.actor.megatron.";
  std::vector<std::string> first, rest;
  if (args.has("model")) first.push_back("actor_rollout_ref.model.path=" + args.get("model"));
  if (args.has("dtype"))
    first.push_back(M + "dtype=" + (parse_compute_dtype(args.get("dtype"), "--dtype") == DType::BF16 ? "bfloat16" : "float32"));
  if (args.has("tp")) first.push_back(M + "tensor_model_parallel_size=" + args.get("tp"));
  if (args.has("pp")) first.push_back(M + "pipeline_model_parallel_size=" + args.get("pp"));
  if (args.has("cp")) first.push_back(M + "context_parallel_size=" + args.get("cp"));
  if (args.has("cp-algo")) first.push_back(M + "override_transformer_config.context_parallel_algo=" + args.get("cp-algo"));
  if (args.has("sequence-parallel")) first.push_back(M + "sequence_parallel=true");
  if (args.has("max-batch-tokens"))
    first.push_back("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=" + args.get("max-batch-tokens"));
  if (args.has("config")) rest.push_back("--config=" + args.get("config"));
  for (const auto& p : args.positional()) {
    if (p.find('=') == std::string::npos && p[0] != '~')
      KS_FAIL("kestrel logprobs: unexpected argument '", p, "' (options are --flag value or key=value)");
    rest.push_back(p);
  }
  const config::Config cfg = load_command_config(config::logprobs_schema(), rest, first);
  const LogprobsSettings ls = logprobs_settings(cfg);

  const std::string in = args.require("input"), out = args.require("output");
  const std::string model_dir = resolve_model_folder(ls.model_path);
  set_num_threads(int(args.get_int("threads")));
  init_gemm_for_job();
  const int64_t budget = ls.max_batch_tokens;

  model::ModelOptions opts;
  opts.dtype = ls.dtype;
  opts.make_vocab_size_divisible_by = ls.vocab_divisible_by;
  // Under mpirun every rank scores every batch (the forward is collective over
  // the tp group); only world rank 0 writes the output and the summary.
  const comm::World* world = comm::World::current();
  const bool writer = !world || world->rank() == 0;
  // Refused before the model loads: a symlink/FIFO/device, the input itself, a missing or read-only folder.
  if (writer) check_output_file(out, "--output", {{in, "--input"}}).throw_if_error();
  const std::unique_ptr<parallel::ProcessGrid> grid = logprobs_grid(ls, model_dir, opts);  // held while m lives
  {  // MoE scoring forwards: capacity and router dtype, routing keys against config.json
    auto mc = io::load_model_config(model_dir);
    if (!mc.is_ok()) KS_FAIL(mc.status().message());
    opts.moe = moe_train_options(ls.moe, mc.value(), model_dir);
  }
  auto loaded = model::CausalLM::load(model_dir, opts);
  if (!loaded.is_ok()) KS_FAIL(loaded.status().message());
  const model::CausalLM& m = *loaded.value();
  const int64_t V = m.config().vocab_size;

  const std::vector<std::vector<int32_t>> seqs = read_token_sequences(in, V, m.rope().cos.size(0));

  std::unique_ptr<AtomicFile> f = writer ? std::make_unique<AtomicFile>(out) : nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  for (size_t i = 0; i < seqs.size();) {
    // Pack consecutive sequences up to the token budget (always at least one).
    size_t j = i;
    int64_t n = 0;
    std::vector<std::vector<int32_t>> group;
    while (j < seqs.size() && (group.empty() || n + int64_t(seqs[j].size()) <= budget)) {
      n += int64_t(seqs[j].size());
      group.push_back(seqs[j++]);
    }
    model::PackedBatch b = model::pack_sequences(group);
    // Under context parallelism each rank runs its share; the scores come back as the full batch's rows.
    const model::PackedBatch run = model::cp_local_batch(m, b);
    model::TokenScores s = m.pp().size() > 1 ? train::pipeline_score_tokens(m, run) : model::score_tokens(m, run);
    const std::vector<float> lpv = s.logprob.to_host<float>(), env = s.entropy.to_host<float>();  // [T]
    const float* lp = lpv.data();
    const float* en = env.data();
    const std::vector<int32_t>& cu = b.host.cu_seqlens;
    for (size_t g = 0; g < group.size(); ++g) {
      nlohmann::json o;
      o["logprobs"] = std::vector<float>(lp + cu[g], lp + cu[g + 1] - 1);
      o["entropy"] = std::vector<float>(en + cu[g], en + cu[g + 1] - 1);
      if (!f) continue;
      Status ws = f->write(o.dump() + "\n");
      if (!ws.is_ok()) KS_FAIL(ws.message());
    }
    tokens += n;
    i = j;
  }
  if (!f) return 0;
  Status cs = f->commit();
  if (!cs.is_ok()) KS_FAIL(cs.message());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "kestrel logprobs: %zu sequences, %lld tokens in %.2f s (%.0f tokens/s) -> %s\n",
               seqs.size(), (long long)tokens, secs, tokens / std::max(secs, 1e-9), out.c_str());
  return 0;
}

}  // namespace kestrel::cli
