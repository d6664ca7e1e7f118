// RlTrainer's checkpoints: verl's layout (global_step_N/actor/{model,
// optimizer files}, critic/, trainer_state.json), written collectively under
// mpirun and resumed bit for bit.
#include "rl/trainer.h"

#include <filesystem>

#include "core/files.h"
#include "train/checkpoint.h"

namespace kestrel::rl {

Status RlTrainer::save_checkpoint() {
  // No checkpoint holds a NaN/Inf: every rank checks its weights and optimizer
  // state, the verdict is shared (so no rank enters the collective write
  // alone), and a refusal leaves the previous checkpoint and the pointer as
  // they are. (The engines check again when they write their optimizer files.)
  {
    Status fin = actor_->engine().check_finite();
    if (fin && critic_) fin = critic_->critic().engine().check_finite();
    int32_t ok = fin ? 1 : 0;
    comm::ProcessGroup& world = *opt_.parallel.world;
    if (world.size() > 1) world.all_reduce(&ok, 1, DType::I32, comm::ReduceOp::Min);
    if (fin && ok != 1) fin = KS_ERR("another rank holds a NaN/Inf in its weights or optimizer state (its message is in its log)");
    if (!fin) return fin.with_context("checkpoint " + train::checkpoint_dir(opt_.ckpt_root, step_) + " not written");
  }
  // Under mpirun every rank writes its part into one folder (collective):
  // the weights by the tp ranks of dp rank 0 (gathered, tp rank 0 writes),
  // one optimizer file per rank, the trainer state by world rank 0.
  const bool leader = is_world_leader();
  return train::write_checkpoint(
      opt_.ckpt_root, step_,
      [&](const std::string& dir) -> Status {
        KS_TRY(actor_->save(dir + "/actor"));
        if (leader && opt_.parallel.grad_group().rank() == 0)  // tokenizer files next to the weights
          for (const auto& [name, content] : opt_.model_extra_files)
            KS_TRY(write_file_atomic(dir + "/actor/model/" + name, content));
        if (critic_) KS_TRY(critic_->save(dir + "/critic"));
        if (!leader) return Status::ok();
        nlohmann::ordered_json ts;
        ts["global_step"] = step_;
        ts["total_steps"] = opt_.total_steps;
        ts["lr_scheduler"] = {{"last_step", step_}, {"base_lr", opt_.lr.lr}, {"total_steps", opt_.lr.total_steps}};
        // Disaggregated: the prompt stream and the store live on the rollout ranks; their state after this step.
        const nlohmann::ordered_json* remote = remote_ ? &remote_->state_after(step_ - 1) : nullptr;
        ts["data_loader"] = remote ? remote->at("data_loader") : nlohmann::ordered_json(source_->state());
        // Sampling seeds and the mini-batch shuffle are functions of (seed, step):
        // these and global_step are the whole random state.
        ts["rng"] = {{"kind", "philox/splitmix64 by step"},
                     {"rollout_seed", opt_.rollout_seed},
                     {"data_loader_seed", opt_.data_loader_seed}};
        ts["kl_ctrl"] = {{"type", opt_.kl_ctrl.type}, {"value", opt_.kl_ctrl.value}};
        ts["parallel"] = {{"world", opt_.parallel.world->size()},
                          {"tp", actor_->model().tp().size()},
                          {"pp", actor_->model().pp().size()},
                          {"dp", opt_.parallel.dp->size()},
                          {"distributed_optimizer", opt_.parallel.distributed_optimizer}};
        KS_TRY(write_file_atomic(dir + "/trainer_state.json", ts.dump(2) + "\n"));
        // What the rollout generated ahead or in part (rl/sample_store.h): resumed, none is lost or trained twice.
        if (async_) KS_TRY(write_file_atomic(dir + "/sample_store.json", async_->store().to_json().dump() + "\n"));
        if (remote) KS_TRY(write_file_atomic(dir + "/sample_store.json", remote->at("store").dump() + "\n"));
        return write_file_atomic(dir + "/config.yaml", opt_.resolved_config_yaml);
      },
      opt_.max_ckpt_to_keep, opt_.parallel.world.get());
}

Status RlTrainer::load_checkpoint(const std::string& dir) {
  KS_TRY(actor_->load(dir + "/actor", dir));
  KS_ASSIGN(train::TrainerState state, train::read_trainer_state(dir));
  step_ = state.global_step;
  const std::string& tpath = state.path;
  nlohmann::json& ts = state.json;
  if (ts.contains("kl_ctrl") && ts["kl_ctrl"].contains("value") && ts["kl_ctrl"]["value"].is_number())
    opt_.kl_ctrl.value = ts["kl_ctrl"]["value"].get<double>();  // the adaptive controller's state
  if (critic_) KS_TRY(critic_->load(dir + "/critic"));
  KS_TRY(source_->restore(ts["data_loader"], tpath));
  if (remote_) {
    // Handed to the rollout ranks when fit() starts them (rl/disaggregated.h).
    const std::string spath = dir + "/sample_store.json";
    KS_ASSIGN(std::string stext, read_file(spath));
    try {
      resume_state_ = {{"store", nlohmann::json::parse(stext)}, {"data_loader", ts["data_loader"]}};
    } catch (const nlohmann::json::exception& e) {
      return KS_ERR(spath, ": ", e.what());
    }
    KS_TRY(SampleStore::from_json(resume_state_["store"], spath).status());
  }
  if (async_) {
    // A checkpoint of a version without the store resumes synchronously only: nothing was generated ahead.
    const std::string spath = dir + "/sample_store.json";
    if (std::filesystem::exists(spath)) {
      KS_ASSIGN(std::string stext, read_file(spath));
      nlohmann::json sj;
      try {
        sj = nlohmann::json::parse(stext);
      } catch (const nlohmann::json::exception& e) {
        return KS_ERR(spath, ": ", e.what());
      }
      KS_ASSIGN(SampleStore st, SampleStore::from_json(sj, spath));
      async_->store() = std::move(st);
    } else if (opt_.staleness_threshold > 0 || opt_.partial_max_split > 1) {
      return KS_ERR(spath, " is missing: this checkpoint holds no sample store, so the samples generated ahead "
                    "of it are unknown; resume with async_training.staleness_threshold=0 and "
                    "algorithm.partial_rollout_max_split=1");
    } else {
      async_->store().set_next_stream(step_ * async_->options().batch_prompts);  // the synchronous trainer's seeds
    }
  }
  if (rollout_) rollout_->reload();  // the view to the loaded weights, the prefix cache reset
  return Status::ok();
}

}  // namespace kestrel::rl
