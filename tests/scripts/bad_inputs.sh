#!/usr/bin/env bash
# The bad-input table (issue 20): every command given broken model files,
# configs, datasets, checkpoints, outputs and flags. Each case asserts a
# non-zero exit below 128 (no crash signal), a message naming the file, line or
# key (grep), no output left under its final name, and for the checkpoint
# cases that the previous checkpoint is byte-identical afterwards. The parser
# crash cases (tokenizer ids, YAML aliases, template and JSON depth,
# --threads) are in bad_inputs_parsers.sh. docs/reliability.md lists the table.
# Tiny model, tiny data: under 2 minutes on 2 loaded cores.
# Usage: bad_inputs.sh <kestrel-binary> <build-dir>
set -uo pipefail
KESTREL=$(realpath "$1")
W=$(mktemp -d)
trap 'chmod -R u+w "$W" 2>/dev/null; rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1 OMP_NUM_THREADS=1
K() { "$KESTREL" "$@"; }
PASS=0
FAILED=()

# bad NAME REGEX [--absent PATH]... [--same DIR]... -- COMMAND...
#   REGEX: extended regex the output (stdout + stderr) must match.
#   --absent PATH: must not exist afterwards (no partial output under a final name).
#   --same DIR: checksummed before and after; must be unchanged.
bad() {
  local name=$1 re=$2
  shift 2
  local absent=() same=()
  while [ "$1" != -- ]; do
    case $1 in
      --absent) absent+=("$2"); shift 2 ;;
      --same) same+=("$2"); shift 2 ;;
      *) echo "bad(): unknown option $1"; exit 2 ;;
    esac
  done
  shift
  [ "$1" = K ] && set -- "$KESTREL" "${@:2}"
  local sums_before=() d p
  for p in "${absent[@]}"; do rm -rf "$p"; done
  for d in "${same[@]}"; do sums_before+=("$(cd "$d" && find . -type f -print0 | sort -z | xargs -0 sha256sum)"); done
  timeout 120 "$@" >"$W/out.txt" 2>&1 </dev/null
  local rc=$? why=""
  if [ "$rc" = 0 ]; then why="exit 0 (accepted)"
  elif [ "$rc" -ge 124 ]; then why="exit $rc (crash signal or timeout)"
  elif ! grep -Eq -- "$re" "$W/out.txt"; then why="message does not match /$re/"
  fi
  for p in "${absent[@]}"; do [ -e "$p" ] && why="$why; $p exists"; done
  local i=0
  for d in "${same[@]}"; do
    [ "$(cd "$d" && find . -type f -print0 | sort -z | xargs -0 sha256sum)" = "${sums_before[$i]}" ] ||
      why="$why; $d changed"
    i=$((i + 1))
  done
  if [ -z "$why" ]; then
    PASS=$((PASS + 1))
    [ -n "${VERBOSE:-}" ] && printf 'ok   %-40s %s\n' "$name" "$(grep -Em1 -- "$re" "$W/out.txt" | cut -c1-200)"
  else
    FAILED+=("$name")
    printf 'FAIL %s: %s\n' "$name" "$why"
    sed 's/^/    | /' "$W/out.txt" | tail -8
  fi
  return 0
}

# ---- fixtures -------------------------------------------------------------------------------------------------
K builtin tokenizer --out "$W/tok" >/dev/null 2>&1 || { echo "FAIL: builtin tokenizer"; exit 1; }
K builtin model tiny --out "$W/model" >/dev/null 2>&1 || { echo "FAIL: builtin model"; exit 1; }
[ -f "$W/model/config.json" ] && [ -f "$W/model/model.safetensors" ] || { echo "FAIL: builtin model files"; exit 1; }
M=$W/model
echo '{"input_ids": [1, 2, 3, 4]}' > "$W/ids.jsonl"
echo '{"text": "1 + 2 ="}' > "$W/text.jsonl"
printf '%s\n' '{"text": "1 + 2 ="}' '{"text": "1 +' > "$W/text_badline.jsonl"
echo '{"prompt": "1 + 2 ="}' > "$W/prompt.jsonl"
printf '%s\n' '{"input_ids": [1, 2]}' '{"input_ids": [1, 2' > "$W/ids_badline.jsonl"
: > "$W/empty.jsonl"
# A model folder copy with one thing broken.
broken() {  # broken NAME: prints a fresh copy's path
  rm -rf "$W/m_$1"
  cp -r "$M" "$W/m_$1"
  echo "$W/m_$1"
}
# Same-length edits of the safetensors header (JSON at the start of the file).
header_edit() {  # header_edit FILE SED-EXPR
  LC_ALL=C sed -i "$2" "$1"
}
ST=model.safetensors

