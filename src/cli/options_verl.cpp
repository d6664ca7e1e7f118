// verl's names for what Kestrel's one engine does, read where they only
// choose among equivalent paths (strategy, rollout.name, load_format, the
// optimizer's spelling), and the settings a run must match (trainer.device,
// trainer.n_gpus_per_node x nnodes against the processes mpirun started).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "cli/options.h"
#include "comm/device_group.h"
#include "rollout/engine.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace kestrel::cli {

namespace {
const std::string A = "actor_rollout_ref.actor.", R = "actor_rollout_ref.rollout.";
}  // namespace

void read_verl_choices(const config::Config& c) {
  // Every value these keys allow runs the same code (the config layer has
  // checked them and printed the notices for vllm/sglang/async): fsdp, fsdp2
  // and megatron are Kestrel's training engine, vllm and sglang its rollout
  // engine, every load_format starts the rollout from the trainer's weights,
  // and adam, Adam, AdamW and adamw are its AdamW.
  for (const char* k : {"actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy"})
    (void)c.get_string(k);
  (void)c.get_string(R + "name");
  (void)c.get_string(R + "mode");
  (void)c.get_string(R + "load_format");
  for (const std::string& o : {A + "optim.optimizer", std::string("critic.optim.optimizer")}) (void)c.get_string(o);
  (void)c.get_string("trainer.device");  // resolved by trainer_device(), where the models are placed
  for (const char* k : {"trainer.n_gpus_per_node", "trainer.nnodes"})
    if (c.get_int(k) < 1) KS_FAIL(c.origin(k), ": ", k, "=", c.get_int(k), " must be >= 1");
}

Device trainer_device(const config::Config& c, int world_size, int local_rank) {
  const std::string dev = c.get_string("trainer.device");
  const bool explicit_choice = c.origin("trainer.device") != "default";
  if (dev == "cpu") return Device::CPU;
#if KESTREL_HAVE_CUDA
  if (!cuda::available()) {
    if (explicit_choice)
      KS_FAIL("trainer.device=cuda (from ", c.origin("trainer.device"), "): ", cuda::describe(),
              "; set trainer.device=cpu to train on the CPU");
    return Device::CPU;  // verl's default where no GPU is: the CPU backend
  }
  if (world_size > 1 && !comm::built_with_nccl()) {
    if (explicit_choice)
      KS_FAIL("trainer.device=cuda (from ", c.origin("trainer.device"), ") with ", world_size,
              " processes: this build has no NCCL transport (nccl.h was not found when it was configured); run one "
              "process on the GPU, or set trainer.device=cpu to train over MPI on the CPU");
    return Device::CPU;
  }
  cuda::init(world_size > 1 ? local_rank % std::max(1, cuda::device_count()) : 0);
  return Device::CUDA;
#else
  (void)world_size;
  (void)local_rank;
  if (explicit_choice)
    KS_FAIL("trainer.device=cuda (from ", c.origin("trainer.device"),
            "): this Kestrel build has no CUDA backend (build it with cmake --preset cuda on a machine with the CUDA "
            "toolkit); set trainer.device=cpu, or leave trainer.device unset (verl's default cuda then runs on the "
            "CPU)");
  return Device::CPU;
#endif
}

void check_offload_on_device(const config::Config& c, Device dev) {
  // Read on every device: on the CPU they move nothing (host memory already), which their docs say.
  // param_offload / grad_offload act on the GPU (CausalLM::offload_to_host), read by the options.
  for (const char* k : {"actor_rollout_ref.model.enable_activation_offload", "actor_rollout_ref.actor.fsdp_config.offload_policy",
                        "actor_rollout_ref.ref.fsdp_config.offload_policy", "critic.model.enable_activation_offload",
                        "critic.model.fsdp_config.offload_policy"}) {
    if (!c.get_bool(k) || dev == Device::CPU) continue;
    KS_FAIL("not supported yet: ", k, "=true (from ", c.origin(k), ") on ", device_name(dev),
            ": activation offload and FSDP2's offload_policy (parameters streamed per layer during compute) are "
            "not built for the GPU yet (param_offload, grad_offload, optimizer_offload and "
            "override_transformer_config.swap_optimizer are); set it to false");
  }
}

Result<int64_t> device_total_memory() {
  // KESTREL_DEVICE_MEMORY overrides the device's size as it does the host's (rollout::device_memory_bytes reads it).
  if (const char* env = std::getenv("KESTREL_DEVICE_MEMORY"); env && *env) return rollout::device_memory_bytes(1);
#if KESTREL_HAVE_CUDA
  return cuda::total_memory();
#else
  return KS_ERR("internal: device memory asked of a build without the CUDA backend");
#endif
}

void check_launch(const config::Config& c, int world_size) {
  const bool set = c.origin("trainer.n_gpus_per_node") != "default" || c.origin("trainer.nnodes") != "default";
  const int64_t per_node = c.get_int("trainer.n_gpus_per_node"), nodes = c.get_int("trainer.nnodes");
  if (set && per_node * nodes != world_size)
    KS_FAIL("trainer.n_gpus_per_node=", per_node, " x trainer.nnodes=", nodes, " = ", per_node * nodes,
            " processes, but this run has ", world_size, " (from ", c.origin("trainer.n_gpus_per_node"),
            "): launch with mpirun -np ", per_node * nodes, " kestrel train ..., or set trainer.n_gpus_per_node=",
            world_size, " trainer.nnodes=1 (Kestrel runs one process per device)");
}

}  // namespace kestrel::cli
