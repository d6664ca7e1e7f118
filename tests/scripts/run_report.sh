#!/usr/bin/env bash
# The HTML run report (train/run_report.h): kestrel train and kestrel sft
# write RUN_DIR/report.html at the end; headless Chromium (Debian's
# chromium-headless-shell, installed by scripts/install_deps.sh) renders it,
# and the rendered DOM must hold every plot, one point per logged step with the
# value metrics.jsonl has, the stage timeline and the config; the page has no
# script and loads nothing; a screenshot renders. kestrel report rebuilds it
# (other timeline step) and refuses a folder that is not a run.
# usage: bash tests/scripts/run_report.sh <kestrel-binary> <build-dir>
set -uo pipefail
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1 OMP_NUM_THREADS=2
fail() { echo "run_report: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -20 "$W/log.txt" >&2; exit 1; }
CHROME=$(command -v chromium-headless-shell || command -v chromium || true)
[[ -n "$CHROME" ]] || fail "no headless Chromium: install chromium-headless-shell (scripts/install_deps.sh does)"
render() {  # render <html> <dom-out> <png-out>: the DOM after rendering, console messages in <dom-out>.log
  "$CHROME" --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0 --dump-dom "file://$1" \
    >"$2" 2>"$2.log" || fail "chromium could not render $1"
  "$CHROME" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1240,1900 --screenshot="$3" \
    "file://$1" >/dev/null 2>&1 || fail "chromium could not screenshot $1"
  [[ $(stat -c %s "$3") -gt 20000 ]] || fail "the screenshot of $1 is nearly empty"
  ! grep -q "CONSOLE\|Uncaught" "$2.log" || fail "console messages while rendering $1: $(grep CONSOLE "$2.log" | head -3)"
}
# Each metric's values in metrics.jsonl as "step value" lines.
metric() { grep -o "\"step\":[0-9]*\|\"$2\":[-0-9.eE+]*" "$1" | awk -F: '/"step"/ { s = $2; next } { print s, $2 }'; }
# The same from the rendered page: circles of the key.
points() { grep -o "<circle class=\"pt\" data-key=\"$2\" data-step=\"[0-9]*\" data-value=\"[^\"]*\"" "$1" |
             sed -E 's/.*data-step="([0-9]*)" data-value="([^"]*)"/\1 \2/'; }
same_numbers() {  # same_numbers <a> <b> <what>: the same steps, values equal to 1e-12 relative
  paste -d' ' "$1" "$2" | awk -v what="$3" '
    { if ($1 != $3) { printf "%s: step %s vs %s\n", what, $1, $3; bad = 1 }
      d = $2 - $4; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2;
      if (d > 1e-12 * m + 1e-300) { printf "%s: step %s: %s vs %s\n", what, $1, $2, $4; bad = 1 } }
    END { exit bad }' || fail "$3: the page's points differ from metrics.jsonl"
  [[ $(wc -l <"$1") -eq $(wc -l <"$2") && $(wc -l <"$1") -gt 0 ]] || fail "$3: $(wc -l <"$2") points for $(wc -l <"$1") logged steps"
}

# ---- kestrel train ---------------------------------------------------------------------------
R="$W/rl"
"$KESTREL" train actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=4 actor_rollout_ref.rollout.n=4 \
  data.max_response_length=12 data.val_max_samples=8 data.train_max_samples=64 actor_rollout_ref.actor.ppo_mini_batch_size=2 \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.entropy_coeff=0.01 actor_rollout_ref.actor.optim.lr=1e-3 \
  trainer.total_training_steps=5 trainer.save_freq=5 trainer.test_freq=2 "trainer.logger=[]" \
  trainer.default_local_dir="$R" >"$W/log.txt" 2>&1 || fail "kestrel train"
grep -q "run report: $R/report.html" "$W/log.txt" || fail "train did not say where the report is"
[[ -f "$R/report.html" && -f "$R/run_info.json" ]] || fail "train wrote no report.html / run_info.json"
grep -q "<script" "$R/report.html" && fail "the report has a script"
grep -o 'src="[^"]*"\|href="[^"]*"' "$R/report.html" | grep -q . && fail "the report loads something"
render "$R/report.html" "$W/rl.dom" "$W/rl.png"
for p in reward val_acc kl entropy response_length grad_norm throughput; do
  tr -d '\n' <"$W/rl.dom" |
    grep -q "<figure class=\"metric\" data-plot=\"$p\"><figcaption>[^<]*</figcaption><svg class=\"plot\" id=\"plot-$p\"" ||
    fail "plot $p is missing or empty in the rendered page"
done
for k in critic/score/mean actor/entropy actor/kl_loss response_length/mean actor/grad_norm perf/throughput \
         val-core/arith/acc/mean@1; do
  metric "$R/metrics.jsonl" "$k" >"$W/want.txt"
  points "$W/rl.dom" "$k" >"$W/got.txt"
  same_numbers "$W/want.txt" "$W/got.txt" "$k"
done
grep -q '<svg class="timeline" id="timeline"' "$W/rl.dom" || fail "no stage timeline"
for st in gen reward update_actor update_weights; do
  grep -q "data-stage=\"$st\"" "$W/rl.dom" || fail "timeline has no $st stage"
done
grep -q "Step 5:" "$W/rl.dom" || fail "the timeline is not of the last step"
grep -q '<pre id="config">' "$W/rl.dom" && grep -q "total_training_steps: 5" "$W/rl.dom" || fail "the config is missing"
grep -q "threads per rank" "$W/rl.dom" && grep -q "GEMM" "$W/rl.dom" || fail "the environment is missing"
echo "run_report: train report renders with every plot matching metrics.jsonl"

# kestrel report: another timeline step, another file.
"$KESTREL" report "$R" --step 2 --out "$W/step2.html" >"$W/log.txt" 2>&1 || fail "kestrel report --step 2"
grep -q "Step 2:" "$W/step2.html" || fail "kestrel report --step 2 did not show step 2"
if "$KESTREL" report "$W/cache" >"$W/log.txt" 2>&1; then fail "kestrel report accepted a folder without metrics.jsonl"; fi
grep -q "metrics.jsonl does not exist" "$W/log.txt" || fail "kestrel report's error does not name metrics.jsonl"
[[ ! -e "$W/cache/report.html" ]] || fail "a refused report left a file"

# ---- kestrel sft -----------------------------------------------------------------------------
S="$W/sft"
"$KESTREL" sft model.partial_pretrain=builtin:tiny data.arith.num_train=64 data.arith.num_test=8 data.train_batch_size=16 \
  data.max_token_len_per_gpu=1024 trainer.total_training_steps=4 trainer.save_freq=4 trainer.test_freq=2 \
  trainer.default_local_dir="$S" trainer.export_dir="$S/final" >"$W/log.txt" 2>&1 || fail "kestrel sft"
[[ -f "$S/report.html" ]] || fail "sft wrote no report.html"
render "$S/report.html" "$W/sft.dom" "$W/sft.png"
for p in loss val_loss grad_norm throughput; do
  grep -q "id=\"plot-$p\"" "$W/sft.dom" || fail "sft plot $p is missing"
done
metric "$S/metrics.jsonl" train/loss >"$W/want.txt"
points "$W/sft.dom" train/loss >"$W/got.txt"
same_numbers "$W/want.txt" "$W/got.txt" train/loss
echo "run_report: sft report renders"
echo "run_report: passed"
