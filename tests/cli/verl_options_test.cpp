// verl's names for what Kestrel's one engine does (options_verl.cpp and the
// option builders): FSDP keys mapped onto the optimizer and schedule, the
// backend/engine names verl scripts pass accepted (with a notice where Kestrel
// runs its own engine in place of theirs), and the run settings that cannot be
// honoured refused up front with what to do.
#include <gtest/gtest.h>

#include "cli/options.h"
#include "config/config.h"

namespace kestrel::cli {
namespace {

config::Config ok(const std::vector<std::string>& ov) {
  config::LoadOptions lo;
  lo.overrides = ov;
  auto c = config::load(lo);
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return std::move(c).value();
}

std::string notices(const config::Config& c) {
  std::string s;
  for (const auto& n : c.notices()) s += n + "\n";
  return s;
}

const std::string A = "actor_rollout_ref.actor.", R = "actor_rollout_ref.rollout.";

TEST(VerlNames, GradClipIsTheOptimizersClip) {
  EXPECT_DOUBLE_EQ(rl_options(ok({}), 1).clip_grad, 1.0);  // optim.clip_grad's default, verl's grad_clip default
  EXPECT_DOUBLE_EQ(rl_options(ok({A + "optim.clip_grad=0.5"}), 1).clip_grad, 0.5);
  EXPECT_DOUBLE_EQ(rl_options(ok({A + "optim.clip_grad=0.5", A + "grad_clip=0.3"}), 1).clip_grad, 0.3);
  const auto c = ok({"critic.grad_clip=0.7"});
  EXPECT_DOUBLE_EQ(critic_options(c, rl_options(c, 1)).clip_grad, 0.7);
}

// Megatron's param_offload / grad_offload, and verl FSDP's param_offload (the whole module: both).
TEST(VerlNames, PhaseOffloadKeysReachTheWorkers) {
  const rl::RlOptions none = rl_options(ok({}), 1);
  EXPECT_FALSE(none.actor_param_offload || none.actor_grad_offload || none.ref_param_offload);
  const rl::RlOptions meg = rl_options(ok({A + "megatron.param_offload=true", "actor_rollout_ref.ref.megatron.param_offload=true"}), 1);
  EXPECT_TRUE(meg.actor_param_offload);
  EXPECT_FALSE(meg.actor_grad_offload);
  EXPECT_TRUE(meg.ref_param_offload);
  const rl::RlOptions fsdp = rl_options(ok({A + "fsdp_config.param_offload=true"}), 1);
  EXPECT_TRUE(fsdp.actor_param_offload && fsdp.actor_grad_offload);
  EXPECT_FALSE(fsdp.ref_param_offload);
  const auto c = ok({"critic.megatron.grad_offload=true"});
  const rl::CriticOptions co = critic_options(c, rl_options(c, 1));
  EXPECT_TRUE(co.grad_offload);
  EXPECT_FALSE(co.param_offload);
}

TEST(VerlNames, FsdpSchedulerNames) {
  auto style = [](const std::vector<std::string>& ov) { return lr_schedule_config(ok(ov), A, 100).style; };
  EXPECT_EQ(style({}), optim::LrStyle::Constant);
  EXPECT_EQ(style({A + "optim.lr_scheduler_type=cosine"}), optim::LrStyle::Cosine);
  EXPECT_EQ(style({A + "optim.lr_decay_style=linear"}), optim::LrStyle::Linear);
  EXPECT_EQ(style({A + "optim.lr_decay_style=linear", A + "optim.lr_scheduler_type=cosine"}), optim::LrStyle::Cosine);
  // warmup_style (deprecated in verl) wins over both, as verl's FSDPOptimizerConfig does.
  EXPECT_EQ(style({A + "optim.lr_scheduler_type=cosine", A + "optim.warmup_style=constant"}), optim::LrStyle::Constant);
}

TEST(VerlNames, BackendAndEngineNamesRunKestrelsEngine) {
  for (const char* s : {"fsdp", "fsdp2", "megatron"})
    EXPECT_NO_THROW(train_inputs(ok({A + "strategy=" + s, "critic.strategy=" + std::string(s)})));
  EXPECT_NO_THROW(train_inputs(ok({A + "optim.optimizer=AdamW", "critic.optim.optimizer=adamw"})));
  const auto c = ok({R + "name=vllm", R + "mode=async", R + "load_format=safetensors",
                     A + "megatron.expert_tensor_parallel_size=1", "actor_rollout_ref.model.use_remove_padding=true",
                     "+" + A + "megatron.override_transformer_config.use_flash_attn=true"});
  EXPECT_NO_THROW(train_inputs(c));
  const std::string n = notices(c);
  EXPECT_NE(n.find("rollout.name has 'vllm'"), std::string::npos) << n;
  EXPECT_NE(n.find("rollout.mode has 'async'"), std::string::npos) << n;
  EXPECT_EQ(c.notices().size(), 2u) << n;  // the rest is what Kestrel does: no notice
  EXPECT_TRUE(ok({R + "name=sglang"}).notices().size() == 1);
}

TEST(VerlNames, LoggersWithoutAClientGetOneNoticeEach) {
  const auto c = ok({"trainer.logger=[console,wandb,swanlab,mlflow,tensorboard]"});
  EXPECT_EQ(c.notices().size(), 3u) << notices(c);
  for (const char* l : {"wandb", "swanlab", "mlflow"})
    EXPECT_NE(notices(c).find("trainer.logger has '" + std::string(l) + "'"), std::string::npos) << l;
  EXPECT_TRUE(train_inputs(c).console_logger);
  EXPECT_FALSE(train_inputs(ok({"trainer.logger=[wandb]"})).console_logger);
}

// This suite runs in the dev build, which has no CUDA backend (the device runs of trainer.device=cuda
// are scripts/device_check.sh's and tests/cuda_emu/grpo_on_device.sh's).
TEST(VerlNames, LaunchChecksDevice) {
  EXPECT_NO_THROW(train_inputs(ok({})));
  EXPECT_EQ(trainer_device(ok({}), 1), Device::CPU);  // verl's default cuda, unset: the CPU here
  EXPECT_EQ(trainer_device(ok({"trainer.device=cpu"}), 4), Device::CPU);
  try {
    trainer_device(ok({"trainer.device=cuda"}), 1);
    ADD_FAILURE() << "trainer.device=cuda accepted on a CPU-only build";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("set trainer.device=cpu"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no CUDA backend"), std::string::npos) << e.what();
  }
}

// Activation offload and FSDP2's offload_policy move nothing on the CPU and are not built for the GPU;
// param_offload, grad_offload and optimizer_offload act there (CausalLM::offload_to_host, AdamW).
TEST(VerlNames, OffloadKeysOnTheGpuAreRefusedUntilBuilt) {
  const std::string k = "actor_rollout_ref.model.enable_activation_offload";
  EXPECT_NO_THROW(check_offload_on_device(ok({k + "=true"}), Device::CPU));
  EXPECT_NO_THROW(check_offload_on_device(ok({}), Device::CUDA));
  for (const char* built : {"actor_rollout_ref.actor.megatron.optimizer_offload=true",
                            "actor_rollout_ref.actor.megatron.param_offload=true",
                            "actor_rollout_ref.actor.megatron.grad_offload=true",
                            "actor_rollout_ref.ref.megatron.param_offload=true",
                            "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                            "critic.megatron.param_offload=true"})
    EXPECT_NO_THROW(check_offload_on_device(ok({built}), Device::CUDA)) << built;
  try {
    check_offload_on_device(ok({k + "=true"}), Device::CUDA);
    ADD_FAILURE() << k << "=true accepted on the GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not supported yet: " + k + "=true"), std::string::npos) << e.what();
  }
}

TEST(VerlNames, LaunchChecksProcessCount) {
  EXPECT_NO_THROW(check_launch(ok({}), 1));  // unset: the processes mpirun started
  EXPECT_NO_THROW(check_launch(ok({}), 4));
  EXPECT_NO_THROW(check_launch(ok({"trainer.n_gpus_per_node=2", "trainer.nnodes=2"}), 4));
  try {
    check_launch(ok({"trainer.n_gpus_per_node=8"}), 1);
    ADD_FAILURE() << "8 x 1 accepted for 1 process";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("launch with mpirun -np 8 kestrel train"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("trainer.n_gpus_per_node=1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kestrel::cli