# ---- model files (logprobs / generate) -------------------------------------------------------------------------
D=$(broken nofile); rm "$D/$ST"
bad model_missing_safetensors "$D.*(safetensors|no such|cannot open)" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken noconfig); rm "$D/config.json"
bad model_missing_config "$D/config.json" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
bad model_folder_missing "$W/nowhere" --absent "$W/o.jsonl" -- \
  K logprobs --model "$W/nowhere" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken trunc); head -c 300 "$M/$ST" > "$D/$ST"
bad model_truncated_safetensors "$ST" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken trunc_data); head -c $(( $(stat -c %s "$M/$ST") - 64 )) "$M/$ST" > "$D/$ST"
bad model_truncated_tensor_data "$ST" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken zero); : > "$D/$ST"
bad model_empty_safetensors "$ST" --absent "$W/o.jsonl" -- \
  K generate --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken hdr); printf '\xff\xff\xff\xff\xff\x00\x00\x00{' | dd of="$D/$ST" conv=notrunc status=none
bad model_header_length_huge "$ST" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken json); header_edit "$D/$ST" '1s/"dtype"/"dtyp\x22/'
bad model_header_bad_json "$ST" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken dtype); header_edit "$D/$ST" '1s/"F32"/"I32"/'
bad model_wrong_dtype "$ST: tensor .* is stored as I32 but is read as F32 weights" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken dtype_unknown); header_edit "$D/$ST" '1s/"F32"/"Q32"/'
bad model_unknown_dtype "$ST.*Q32" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken missing_tensor); header_edit "$D/$ST" '1s/model\.norm\.weight/model.nxrm.weight/'
bad model_missing_tensor "model\.norm\.weight" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
H=$(grep -o '"hidden_size": *[0-9]*' "$M/config.json" | grep -o '[0-9]*$')
D=$(broken shape); sed -i "s/\"hidden_size\": *$H/\"hidden_size\": $((H * 2))/" "$D/config.json"
bad model_shape_mismatch "(shape|hidden_size|expected)" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken cfg_json); echo '{"architectures": ["Qwen2ForCausalLM"], ' > "$D/config.json"
bad config_json_invalid "$D/config.json" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken cfg_arch); sed -i 's/ForCausalLM/ForMaskedLM/' "$D/config.json"
bad config_json_unknown_architecture "ForMaskedLM" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken cfg_type); sed -i "s/\"hidden_size\": *$H/\"hidden_size\": \"big\"/" "$D/config.json"
bad config_json_field_type "hidden_size" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken cfg_heads); sed -i 's/"num_attention_heads": *[0-9]*/"num_attention_heads": 0/' "$D/config.json"
bad config_json_zero_heads "num_attention_heads" --absent "$W/o.jsonl" -- \
  K generate --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"
D=$(broken cfg_missing); sed -i 's/"num_hidden_layers": *[0-9]*,//' "$D/config.json"
bad config_json_missing_field "num_hidden_layers" --absent "$W/o.jsonl" -- \
  K logprobs --model "$D" --input "$W/ids.jsonl" --output "$W/o.jsonl"

# ---- inputs of logprobs / generate / tokenize ------------------------------------------------------------------
bad logprobs_input_missing "$W/none.jsonl" --absent "$W/o.jsonl" -- \
  K logprobs --model "$M" --input "$W/none.jsonl" --output "$W/o.jsonl"
bad logprobs_malformed_line "ids_badline.jsonl:2" --absent "$W/o.jsonl" -- \
  K logprobs --model "$M" --input "$W/ids_badline.jsonl" --output "$W/o.jsonl"
echo '{"ids": [1, 2]}' > "$W/wrongfield.jsonl"
bad logprobs_wrong_field "wrongfield.jsonl:1.*input_ids" --absent "$W/o.jsonl" -- \
  K logprobs --model "$M" --input "$W/wrongfield.jsonl" --output "$W/o.jsonl"
