#!/usr/bin/env bash
# kestrel train on builtin:tiny-qwen3-moe under mpirun -np 2 (aux and z losses), with router replay R2
# and with R3:
#  - PP2: each stage holds two of the four MoE layers; the router metrics gathered over the stages
#    (world rank 0 logs the whole model); R2: the old-log-prob routing record combined over the stages
#    and replayed in the update; R3: the rollout's routing sent to every rank with the responses and
#    replayed by each stage's layers: every step's metrics equal one process's within 1e-6 relative;
#  - DP2: runs and logs every router metric (each dp rank's micro-batches differ from one process's,
#    and so do their load-balancing losses, as in Megatron); and a DP2 run where one rank's sequences all
#    have a zero policy gradient (it still runs their forwards: the router statistics are reduced layer
#    by layer over dp).
# usage: bash tests/scripts/moe_mpi_train.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env moe_mpi_train "$BUILD"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1
fail() { echo "moe_mpi_train: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -30 "$W/log.txt" >&2; exit 1; }

OT=actor_rollout_ref.actor.megatron.override_transformer_config
COMMON=(actor_rollout_ref.model.path=builtin:tiny-qwen3-moe data.train_batch_size=4 actor_rollout_ref.rollout.n=2
        data.max_response_length=8 data.val_max_samples=4 data.train_max_samples=64
        actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.entropy_coeff=0.01
        actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.optim.eps=1e-5 trainer.test_freq=-1
        trainer.val_before_train=false "trainer.logger=[]" trainer.resume_mode=disable trainer.total_training_steps=3
        "+$OT.moe_aux_loss_coeff=0.01" "+$OT.moe_z_loss_coeff=0.001")
multi() { timeout -k 5 300 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" train "${COMMON[@]}" "$@" \
            >"$W/log.txt" 2>&1 || fail "mpirun -np 2: $*"; }
R3=(actor_rollout_ref.actor.router_replay.mode=R3 actor_rollout_ref.rollout.enable_rollout_routing_replay=true)
for mode in R2 R3; do
  REPLAY=(actor_rollout_ref.actor.router_replay.mode=R2)
  [ $mode = R3 ] && REPLAY=("${R3[@]}")
  "$KESTREL" train "${COMMON[@]}" "${REPLAY[@]}" trainer.default_local_dir="$W/$mode/one" >"$W/log.txt" 2>&1 ||
    fail "one process ($mode)"
  multi "${REPLAY[@]}" trainer.default_local_dir="$W/$mode/pp2" actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2
  multi "${REPLAY[@]}" trainer.default_local_dir="$W/$mode/dp2"
  python3 - "$W/$mode" <<'EOF' || fail "metrics ($mode)"
import json, sys
w = sys.argv[1]
rows = lambda d: [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl")]
one, pp2, dp2 = rows("one"), rows("pp2"), rows("dp2")
keys = [f"actor/moe_{k}" for k in ("aux_loss", "z_loss", "max_load", "min_load", "dropped_tokens")]
assert len(one) == len(pp2) == len(dp2) == 3, (len(one), len(pp2), len(dp2))
for a, b, c in zip(one, pp2, dp2):
    for k in keys + ["actor/grad_norm", "actor/entropy", "critic/score/mean"]:
        assert abs(a[k] - b[k]) <= 1e-6 * max(1.0, abs(a[k])), f"step {a['step']} {k}: one {a[k]} pp2 {b[k]}"
    for k in keys:
        assert k in c, f"dp2 step {c['step']}: no {k}"
    assert a["actor/moe_aux_loss"] > 0 and a["actor/moe_z_loss"] > 0
EOF
done

# DP2 without router losses, where only dp rank 0's prompts (0 and 1 of each step, balance_batch off) score:
# rank 1's sequences all have a zero policy gradient, and it still takes part in every reduction.
cat >"$W/reward.sh" <<'SH'
while read -r l; do i=${l#\{\"id\":}; i=${i%%,*}; if [ "$i" -lt 4 ]; then expr length "$l" % 5; else echo 0; fi; done
SH
NOLOSS=()
for a in "${COMMON[@]}"; do [[ $a == +$OT.* ]] || NOLOSS+=("$a"); done
timeout -k 5 300 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" train "${NOLOSS[@]}" \
  actor_rollout_ref.actor.entropy_coeff=0 trainer.balance_batch=false "reward_model.reward_command=bash $W/reward.sh" \
  trainer.default_local_dir="$W/dp2_zero" >"$W/log.txt" 2>&1 || fail "DP2 with one rank's gradient zero"
grep -q '"actor/grad_norm":[1-9]\|"actor/grad_norm":0\.[0-9]*[1-9]' "$W/dp2_zero/metrics.jsonl" || fail "DP2: no update"
echo "moe_mpi_train: OK (R2 and R3: PP2 equals one process with the router metrics of every stage; DP2 logs them;"\
     "a dp rank without a policy gradient joins every reduction)"
