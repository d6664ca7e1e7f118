// Expert parallelism's keys of kestrel train (options.h's read_expert_parallel):
// Megatron's <owner>.megatron.expert_model_parallel_size and
// expert_tensor_parallel_size for the actor, the reference model and the
// critic, which all run on the actor's process grid.
#include "cli/options.h"

namespace kestrel::cli {

namespace {

struct EpKeys {
  int64_t ep = 1, etp = 1;
  std::string ep_key, etp_key;
};

EpKeys read_one(const config::Config& c, const std::string& meg, int64_t tp) {
  EpKeys k;
  k.ep_key = meg + ".expert_model_parallel_size";
  k.etp_key = meg + ".expert_tensor_parallel_size";
  k.ep = c.get_int(k.ep_key);
  if (k.ep < 1) KS_FAIL(c.origin(k.ep_key), ": ", k.ep_key, "=", k.ep, " must be >= 1");
  // Megatron's default (null) is the attention's tensor-parallel size.
  k.etp = c.is_null(k.etp_key) ? tp : c.get_int(k.etp_key);
  if (k.etp < 1) KS_FAIL(c.origin(k.etp_key), ": ", k.etp_key, "=", k.etp, " must be >= 1 or null");
  return k;
}

}  // namespace

EpSettings read_expert_parallel(const config::Config& c, int64_t tp, bool ref, bool critic) {
  const EpKeys actor = read_one(c, "actor_rollout_ref.actor.megatron", tp);
  // Read whether or not each model is on, so a setting is checked (never silently ignored) either way.
  const EpKeys r = read_one(c, "actor_rollout_ref.ref.megatron", tp);
  const EpKeys cr = read_one(c, "critic.megatron", c.get_int("critic.megatron.tensor_model_parallel_size"));
  // The reference and the critic run on the actor's process grid: their ep and etp must be its.
  auto same = [&](bool on, const EpKeys& o, const char* who) {
    const auto differs = [&](int64_t mine, int64_t theirs, const std::string& key, const std::string& akey) {
      if (on && mine != theirs)
        KS_FAIL("not supported yet: ", key, "=", mine, " (from ", c.origin(key), ") differs from ", akey, "=", theirs,
                " (from ", c.origin(akey), "): the ", who, " runs on the actor's process grid; set both alike");
    };
    differs(o.ep, actor.ep, o.ep_key, actor.ep_key);
    differs(o.etp, actor.etp, o.etp_key, actor.etp_key);
  };
  same(ref, r, "reference model");
  same(critic, cr, "critic");
  EpSettings s;
  s.ep = actor.ep;
  s.etp = actor.etp;
  s.size_key = actor.ep_key;
  // The rollout's: every expert on each rank (1), or the actor's experts in place on its ep group.
  const std::string rk = "actor_rollout_ref.rollout.expert_parallel_size";
  s.rollout_ep = c.get_int(rk);
  if (s.rollout_ep < 1) KS_FAIL(c.origin(rk), ": ", rk, "=", s.rollout_ep, " must be >= 1");
  if (s.rollout_ep != 1 && s.rollout_ep != s.ep)
    KS_FAIL(c.origin(rk), ": not supported yet: ", rk, "=", s.rollout_ep, " other than 1 (every expert on each rank) "
            "or ", actor.ep_key, "=", s.ep, " (the actor's experts in place)");
  const std::string rtk = "actor_rollout_ref.rollout.tensor_model_parallel_size";
  if (s.rollout_ep > 1 && s.etp != tp)
    KS_FAIL(c.origin(rk), ": not supported yet: ", rk, "=", s.rollout_ep, " with ", actor.etp_key, "=", s.etp,
            " other than the tensor-parallel size ", tp, " (the expert-parallel rollout reads the actor's experts in "
            "place, split like its own tp group)");
  if (s.rollout_ep > 1 && c.get_int(rtk) != tp)
    KS_FAIL(c.origin(rk), ": not supported yet: ", rk, "=", s.rollout_ep, " with ", rtk, "=", c.get_int(rtk),
            " other than the actor's ", tp, " (the expert-parallel rollout reads the actor's weights in place)");
  return s;
}

void check_expert_parallel_model(const config::Config& c, const EpSettings& s, const io::ModelConfig& cfg,
                                 const std::string& model) {
  if (s.ep == 1) return;
  if (cfg.moe.num_experts <= 0)
    KS_FAIL(c.origin(s.size_key), ": ", s.size_key, "=", s.ep, " splits the routed experts of a mixture-of-"
            "experts model over ranks, but ", model, " is dense (no num_experts in its config.json); set it to 1");
  if (cfg.moe.num_experts % s.ep != 0)
    KS_FAIL(c.origin(s.size_key), ": ", s.size_key, "=", s.ep, " must divide the model's ", cfg.moe.num_experts,
            " routed experts (", model, "); choose a divisor of ", cfg.moe.num_experts);
}

}  // namespace kestrel::cli