echo '{"input_ids": [1, 99999999]}' > "$W/oov.jsonl"
bad logprobs_token_out_of_vocab "oov.jsonl:1.*99999999" --absent "$W/o.jsonl" -- \
  K logprobs --model "$M" --input "$W/oov.jsonl" --output "$W/o.jsonl"
{ printf '{"input_ids": ['; seq -s, 1 3000 | tr -d '\n'; printf ']}\n'; } | sed 's/\([0-9]\+\)/5/g' > "$W/long.jsonl"
bad logprobs_sequence_too_long "long.jsonl:1.*max_position_embeddings" --absent "$W/o.jsonl" -- \
  K logprobs --model "$M" --input "$W/long.jsonl" --output "$W/o.jsonl"
bad generate_prompt_too_long "long.jsonl:1: prompt of 3000 tokens .*actor_rollout_ref.rollout.max_model_len" --absent "$W/o.jsonl" -- \
  K generate --model "$M" --input "$W/long.jsonl" --output "$W/o.jsonl"
bad generate_malformed_line "ids_badline.jsonl:2" --absent "$W/o.jsonl" -- \
  K generate --model "$M" --input "$W/ids_badline.jsonl" --output "$W/o.jsonl"
D=$(broken notok); rm -f "$D/tokenizer.json" "$D/tokenizer_config.json"
bad generate_text_without_tokenizer "prompt.jsonl:1.*tokenizer.json" --absent "$W/o.jsonl" -- \
  K generate --model "$D" --input "$W/prompt.jsonl" --output "$W/o.jsonl"
bad generate_top_p_zero "actor_rollout_ref.rollout.top_p.*\(0, 1\]" --absent "$W/o.jsonl" -- \
  K generate --model "$M" --input "$W/ids.jsonl" --output "$W/o.jsonl" actor_rollout_ref.rollout.top_p=0
bad generate_temperature_negative "actor_rollout_ref.rollout.temperature.*>= 0" --absent "$W/o.jsonl" -- \
  K generate --model "$M" --input "$W/ids.jsonl" --output "$W/o.jsonl" actor_rollout_ref.rollout.temperature=-1
bad generate_response_length_zero "actor_rollout_ref.rollout.response_length.*>= 1" --absent "$W/o.jsonl" -- \
  K generate --model "$M" --input "$W/ids.jsonl" --output "$W/o.jsonl" actor_rollout_ref.rollout.response_length=0
bad generate_gpu_mem_util "gpu_memory_utilization.*\(0, 1\]" --absent "$W/o.jsonl" -- \
  K generate --model "$M" --input "$W/ids.jsonl" --output "$W/o.jsonl" actor_rollout_ref.rollout.gpu_memory_utilization=1.5
bad tokenize_tokenizer_missing "$W/notok" --absent "$W/o.jsonl" -- \
  K tokenize --tokenizer "$W/notok" --input "$W/text.jsonl" --output "$W/o.jsonl"
bad tokenize_malformed_line "text_badline.jsonl:2" --absent "$W/o.jsonl" -- \
  K tokenize --tokenizer "$W/tok" --input "$W/text_badline.jsonl" --output "$W/o.jsonl"
bad tokenize_wrong_field "ids.jsonl:1.*text" --absent "$W/o.jsonl" -- \
  K tokenize --tokenizer "$W/tok" --input "$W/ids.jsonl" --output "$W/o.jsonl"

