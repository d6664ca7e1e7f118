#include "train/sft_trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include "core/files.h"
#include "core/progress.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "model/pipeline_save.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/micro_batch.h"
#include "train/run_control.h"
#include "train/token_objective.h"

namespace kestrel::train {

namespace {

std::vector<std::vector<int32_t>> gather_ids(const std::vector<SftExample>& ex, const std::vector<int64_t>& idx) {
  std::vector<std::vector<int32_t>> out;
  for (int64_t i : idx) out.push_back(ex[size_t(i)].ids);
  return out;
}

// This dp rank's contiguous share [begin, end) of n items (shares differ by at most one).
std::pair<size_t, size_t> dp_share(size_t n, const comm::ProcessGroup* dp) {
  if (!dp || dp->size() == 1) return {0, n};
  const size_t r = size_t(dp->rank()), k = size_t(dp->size());
  return {n * r / k, n * (r + 1) / k};
}

// Element-wise sums over the group, added in rank order (the same bits on every rank).
void sum_over(comm::ProcessGroup* g, std::vector<double>& v) {
  if (!g || g->size() == 1) return;
  std::vector<double> all(v.size() * size_t(g->size()));
  g->all_gather(v.data(), all.data(), int64_t(v.size()), DType::I64);  // raw 8-byte patterns
  for (size_t i = 0; i < v.size(); ++i) {
    double acc = 0;
    for (size_t r = 0; r < size_t(g->size()); ++r) acc += all[r * v.size() + i];
    v[i] = acc;
  }
}

}  // namespace

SftTrainer::SftTrainer(model::CausalLM& model, std::vector<SftExample> train, std::vector<SftExample> val,
                       std::unique_ptr<BatchSource> source, SftOptions opt, MetricsLogger* logger, SftHooks hooks)
    : model_(model), train_(std::move(train)), val_(std::move(val)), source_(std::move(source)), opt_(std::move(opt)),
      logger_(logger), hooks_(std::move(hooks)) {
  KS_CHECK(opt_.total_steps > 0, "SFT: total steps must be positive");
  KS_CHECK(!train_.empty(), "SFT: no training examples");
  EngineOptions eo;
  eo.adamw = opt_.adamw;
  eo.lr = opt_.lr;
  if (eo.lr.total_steps <= 0) eo.lr.total_steps = opt_.total_steps;
  eo.clip_grad = opt_.clip_grad;
  eo.reuse_fp32_param = opt_.reuse_fp32_param;
  eo.max_consecutive_skipped_steps = opt_.max_consecutive_skipped_steps;
  eo.name = "sft";
  // dp: gradients summed over the grid's dp group (each rank's objective
  // carries the whole mini-batch's denominator). One process (no dp group, tp
  // and pp of size 1) is the engine's plain path.
  eo.parallel.dp = opt_.dp_cp ? opt_.dp_cp : opt_.dp;
  opt_.lr = eo.lr;
  engine_ = std::make_unique<TrainingEngine>(model_, std::move(eo));
}

std::map<std::string, double> SftTrainer::train_step() {
  const auto t0 = std::chrono::steady_clock::now();
  // The whole mini-batch, the same on every rank (the loader is seeded), so
  // its denominators are known everywhere without a reduction.
  const std::vector<int64_t> all = source_->next_batch();
  int64_t n_resp = 0, n_tok = 0;
  for (int64_t i : all) {
    const auto& e = train_[size_t(i)];
    n_tok += int64_t(e.ids.size());
    // Rows predicting a trained token: every masked token but a sequence's first.
    for (size_t t = 1; t < e.loss_mask.size(); ++t) n_resp += e.loss_mask[t];
  }
  const float scale = n_resp > 0 ? 1.f / float(n_resp) : 0.f;
  // This dp rank's contiguous share of it (all of it in one process).
  const auto [b0, b1] = dp_share(all.size(), opt_.dp.get());
  const std::vector<int64_t> idx(all.begin() + ptrdiff_t(b0), all.begin() + ptrdiff_t(b1));
  std::vector<int64_t> lens;
  for (int64_t i : idx) lens.push_back(int64_t(train_[size_t(i)].ids.size()));
  const auto groups = split_micro_batches(lens, opt_.max_token_len_per_micro,
                                          opt_.max_token_len_per_micro > 0 ? 0 : opt_.micro_batch_size);
  std::vector<MicroBatch> micro;
  for (const auto& grp : groups) {
    MicroBatch mb;
    for (int64_t k : grp) mb.seqs.push_back(idx[size_t(k)]);
    mb.batch = model::pack_sequences(gather_ids(train_, mb.seqs));
    micro.push_back(std::move(mb));
  }
  maybe_crash("train_step", step_ + 1);
  // The schedule advances with applied updates only: a skipped step (NaN/Inf
  // guard) holds it, as Megatron's training.py steps its scheduler only when
  // the update succeeded. Equal to lr(step_) when nothing was skipped.
  const double lr = engine_->lr(engine_->weight_version());
  const MiniBatchResult r = engine_->train_mini_batch(
      micro,
      [&](const MicroBatch& mb, size_t) {
        std::vector<const std::vector<uint8_t>*> masks;
        for (int64_t i : mb.seqs) masks.push_back(&train_[size_t(i)].loss_mask);
        Objective o;
        o.tokens = cross_entropy_objective(sft_token_weights(masks, scale));
        o.need_entropy_grad = false;
        return o;
      },
      lr, step_ + 1);
  // r.loss is this dp rank's share (on every pipeline stage: the engine
  // broadcasts the last stage's); the mini-batch loss is their sum.
  std::vector<double> sums = {r.loss, double(groups.size())};
  sum_over(opt_.dp.get(), sums);
  const double loss = sums[0];
  ++step_;
  // MoE routers: this stage's layers summed over dp; every stage's for the log.
  MoeMetrics moe;
  if (model_.num_moe_layers() > 0) {
    moe.add(r.moe);
    moe.gather_stages(model_.pp());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::map<std::string, double> m = moe.metrics("train");
  m.insert({{"train/loss", loss},
          {"train/lr", lr},
          {"train/grad_norm", r.grad_norm},
          {"train/step_skipped", r.finite ? 0.0 : 1.0},
          {"train/epoch", double(source_->epoch())},
          {"train/num_tokens", double(n_tok)},
          {"train/num_response_tokens", double(n_resp)},
          {"train/micro_batches", sums[1]},  // over all dp ranks
          {"perf/tokens_per_s", secs > 0 ? double(n_tok) / secs : 0.0},
          {"perf/step_time_s", secs}});
  return m;
}

std::map<std::string, double> SftTrainer::validate() {
  std::map<std::string, double> out;
  if (!val_.empty()) {
    // This dp rank's contiguous share of the validation rows; the sums over dp
    // give the token-mean over all of them.
    const auto [v0, v1] = dp_share(val_.size(), opt_.dp.get());
    std::vector<int64_t> lens;
    for (size_t i = v0; i < v1; ++i) lens.push_back(int64_t(val_[i].ids.size()));
    std::vector<MicroBatch> micro;
    for (const auto& grp : split_micro_batches(lens, opt_.val_micro_tokens, 0)) {
      MicroBatch mb;
      for (int64_t k : grp) mb.seqs.push_back(int64_t(v0) + k);
      mb.batch = model::pack_sequences(gather_ids(val_, mb.seqs));
      micro.push_back(std::move(mb));
    }
    double nll = 0, count = 0;
    // f32 [T] next-token log-probs of micro-batch k: vocab-parallel under tp,
    // and under pp every stage receives the last stage's (collective over pp and tp).
    score_micro_batches(model_, micro, [&](size_t k, const Tensor& logprob) {
      const std::vector<float> l = logprob.to_host<float>();
      int64_t t = 0;
      for (int64_t i : micro[k].seqs) {
        const auto& m = val_[size_t(i)].loss_mask;
        for (size_t j = 0; j < m.size(); ++j, ++t)
          if (j + 1 < m.size() && m[j + 1]) { nll -= l[size_t(t)]; count += 1; }
      }
    });
    std::vector<double> sums = {nll, count};
    sum_over(opt_.dp.get(), sums);
    out["val/loss"] = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  }
  if (hooks_.generate_eval) {
    for (const auto& [k, v] : hooks_.generate_eval(model_)) out[k] = v;
  }
  return out;
}

Status SftTrainer::export_hf(const std::string& dir) const {
  // One HF folder of the whole model: the pipeline stages and tp shards of dp
  // replica 0 stream their tensors to its writer (pp rank 0, tp rank 0 = world rank 0).
  if (writes_model_folder()) KS_TRY(model::save_pipelined_model(model_, dir, DType::F32));
  if (leader())
    for (const auto& [name, content] : opt_.model_extra_files) KS_TRY(write_file_atomic(dir + "/" + name, content));
  return Status::ok();
}

Status SftTrainer::save_checkpoint() {
  // No checkpoint holds a NaN/Inf: refuse before any file (or temp folder) is
  // written, so the previous checkpoint and the pointer stay as they are.
  // Under mpirun every rank checks its own stage and shard; any failure stops all.
  Status fin = engine_->check_finite();
  if (opt_.world && opt_.world->size() > 1) {
    int32_t ok = fin ? 1 : 0;
    opt_.world->all_reduce(&ok, 1, DType::I32, comm::ReduceOp::Min);
    if (fin && ok != 1)
      fin = KS_ERR("another rank holds a NaN/Inf in its weights or optimizer state (its message is in its log)");
  }
  KS_TRY(fin.with_context("checkpoint " + checkpoint_dir(opt_.ckpt_root, step_) + " not written"));
  // Collective under mpirun: the weights by dp replica 0's ranks (one HF
  // folder from the stages and shards), one optimizer file per pipeline stage
  // (every rank joins), the trainer state by world rank 0.
  return write_checkpoint(
      opt_.ckpt_root, step_,
      [&](const std::string& dir) -> Status {
        // Weights in the compute dtype; bf16 runs keep their f32 masters with the optimizer.
        if (writes_model_folder())
          KS_TRY(model::save_pipelined_model(model_, dir + "/model", model_.dtype()));
        if (leader())
          for (const auto& [name, content] : opt_.model_extra_files)
            KS_TRY(write_file_atomic(dir + "/model/" + name, content));
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        KS_TRY(engine_->save_optimizer_dir(dir));
        if (!leader()) return Status::ok();
        nlohmann::ordered_json ts;
        ts["global_step"] = step_;
        ts["total_steps"] = opt_.total_steps;
        ts["lr_scheduler"] = {{"last_step", step_},
                              {"style", optim::lr_style_name(opt_.lr.style)},
                              {"base_lr", opt_.lr.lr},
                              {"warmup_steps", opt_.lr.warmup_steps},
                              {"total_steps", opt_.lr.total_steps}};
        ts["data_loader"] = source_->state();
        // No sampling in SFT: the only randomness is the loader's seeded shuffle,
        // fully described by its (seed, epoch, index).
        ts["rng"] = {{"kind", "philox"}, {"seed", source_->state().value("seed", uint64_t(0))}};
        ts["parallel"] = {{"world", opt_.world ? opt_.world->size() : 1},
                          {"tp", model_.tp().size()},
                          {"pp", model_.pp().size()},
                          {"dp", opt_.dp ? opt_.dp->size() : 1}};
        KS_TRY(write_file_atomic(dir + "/trainer_state.json", ts.dump(2) + "\n"));
        return write_file_atomic(dir + "/config.yaml", opt_.resolved_config_yaml);
      },
      opt_.max_ckpt_to_keep, opt_.world.get());
}

Status SftTrainer::load_checkpoint(const std::string& dir) {
  KS_TRY(train::load_weights_into(model_, dir + "/model"));
  KS_TRY(engine_->load_optimizer_dir(dir));
  KS_ASSIGN(TrainerState ts, read_trainer_state(dir));
  step_ = ts.global_step;
  return source_->restore(ts.json["data_loader"], ts.path);
}

Status SftTrainer::fit() {
  if (!opt_.ckpt_root.empty() && leader()) remove_stale_checkpoint_temps(opt_.ckpt_root);
  if (opt_.world && opt_.world->size() > 1) opt_.world->barrier();  // cleaned before any rank reads the root
  std::string resume_dir;
  if (opt_.resume_mode == "auto") {
    if (!opt_.ckpt_root.empty()) {
      KS_ASSIGN(auto latest, latest_checkpoint_step(opt_.ckpt_root));
      if (latest) resume_dir = checkpoint_dir(opt_.ckpt_root, *latest);
    }
  } else if (opt_.resume_mode == "resume_path") {
    if (opt_.resume_from_path.empty())
      return KS_ERR("trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_N folder)");
    KS_TRY(checkpoint_step_of(opt_.resume_from_path).status());
    resume_dir = opt_.resume_from_path;
  } else if (opt_.resume_mode != "disable") {
    return KS_ERR("trainer.resume_mode: '", opt_.resume_mode, "' is not one of auto, disable, resume_path");
  }
  if (!resume_dir.empty()) {
    KS_TRY(load_checkpoint(resume_dir).with_context("resuming from " + resume_dir));
    if (leader()) {
      std::fprintf(stderr, "resumed from %s (step %lld)\n", resume_dir.c_str(), (long long)step_);
      report_if_finished(step_, opt_.total_steps, resume_dir, "trainer.total_training_steps",
                         "trainer.default_local_dir");
    }
  }
  install_interrupt_handler();
  if (step_ == 0 && opt_.val_before_train) {  // collective: every rank validates, the leader logs
    const auto v = validate();
    if (logger_) logger_->log(0, v);
  }
  ProgressBar bar(opt_.total_steps, step_);
  while (step_ < opt_.total_steps) {
    set_progress(step_ + 1, "sft_step");  // for messages written from outside (core/progress.h)
    auto m = train_step();
    const bool last = step_ == opt_.total_steps;
    if (opt_.progress) {
      char status[64];
      std::snprintf(status, sizeof status, "loss %.4f", m["train/loss"]);
      bar.update(step_, int64_t(m["train/num_tokens"]), status);
    }
    if (opt_.test_freq > 0 && (step_ % opt_.test_freq == 0 || last)) {
      if (opt_.progress) bar.finish();
      set_progress(step_, "validate");
      for (const auto& [k, v] : validate()) m[k] = v;
    }
    if (logger_) logger_->log(step_, m);
    if (opt_.save_freq > 0 && !opt_.ckpt_root.empty() && (step_ % opt_.save_freq == 0 || last)) {
      set_progress(step_, "save_checkpoint");
      KS_TRY(save_checkpoint());
    }
    // Ctrl-C: every rank stops after the same step (rank 0's flag decides).
    int32_t stop = interrupt_requested() ? 1 : 0;
    if (opt_.world && opt_.world->size() > 1) opt_.world->broadcast(&stop, 1, DType::I32, 0);
    if (stop) end_interrupted(step_, opt_.ckpt_root, "kestrel sft", leader());
  }
  if (opt_.progress) bar.finish();
  if (!opt_.export_dir.empty()) KS_TRY(export_hf(opt_.export_dir));
  return Status::ok();
}

}  // namespace kestrel::train
