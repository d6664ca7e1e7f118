#!/usr/bin/env bash
# kestrel train under expert parallelism (actor_rollout_ref.actor.megatron.expert_model_parallel_size) equals one
# process: a short GRPO run with the KL loss (the reference model under EP too) on the tiny Qwen3-MoE and
# DeepSeek-V3 models, no router losses (with them each dp rank's micro-batches would differ from one process's,
# as in Megatron):
#  - EP2 (mpirun -np 2), EP2 x TP2 (sequence parallel; the rollout's copy at tp 1, or the rollout on the actor's
#    EP2 x TP2 layout in place), EP4 and EP2 x DP2 (-np 4: the experts' gradients summed over the expert-data-parallel
#    group), EP2 x PP2 (its folder scoring as one process's too), the allgather (default) and alltoall dispatchers, the hierarchical alltoallv over two test "nodes", EP2 with dynamic micro-batches (the ranks' micro-batch counts made equal: every MoE layer's
#    dispatch is collective), and GAE with a mixture-of-experts critic under EP2: every step's losses, grad norm,
#    KL, entropy and rewards within 1e-4 relative of one process's;
#  - the rollout on the actor's ep group (rollout.expert_parallel_size=2: the experts read in place, the ranks
#    stepping in lockstep) gives the same run;
#  - the weights saved under EP2 (one HF folder: every expert gathered to the writer) score as one process's do;
#  - a checkpoint saved under EP2 (and under EP2 x PP2, and EP2 x TP2) resumes under EP1 (weights and the optimizer's experts)
#    and its next step equals the uninterrupted run's;
#  - EP2 x DP2 with the distributed optimizer (the dense AdamW state sharded over dp, the experts' over the
#    expert-data-parallel group) on both models equals one process, its folder scores alike, and its step-2
#    checkpoint resumes in one process like the uninterrupted run; the engine-level EpDistOpt gtests (mpi_tests,
#    4 ranks: sharding, 3 steps, the optimizer checkpoint between one process and EP2 x DP2 bit for bit);
#  - EP2 x PP2 with two virtual stages per rank equals one process too;
#  - EP2 with ETP2 (TP1) and TP2 with ETP1 equal one process, the former's checkpoint resuming in one process;
#  - refusals name the key: EP with a dense model, with context parallelism (not built yet), a reference model
#    on another expert layout.
# usage: bash tests/scripts/mpi_ep_train.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env mpi_ep_train "$BUILD"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1
fail() { echo "mpi_ep_train: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -30 "$W/log.txt" >&2; exit 1; }

A=actor_rollout_ref.actor.megatron
EP=$A.expert_model_parallel_size
# The reward program scores a response by the length of its request line (without the "id") mod 5, so groups
# differ and the policy gradient is not zero; Adam's eps 1e-5 keeps summation-order noise in near-zero
# gradients from becoming lr-sized steps (as tests/scripts/mpi_train.sh).
COMMON=(data.train_batch_size=4 actor_rollout_ref.rollout.n=2
        data.max_response_length=8 data.val_max_samples=4 data.train_max_samples=64
        actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.use_kl_loss=true
        actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.optim.eps=1e-5
        trainer.test_freq=-1 trainer.val_before_train=false "trainer.logger=[]" trainer.total_training_steps=3
        trainer.save_freq=2
        'reward_model.reward_command=while read -r l; do expr length "$(echo "$l" | cut -d, -f2-)" % 5; done')
run() {  # run <np> <dir> <overrides...>
  local np=$1 dir=$2
  shift 2
  if [[ $np == 1 ]]; then
    "$KESTREL" train "${COMMON[@]}" trainer.default_local_dir="$W/$dir" "$@" >"$W/log.txt" 2>&1 || fail "one process: $dir"
  else
    timeout -k 5 300 mpirun -np "$np" --oversubscribe --bind-to none "$KESTREL" train "${COMMON[@]}" \
      trainer.default_local_dir="$W/$dir" "$@" >"$W/log.txt" 2>&1 || fail "mpirun -np $np: $dir"
  fi
}
KEYS='actor/pg_loss actor/kl_loss actor/entropy actor/grad_norm actor/ppo_kl critic/score/mean response_length/mean
      critic/vf_loss critic/grad_norm'
source "$(dirname "$0")/lib/compare_runs.sh"

for model in tiny-qwen3-moe tiny-deepseek-v3; do
  M=(actor_rollout_ref.model.path=builtin:$model trainer.resume_mode=disable)
  run 1 "$model/one" "${M[@]}"
  run 2 "$model/ep2" "${M[@]}" $EP=2
  same_metrics "$W/$model/one" "$W/$model/ep2" "$model EP2"
  grep -q '"actor/moe_ep_max_rank_load":' "$W/$model/ep2/metrics.jsonl" || fail "$model EP2: no per-rank load metric"
  # The rollout on the actor's ep group (its experts in place, steps in lockstep) instead of a whole copy.
  run 2 "$model/ep2_rollout_ep2" "${M[@]}" $EP=2 actor_rollout_ref.rollout.expert_parallel_size=2
  same_metrics "$W/$model/one" "$W/$model/ep2_rollout_ep2" "$model EP2 with rollout EP2"
  same_logprobs "$W/$model/one/global_step_3/actor/model" "$W/$model/ep2/global_step_3/actor/model" "$model EP2"
  # EP2 x TP2 (4 ranks, sequence parallel: each expert's FFN split over the tp group, MLA's heads too), with
  # the rollout's whole copy at tp 1 and on the actor's layout in place (rollout EP2 x TP2).
  run 4 "$model/ep2_tp2" "${M[@]}" $EP=2 $A.tensor_model_parallel_size=2 $A.sequence_parallel=true
  same_metrics "$W/$model/one" "$W/$model/ep2_tp2" "$model EP2 x TP2"
  same_logprobs "$W/$model/one/global_step_3/actor/model" "$W/$model/ep2_tp2/global_step_3/actor/model" \
    "$model EP2 x TP2"
  run 4 "$model/ep2_tp2_rollout_ep2" "${M[@]}" $EP=2 $A.tensor_model_parallel_size=2 $A.sequence_parallel=true \
    actor_rollout_ref.rollout.expert_parallel_size=2 actor_rollout_ref.rollout.tensor_model_parallel_size=2
  same_metrics "$W/$model/one" "$W/$model/ep2_tp2_rollout_ep2" "$model EP2 x TP2 with rollout EP2 x TP2"
done

M=(actor_rollout_ref.model.path=builtin:tiny-qwen3-moe trainer.resume_mode=disable)
ONE="$W/tiny-qwen3-moe/one"
# Four ranks (dp 4 for the dense part): 8 prompts in one mini-batch (with two, each dp rank's half of its share
# would make another mini-batch than one process's first four prompts).
B8=(data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8)
run 1 one_b8 "${M[@]}" "${B8[@]}"
run 4 ep4 "${M[@]}" "${B8[@]}" $EP=4
same_metrics "$W/one_b8" "$W/ep4" "EP4"
run 4 ep2_dp2 "${M[@]}" "${B8[@]}" $EP=2
same_metrics "$W/one_b8" "$W/ep2_dp2" "EP2 x DP2"
# EP2 x PP2 (4 ranks: each stage's two ranks share its layers' experts; dp 2): the stages' experts
# gathered for the rollout's copy and the saved folder.
run 4 ep2_pp2 "${M[@]}" "${B8[@]}" $EP=2 $A.pipeline_model_parallel_size=2
same_metrics "$W/one_b8" "$W/ep2_pp2" "EP2 x PP2"
same_logprobs "$W/one_b8/global_step_3/actor/model" "$W/ep2_pp2/global_step_3/actor/model" "EP2 x PP2"
# Expert tensor parallelism other than tp: EP2 with each expert split over ETP2 at TP1 (4 ranks: dp 4, edp 1;
# the rows of an etp group's ranks gathered to every shard), and TP2 with whole experts (ETP1, 2 ranks; the
# rollout copy on the tp group splits them like its heads).
run 4 ep2_etp2 "${M[@]}" "${B8[@]}" $EP=2 $A.expert_tensor_parallel_size=2
same_metrics "$W/one_b8" "$W/ep2_etp2" "EP2 with ETP2"
run 2 tp2_etp1 "${M[@]}" $A.tensor_model_parallel_size=2 $A.sequence_parallel=true $A.expert_tensor_parallel_size=1
same_metrics "$ONE" "$W/tp2_etp1" "TP2 with ETP1"
# EP2 x PP2 with two virtual stages per rank (the interleaved schedule; each chunk's MoE layers dispatch over
# the stage's ep group in the schedule's order, the same on both ep ranks).
run 4 ep2_pp2_vpp2 "${M[@]}" "${B8[@]}" $EP=2 $A.pipeline_model_parallel_size=2 $A.virtual_pipeline_model_parallel_size=2
same_metrics "$W/one_b8" "$W/ep2_pp2_vpp2" "EP2 x PP2 x VPP2"
# And with the distributed optimizer: each stage's experts sharded over its edp group (dp 2 here, edp 1).
run 4 ep2_pp2_do "${M[@]}" "${B8[@]}" $EP=2 $A.pipeline_model_parallel_size=2 $A.use_distributed_optimizer=true
same_metrics "$W/one_b8" "$W/ep2_pp2_do" "EP2 x PP2 distributed optimizer"
# The token dispatchers: allgather (Megatron's default, the runs above), alltoall, and alltoall through the
# hierarchical exchange over two test "nodes" of two ranks each.
OT=actor_rollout_ref.actor.megatron.override_transformer_config
run 4 ep4_a2a "${M[@]}" "${B8[@]}" $EP=4 "+$OT.moe_token_dispatcher_type=alltoall"
same_metrics "$W/one_b8" "$W/ep4_a2a" "EP4 alltoall"
KESTREL_TEST_NODES=0,0,1,1 run 4 ep4_hier "${M[@]}" "${B8[@]}" $EP=4 "+$OT.moe_token_dispatcher_type=alltoall" \
  "+$OT.moe_hierarchical_alltoallv=true"
same_metrics "$W/one_b8" "$W/ep4_hier" "EP4 hierarchical alltoallv"
# Dynamic micro-batches of at most 40 tokens: the two ranks may form different counts, evened out.
DYN=(actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40
     actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=40
     actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=40)
run 2 ep2_dyn "${M[@]}" $EP=2 "${DYN[@]}"
same_metrics "$ONE" "$W/ep2_dyn" "EP2 with dynamic micro-batches"
# GAE with a mixture-of-experts critic under EP2. Adam's eps 1e-3 here: at 1e-5 the rounding noise of the
# experts' GEMMs over other row counts (EP gathers both ranks' rows per expert) in near-zero gradient elements
# became lr-sized steps once the KL loss, the critic and two mini-batches combined, and with OpenBLAS's kernels
# the actor ended ~2e-4 off one process from step 2; at eps 1e-3 it stays within 1e-7 (measured), as do the
# GRPO runs above at 1e-5.
GAE=(algorithm.adv_estimator=gae critic.optim.lr=1e-3 critic.optim.eps=1e-3 actor_rollout_ref.actor.optim.eps=1e-3)
run 1 gae_one "${M[@]}" "${GAE[@]}"
run 2 gae_ep2 "${M[@]}" "${GAE[@]}" $EP=2
same_metrics "$W/gae_one" "$W/gae_ep2" "GAE EP2"

# EP2 x DP2 with the distributed optimizer on both models (the dense AdamW state sharded over dp, the experts'
# over the expert-data-parallel group, gathered after each step): the same run as one process's, and the saved
# folder scores as one process's.
DO=$A.use_distributed_optimizer=true
for model in tiny-qwen3-moe tiny-deepseek-v3; do
  MB=(actor_rollout_ref.model.path=builtin:$model trainer.resume_mode=disable "${B8[@]}")
  one="$W/one_b8"
  if [[ $model != tiny-qwen3-moe ]]; then
    one="$W/$model/one_b8"
    run 1 "$model/one_b8" "${MB[@]}"
  fi
  run 4 "$model/ep2_dp2_do" "${MB[@]}" $EP=2 "$DO"
  same_metrics "$one" "$W/$model/ep2_dp2_do" "$model EP2 x DP2 distributed optimizer"
  same_logprobs "$one/global_step_3/actor/model" "$W/$model/ep2_dp2_do/global_step_3/actor/model" \
    "$model EP2 x DP2 distributed optimizer"
done

# A checkpoint of EP2's step 2 resumes in one process (EP1): step 3 equals the uninterrupted EP2 run's.
mkdir -p "$W/resume"
cp -r "$W/tiny-qwen3-moe/ep2/global_step_2" "$W/resume/"
echo 2 >"$W/resume/latest_checkpointed_iteration.txt"
head -n 2 "$W/tiny-qwen3-moe/ep2/metrics.jsonl" >"$W/resume/metrics.jsonl"
run 1 resume actor_rollout_ref.model.path=builtin:tiny-qwen3-moe trainer.resume_mode=auto
grep -q "resum" "$W/log.txt" || fail "EP1 did not say it resumed"
same_metrics "$W/tiny-qwen3-moe/ep2" "$W/resume" "EP2 checkpoint resumed under EP1" 3
# An EP2 with ETP2 checkpoint (each expert's state gathered over etp, then ep) in one process.
mkdir -p "$W/resume_etp"
cp -r "$W/ep2_etp2/global_step_2" "$W/resume_etp/"
echo 2 >"$W/resume_etp/latest_checkpointed_iteration.txt"
head -n 2 "$W/ep2_etp2/metrics.jsonl" >"$W/resume_etp/metrics.jsonl"
run 1 resume_etp actor_rollout_ref.model.path=builtin:tiny-qwen3-moe "${B8[@]}" trainer.resume_mode=auto
same_metrics "$W/ep2_etp2" "$W/resume_etp" "EP2 with ETP2 checkpoint resumed in one process" 3
# An EP2 x TP2 checkpoint of DeepSeek-V3 (each expert's shards gathered over tp, then ep) in one process.
mkdir -p "$W/resume_tp"
cp -r "$W/tiny-deepseek-v3/ep2_tp2/global_step_2" "$W/resume_tp/"
echo 2 >"$W/resume_tp/latest_checkpointed_iteration.txt"
head -n 2 "$W/tiny-deepseek-v3/ep2_tp2/metrics.jsonl" >"$W/resume_tp/metrics.jsonl"
run 1 resume_tp actor_rollout_ref.model.path=builtin:tiny-deepseek-v3 trainer.resume_mode=auto
same_metrics "$W/tiny-deepseek-v3/ep2_tp2" "$W/resume_tp" "EP2 x TP2 checkpoint resumed under EP1 TP1" 3
# And an EP2 x PP2 checkpoint (one optimizer file per stage, each with its layers' experts) in one process.
mkdir -p "$W/resume_pp"
cp -r "$W/ep2_pp2/global_step_2" "$W/resume_pp/"
echo 2 >"$W/resume_pp/latest_checkpointed_iteration.txt"
head -n 2 "$W/ep2_pp2/metrics.jsonl" >"$W/resume_pp/metrics.jsonl"
run 1 resume_pp actor_rollout_ref.model.path=builtin:tiny-qwen3-moe "${B8[@]}" trainer.resume_mode=auto
same_metrics "$W/ep2_pp2" "$W/resume_pp" "EP2 x PP2 checkpoint resumed under EP1 PP1" 3
# And an EP2 x DP2 distributed-optimizer checkpoint (the experts' state gathered over edp, then ep) in one process.
mkdir -p "$W/resume_do"
cp -r "$W/tiny-qwen3-moe/ep2_dp2_do/global_step_2" "$W/resume_do/"
echo 2 >"$W/resume_do/latest_checkpointed_iteration.txt"
head -n 2 "$W/tiny-qwen3-moe/ep2_dp2_do/metrics.jsonl" >"$W/resume_do/metrics.jsonl"
run 1 resume_do actor_rollout_ref.model.path=builtin:tiny-qwen3-moe "${B8[@]}" trainer.resume_mode=auto
same_metrics "$W/tiny-qwen3-moe/ep2_dp2_do" "$W/resume_do" "EP2 x DP2 distributed-optimizer checkpoint resumed in one process" 3

# The distributed optimizer under EP2 x DP2 at the engine level (tests/mpi/ep_distopt_test.cpp): the experts'
# AdamW state sharded over the expert-data-parallel group, 3 steps equal to one process, and the optimizer
# checkpoint moving between one process and EP2 x DP2 (gathered over edp and ep, scattered back) bit for bit.
timeout -k 5 300 mpirun -np 4 --oversubscribe --bind-to none "$BUILD/mpi_tests" --gtest_filter='EpDistOpt.*' \
  --gtest_color=no >"$W/log.txt" 2>&1 || fail "mpi_tests EpDistOpt.* under mpirun -np 4"

# Refusals naming the key.
refuse() {  # refuse <np> <expected message part> <overrides...>
  local np=$1 want=$2
  shift 2
  if timeout -k 5 120 mpirun -np "$np" --oversubscribe --bind-to none "$KESTREL" train "${COMMON[@]}" \
       trainer.resume_mode=disable trainer.default_local_dir="$W/refused" "$@" >"$W/log.txt" 2>&1; then
    fail "accepted: $*"
  fi
  grep -qF -- "$want" "$W/log.txt" || fail "refusal of '$*' does not say: $want"
}
"$KESTREL" train "${COMMON[@]}" actor_rollout_ref.model.path=builtin:tiny-qwen3-moe $EP=2 \
  trainer.default_local_dir="$W/refused1" >"$W/log.txt" 2>&1 && fail "one process accepted $EP=2"
grep -qF "$EP=2 x pipeline_model_parallel_size=1 = 2 must divide the number of processes (1)" "$W/log.txt" || fail "one process with $EP=2: no reason"
refuse 2 "$EP=2 splits the routed experts of a mixture-of-experts model" actor_rollout_ref.model.path=builtin:tiny $EP=2
refuse 4 "not supported yet: $EP=2 with context_parallel_size=2" \
  actor_rollout_ref.model.path=builtin:tiny-qwen3-moe $EP=2 $A.context_parallel_size=2
refuse 2 "actor_rollout_ref.ref.megatron.expert_model_parallel_size=1" \
  actor_rollout_ref.model.path=builtin:tiny-qwen3-moe $EP=2 actor_rollout_ref.ref.megatron.expert_model_parallel_size=1
refuse 2 "not supported yet: actor_rollout_ref.rollout.expert_parallel_size=2 other than 1" \
  actor_rollout_ref.model.path=builtin:tiny-qwen3-moe actor_rollout_ref.rollout.expert_parallel_size=2
echo "mpi_ep_train: OK (EP2, EP2 x TP2 (rollout copy and in place), EP4, EP2 x DP2, EP2 x DP2 with the distributed optimizer, EP2 x PP2 (with and without it), EP2 x PP2 x VPP2, EP2 with ETP2, TP2 with ETP1, rollout EP2, both dispatchers, dynamic micro-batches and a GAE critic equal one process on Qwen3-MoE and" \
     "DeepSeek-V3; the EP2, EP2 x PP2 and EP2 x DP2 distributed-optimizer folders score alike; their checkpoints resume under EP1; refusals name the keys)"