# ---- outputs (AtomicFile, check_output_file) ------------------------------------------------------------------
echo keep > "$W/target.txt"; ln -sf "$W/target.txt" "$W/link.jsonl"
bad output_symlink "link.jsonl is a symlink" -- K tokenize --tokenizer "$W/tok" --input "$W/text.jsonl" --output "$W/link.jsonl"
[ -L "$W/link.jsonl" ] && [ "$(cat "$W/target.txt")" = keep ] || { echo "FAIL output_symlink: link replaced"; FAILED+=(output_symlink_kept); }
mkfifo "$W/fifo.jsonl"
bad output_fifo "fifo.jsonl is a FIFO" -- K logprobs --model "$M" --input "$W/ids.jsonl" --output "$W/fifo.jsonl"
[ -p "$W/fifo.jsonl" ] || { echo "FAIL output_fifo: FIFO replaced"; FAILED+=(output_fifo_kept); }
bad output_device_node "/dev/null is a device node" -- K tokenize --tokenizer "$W/tok" --input "$W/text.jsonl" --output /dev/null
bad output_is_folder "is a folder" -- K generate --model "$M" --input "$W/ids.jsonl" --output "$W/tok"
cp "$W/ids.jsonl" "$W/same.jsonl"
bad output_equals_input "same file as --input" -- K logprobs --model "$M" --input "$W/same.jsonl" --output "$W/same.jsonl"
cmp -s "$W/same.jsonl" "$W/ids.jsonl" || { echo "FAIL output_equals_input: input changed"; FAILED+=(input_kept); }
ln "$W/same.jsonl" "$W/hardlink.jsonl"
bad output_hardlink_of_input "same file as --input" -- K tokenize --tokenizer "$W/tok" --input "$W/same.jsonl" --output "$W/hardlink.jsonl"
bad output_folder_missing "folder $W/nodir does not exist" --absent "$W/nodir" -- \
  K tokenize --tokenizer "$W/tok" --input "$W/text.jsonl" --output "$W/nodir/o.jsonl"
mkdir -p "$W/ro"; chmod 555 "$W/ro"
if [ "$(id -u)" != 0 ]; then
  bad output_folder_unwritable "folder $W/ro is not writable" --absent "$W/ro/o.jsonl" -- \
    K tokenize --tokenizer "$W/tok" --input "$W/text.jsonl" --output "$W/ro/o.jsonl"
else  # root writes anywhere on a read-write filesystem: a read-only one (/proc) stands in
  bad output_folder_unwritable "(/proc.*(not writable|read-only|cannot create|Permission|No such))" -- \
    K tokenize --tokenizer "$W/tok" --input "$W/text.jsonl" --output /proc/kestrel_o.jsonl
fi
for i in $(seq 1 400); do echo '{"text": "1 + 2 = 3, 4 + 5 = 9, 6 + 7 = 13"}'; done > "$W/many.jsonl"
bad output_disk_full "(o_full.jsonl.*(write failed|File too large|No space))" --absent "$W/o_full.jsonl" -- \
  bash -c "ulimit -f 8; exec \"$KESTREL\" tokenize --tokenizer \"$W/tok\" --input \"$W/many.jsonl\" --output \"$W/o_full.jsonl\""
ls "$W" | grep -q 'o_full.jsonl.tmp' && { echo "FAIL output_disk_full: temp file left"; FAILED+=(disk_full_tmp); }

# ---- config show (the schema's ranges; file:line and overrides) -----------------------------------------------
bad config_lr_nan "actor_rollout_ref.actor.optim.lr' must be finite \(>= 0\), got 'nan' \(from command line\)" -- \
  K config show actor_rollout_ref.actor.optim.lr=nan
bad config_lr_negative "critic.optim.lr' must be >= 0" -- K config show critic.optim.lr=-1
bad config_train_batch_size_zero "data.train_batch_size' must be >= 1, got '0'" -- K config show data.train_batch_size=0
bad config_rollout_n_zero "actor_rollout_ref.rollout.n' must be >= 1" -- K config show actor_rollout_ref.rollout.n=0
bad config_total_steps_zero "trainer.total_training_steps' must be >= 1" -- K config show trainer.total_training_steps=0
bad config_total_epochs_zero "trainer.total_epochs' must be >= 1" -- K config show trainer.total_epochs=0
bad config_beta_one "optim.betas' element 1 must be in \[0, 1\)" -- K config show 'actor_rollout_ref.actor.optim.betas=[0.9,1.0]'
bad config_eps_zero "optim.eps' must be > 0" -- K config show actor_rollout_ref.actor.optim.eps=0
bad config_weight_decay_negative "optim.weight_decay' must be >= 0" -- K config show actor_rollout_ref.actor.optim.weight_decay=-0.1
bad config_warmup_ratio "lr_warmup_steps_ratio' must be in \[0, 1\]" -- K config show actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=2
bad config_clip_grad_negative "optim.clip_grad' must be >= 0" -- K config show actor_rollout_ref.actor.optim.clip_grad=-1
bad config_clip_ratio_c "clip_ratio_c' must be > 1" -- K config show actor_rollout_ref.actor.clip_ratio_c=0.5
bad config_kl_coef_negative "kl_loss_coef' must be >= 0" -- K config show actor_rollout_ref.actor.kl_loss_coef=-1
bad config_top_k "rollout.top_k' must be >= -1" -- K config show actor_rollout_ref.rollout.top_k=-5
bad config_micro_batch_zero "ppo_micro_batch_size_per_gpu' must be >= 1" -- K config show actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0
bad config_gamma "algorithm.gamma' must be in \[0, 1\]" -- K config show algorithm.gamma=1.5
bad config_inf "algorithm.kl_ctrl.kl_coef' must be finite" -- K config show algorithm.kl_ctrl.kl_coef=inf
printf 'data:\n  train_batch_size: 8\n  max_prompt_length: -3\n' > "$W/range.yaml"
bad config_file_line "data.max_prompt_length' must be >= 1, got '-3' \(from $W/range.yaml:3\)" -- K config show --config "$W/range.yaml"
bad config_unknown_key "unknown config key 'trainer.totl_epochs' \(did you mean 'trainer.total_epochs'\?\)" -- \
  K config show trainer.totl_epochs=3
bad config_mistyped_value "data.train_batch_size' expects int, got 'abc'" -- K config show data.train_batch_size=abc
bad config_file_missing "$W/none.yaml" -- K config show --config "$W/none.yaml"
printf 'data:\n  train_batch_size: [1\n' > "$W/broken.yaml"
bad config_yaml_syntax "broken.yaml" -- K config show --config "$W/broken.yaml"
bad config_sft_lr_negative "optim.lr' must be >= 0, got '-1'" -- K config show sft optim.lr=-1

# ---- data inspect ----------------------------------------------------------------------------------------------
bad data_inspect_missing "$W/none.parquet" -- K data inspect "$W/none.parquet"
head -c 200 tests/data/parquet/types_v1_snappy.parquet > "$W/trunc.parquet"
bad data_inspect_truncated_parquet "trunc.parquet" -- K data inspect "$W/trunc.parquet"
printf 'PAR1garbagePAR1' > "$W/garbage.parquet"
bad data_inspect_garbage_parquet "garbage.parquet" -- K data inspect "$W/garbage.parquet"
bad data_inspect_malformed_jsonl "ids_badline.jsonl:2" -- K data inspect "$W/ids_badline.jsonl"
bad data_inspect_bad_flag "(--rows|unknown|expects|integer|number)" -- K data inspect "$W/ids.jsonl" --rows abc

# ---- bad CLI flags ---------------------------------------------------------------------------------------------
bad cli_unknown_command "(unknown command|frobnicate)" -- K frobnicate
bad cli_unknown_flag "--bogus" -- K logprobs --model "$M" --input "$W/ids.jsonl" --output "$W/o.jsonl" --bogus 1
bad cli_missing_required "--output" -- K logprobs --model "$M" --input "$W/ids.jsonl"
bad cli_flag_without_value "--output" -- K tokenize --tokenizer "$W/tok" --input "$W/text.jsonl" --output

# ---- train / sft: config, data, reward ------------------------------------------------------------------------
RL=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=2 actor_rollout_ref.rollout.n=2
    data.max_response_length=8 data.val_max_samples=2 data.train_max_samples=16
    actor_rollout_ref.actor.ppo_mini_batch_size=1 trainer.total_training_steps=2 trainer.test_freq=-1
    "trainer.logger=[]")
SFT=(model.partial_pretrain=builtin:tiny data.arith.num_train=32 data.arith.num_test=4 data.train_batch_size=8
     data.max_token_len_per_gpu=512 trainer.total_training_steps=2 trainer.threads=1 data.val_files=null
     "trainer.logger=[]")
bad train_lr_nan "actor_rollout_ref.actor.optim.lr' must be finite" -- K train "${RL[@]}" actor_rollout_ref.actor.optim.lr=nan
bad train_batch_size_zero "data.train_batch_size' must be >= 1" -- K train "${RL[@]}" data.train_batch_size=0
bad train_rollout_n_zero "rollout.n' must be >= 1" -- K train "${RL[@]}" actor_rollout_ref.rollout.n=0
bad train_total_steps_zero "trainer.total_training_steps' must be >= 1" -- K train "${RL[@]}" trainer.total_training_steps=0
bad train_pp_layers_do_not_divide "do not divide evenly over pipeline_model_parallel_size=3.*noop_layers" -- \
  K plan --world 3 actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=3
bad train_pp_does_not_divide_world "pipeline_model_parallel_size=2" -- \
  K train "${RL[@]}" actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2
bad train_vpp_without_pp "virtual_pipeline_model_parallel_size=2 interleaves pipeline stages and needs" -- \
  K train "${RL[@]}" actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2
bad train_unknown_key "did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'" -- \
  K train "${RL[@]}" actor_rollout_ref.actor.ppo_mini_batchsize=4
RLF=("${RL[@]}" actor_rollout_ref.rollout.tensor_model_parallel_size=1)
bad train_files_missing "$W/none.parquet: no such file \(check data.train_files" -- \
  K train "${RLF[@]}" data.train_files="$W/none.parquet" data.val_files="$W/none.parquet"
bad train_files_empty "empty.jsonl: no rows" -- K train "${RLF[@]}" data.train_files="$W/empty.jsonl" data.val_files="$W/empty.jsonl"
echo '{"prompt": "hi", "data_source": "x"}' > "$W/rl_noreward.jsonl"
bad train_files_missing_column "rl_noreward.jsonl.*(reward_model|ground_truth)" -- \
  K train "${RLF[@]}" data.train_files="$W/rl_noreward.jsonl" data.val_files="$W/rl_noreward.jsonl"
printf '%s\n' '{"prompt": "hi", "data_source": "x", "reward_model": {"ground_truth": "1"}}' '{"prompt": ' > "$W/rl_badline.jsonl"
bad train_files_malformed_line "rl_badline.jsonl:2" -- \
  K train "${RLF[@]}" data.train_files="$W/rl_badline.jsonl" data.val_files="$W/rl_badline.jsonl"
echo '{"prompt": "hi", "data_source": "arith", "reward_model": {"ground_truth": "1"}}' > "$W/rl_one.jsonl"
bad train_batch_larger_than_data "data.train_batch_size=2 but the training set has only 1 prompts" -- \
  K train "${RLF[@]}" data.train_files="$W/rl_one.jsonl" data.val_files="$W/rl_one.jsonl"
bad train_reward_command_missing "reward_model.reward_command.*no_such_reward_prog.*(not on PATH)" -- \
  K train "${RL[@]}" reward_model.reward_command=no_such_reward_prog
bad train_custom_reward_missing "custom_reward_function.path.*$W/none.py" -- \
  K train "${RL[@]}" custom_reward_function.path="$W/none.py"
echo '{"prompt": "what is one plus one plus one plus one", "data_source": "arith", "reward_model": {"ground_truth": "1"}}' > "$W/rl_long.jsonl"
bad train_prompt_too_long "rl_long.jsonl:1: prompt is [0-9]+ tokens, longer than data.max_prompt_length=4" -- \
  K train "${RLF[@]}" data.train_files="$W/rl_long.jsonl" data.val_files="$W/rl_long.jsonl" data.max_prompt_length=4
printf '{"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "%s"}]}\n' "$(printf 'x%.0s' $(seq 1 400))" > "$W/sft_long.jsonl"
bad sft_sample_too_long "sft_long.jsonl:1: sample is [0-9]+ tokens, longer than data.max_length=64" -- \
  K sft "${SFT[@]}" data.train_files="$W/sft_long.jsonl" data.max_length=64
bad sft_lr_negative "optim.lr' must be >= 0, got '-1'" -- K sft "${SFT[@]}" optim.lr=-1
bad sft_warmup_ratio "optim.warmup_steps_ratio' must be in \[0, 1\], got '5'" -- K sft "${SFT[@]}" optim.warmup_steps_ratio=5
bad sft_micro_batch_zero "data.micro_batch_size_per_gpu' must be >= 1" -- K sft "${SFT[@]}" data.micro_batch_size_per_gpu=0
bad sft_files_empty "empty.jsonl: no rows" -- K sft "${SFT[@]}" data.train_files="$W/empty.jsonl"
echo '{"question": "1+1", "answer": "2"}' > "$W/sft_wrong.jsonl"
bad sft_files_wrong_fields "sft_wrong.jsonl.*(messages|prompt|response)" -- K sft "${SFT[@]}" data.train_files="$W/sft_wrong.jsonl"
bad sft_export_into_model "trainer.export_dir=$M is the model folder model.partial_pretrain" -- \
  K sft "${SFT[@]}" model.partial_pretrain="$M" trainer.export_dir="$M"
bad sft_export_inside_model "trainer.export_dir=$M/out is inside the model folder" --absent "$M/out" -- \
  K sft "${SFT[@]}" model.partial_pretrain="$M" trainer.export_dir="$M/out"

# ---- environment switches read at start: refused by name before any work ------------------------------------
bad env_packed_weights "KESTREL_PACKED_WEIGHTS='yes' is not a packing switch: use auto" --absent "$W/pw_ckpt" -- \
  env KESTREL_PACKED_WEIGHTS=yes "$KESTREL" train trainer.total_training_steps=1 trainer.default_local_dir="$W/pw_ckpt"
bad env_kestrel_blas "KESTREL_BLAS='mkl' is not a GEMM library" --absent "$W/blas_ckpt" -- \
  env KESTREL_BLAS=mkl "$KESTREL" train trainer.total_training_steps=1 trainer.default_local_dir="$W/blas_ckpt"

# ---- checkpoints: corrupt, missing, another model's; the previous checkpoint untouched -------------------------
CK=$W/ck
K sft "${SFT[@]}" trainer.save_freq=1 trainer.default_local_dir="$CK" >"$W/ck_log.txt" 2>&1 ||
  { echo "FAIL: checkpoint fixture run"; cat "$W/ck_log.txt"; exit 1; }
[ -d "$CK/global_step_1" ] && [ -d "$CK/global_step_2" ] || { echo "FAIL: no checkpoints"; ls "$CK"; exit 1; }
# Corrupt the newest; resume must refuse it by name and leave step 1 alone.
cp -r "$CK" "$W/ck_corrupt"
F=$(find "$W/ck_corrupt/global_step_2" -name '*.safetensors' | head -1)
head -c 100 "$F" > "$F.x" && mv "$F.x" "$F"
bad ckpt_corrupt_file "global_step_2" --same "$W/ck_corrupt/global_step_1" -- \
  K sft "${SFT[@]}" trainer.total_training_steps=3 trainer.save_freq=1 trainer.default_local_dir="$W/ck_corrupt"
cp -r "$CK" "$W/ck_missing"
rm "$W/ck_missing/global_step_2/trainer_state.json"
bad ckpt_missing_file "global_step_2.*trainer_state.json" --same "$W/ck_missing/global_step_1" -- \
  K sft "${SFT[@]}" trainer.total_training_steps=3 trainer.save_freq=1 trainer.default_local_dir="$W/ck_missing"
cp -r "$CK" "$W/ck_pointer"
echo 7 > "$W/ck_pointer/latest_checkpointed_iteration.txt"
bad ckpt_pointer_to_missing "(global_step_7|latest_checkpointed_iteration)" --same "$W/ck_pointer/global_step_2" -- \
  K sft "${SFT[@]}" trainer.total_training_steps=3 trainer.save_freq=1 trainer.default_local_dir="$W/ck_pointer"
cp -r "$CK" "$W/ck_other"
bad ckpt_other_model "(global_step_2|checkpoint).*(shape|model|hidden|vocab|tensor)" --same "$W/ck_other/global_step_2" -- \
  K sft "${SFT[@]}" model.partial_pretrain=builtin:small trainer.total_training_steps=3 trainer.save_freq=1 \
  trainer.default_local_dir="$W/ck_other"
bad ckpt_resume_path_missing "$W/ck/global_step_9" -- \
  K sft "${SFT[@]}" trainer.resume_mode=resume_path trainer.resume_from_path="$W/ck/global_step_9" \
  trainer.default_local_dir="$W/ck_rp"

# ---- a killed writer's temp file is cleaned by the next run (not a failure case) ------------------------------
echo partial > "$W/lp.jsonl.tmp.999999999"
if K logprobs --model "$M" --input "$W/ids.jsonl" --output "$W/lp.jsonl" >/dev/null 2>&1 && [ -s "$W/lp.jsonl" ] &&
   [ ! -e "$W/lp.jsonl.tmp.999999999" ]; then PASS=$((PASS + 1)); else
  echo "FAIL stale_temp_cleanup: OUT.tmp.<dead pid> not removed"; FAILED+=(stale_temp_cleanup); fi

echo "bad_inputs: $PASS passed, ${#FAILED[@]} failed${FAILED:+: ${FAILED[*]}}"
[ ${#FAILED[@]} = 0 ]
