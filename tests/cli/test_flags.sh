#!/usr/bin/env bash
# test_flags.sh: every numeric flag is read by one reader (src/cli/args.c) that refuses what the JSON
# configuration refuses for the same setting:
#   * each value the reliability report found silently replaced or accepted (--steps -5, --seed -1,
#     --warmup-steps -3, --threads -1, launch --nproc-per-node -1, --momentum -1, --weight-decay -0.1)
#     and more (non-finite, fractional, out of range, --flag=value) gives exactly one line naming the
#     flag and its range, a non-zero exit, and writes nothing;
#   * the JSON path refuses the same values for the same settings;
#   * a generate flag error names the one flag that is wrong (not every limit);
#   * a config without a scheduler block trains with the default schedule docs/training.md describes.
. "$(dirname "$0")/lib.sh" flags

# refused NAME 'EXACT STDERR LINE' COMMAND ARGS...: non-zero exit, that one line, nothing written
# (the command runs in an empty directory with every output path pointing into it)
refused() {
  local name=$1 want=$2; shift 2
  local dir="$tmp/run_$name"
  mkdir -p "$dir"
  (cd "$dir" && "$BIN" "$@" >"$tmp/out" 2>"$tmp/err")
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$(cat "$tmp/err")" = "$want" ] && [ ! -s "$tmp/out" ] &&
     [ -z "$(ls -A "$dir")" ]; then
    pass "$name"
  else
    fail "$name" "rc=$rc stderr: $(cat "$tmp/err") | files: $(ls -A "$dir")"
  fi
}
T=(--save-dir runs --metrics runs/metrics.jsonl --data data)

# the report's cases
refused train_steps_negative "error: flag --steps expects an integer >= 0, got '-5'" train "${T[@]}" --steps -5
refused train_seed_negative "error: flag --seed expects an integer >= 0, got '-1'" train "${T[@]}" --seed -1
refused train_warmup_negative "error: flag --warmup-steps expects an integer >= 1, got '-3'" train "${T[@]}" --warmup-steps -3
refused train_threads_negative "error: flag --threads expects an integer >= 0, got '-1'" train "${T[@]}" --threads -1
refused launch_nproc_negative "error: flag --nproc-per-node expects an integer >= 1, got '-1'" launch --log-dir logs --nproc-per-node -1 train "${T[@]}"
refused train_lr_underflows_float "error: flag --lr value '1e-50' is outside float32's range (magnitude 1.2e-38 to 3.4e+38, or 0)" train "${T[@]}" --lr 1e-50
refused train_momentum_negative "error: flag --momentum expects a finite number >= 0, got '-1'" train "${T[@]}" --optimizer sgd --momentum -1
refused train_weight_decay_negative "error: flag --weight-decay expects a finite number >= 0, got '-0.1'" train "${T[@]}" --weight-decay -0.1
# choices: each named flag, the value given and the ones allowed
refused train_optimizer_unknown "error: --optimizer must be adamw, adam, sgd or adamw8bit (got 'lion')" train "${T[@]}" --optimizer lion
refused train_precision_unknown "error: --precision must be fp32, bf16 or fp16 (got 'fp8')" train "${T[@]}" --precision fp8
refused train_lr_schedule_unknown "error: --lr-schedule must be constant, cosine, linear or warmup (got 'step')" train "${T[@]}" --lr-schedule step
# more of the same reader
refused train_lr_infinite "error: flag --lr expects a finite number >= 0, got 'inf'" train "${T[@]}" --lr inf
refused train_steps_fraction "error: flag --steps expects an integer >= 0, got '1.5'" train "${T[@]}" --steps 1.5
refused train_steps_too_big "error: flag --steps expects an integer >= 0, got '99999999999'" train "${T[@]}" --steps 99999999999
refused train_batch_zero_equals_form "error: flag --batch-size expects an integer >= 1, got '0'" train "${T[@]}" --batch-size=0
refused train_zero_stage_4 "error: flag --zero-stage expects an integer in [0, 3], got '4'" train "${T[@]}" --zero-stage 4
refused train_grad_clip_negative "error: flag --grad-clip expects a finite number >= 0, got '-1'" train "${T[@]}" --grad-clip -1
refused launch_port_range "error: flag --master-port expects an integer in [1, 65535], got '70000'" launch --master-port 70000 ./x
refused launch_grace_negative "error: flag --grace-period expects an integer in [0, 86400], got '-1'" launch --grace-period -1 ./x
refused launch_hang_negative "error: flag --hang-timeout expects an integer in [0, 604800], got '-1'" launch --hang-timeout -1 ./x
refused launch_nnodes_zero "error: flag --nnodes expects an integer in [1, 1000000], got '0'" launch --nnodes 0 ./x
refused launch_num_gpus_negative "error: flag --num_gpus expects an integer >= 1, got '-1'" launch --num_gpus -1 ./x
refused prepare_val_fraction_one "error: flag --val-fraction expects a number in [0, 1), got '1'" prepare --input in --output out --val-fraction 1
refused prepare_shard_tokens_zero "error: flag --shard-tokens expects an integer >= 1, got '0'" prepare --input in --output out --shard-tokens 0
# generate: the one wrong flag and its range
G=(generate --model nowhere)
refused generate_top_p_zero "error: flag --top-p expects a number in (0, 1], got '0'" "${G[@]}" --top-p 0
refused generate_top_p_above_one "error: flag --top-p expects a number in (0, 1], got '1.5'" "${G[@]}" --top-p 1.5
refused generate_temperature_negative "error: flag --temperature expects a finite number >= 0, got '-1'" "${G[@]}" --temperature -1
refused generate_top_k_negative "error: flag --top-k expects an integer >= 0, got '-1'" "${G[@]}" --top-k -1
refused generate_max_new_tokens_negative "error: flag --max-new-tokens expects an integer >= 0, got '-1'" "${G[@]}" --max-new-tokens -1
refused generate_dtype_unknown "error: --dtype: expected fp32 (float32) or bf16 (bfloat16), got 'fp16'" "${G[@]}" --dtype fp16
refused generate_seed_negative "error: flag --seed expects an integer >= 0, got '-2'" "${G[@]}" --seed -2
refused generate_device_unknown "error: --device 'tpu' is not a device: expected cpu, cuda or cuda:N (N = GPU index)" "${G[@]}" --device tpu

# the JSON path refuses the same settings
json_refused() {  # json_refused NAME JSON EXPECTED-SUBSTRING
  echo "$2" >"$tmp/$1.json"
  "$BIN" train --config "$tmp/$1.json" --save-dir "$tmp/json_runs" --data "$tmp/nodata" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne 0 ] && grep -qF -- "$3" "$tmp/err" && [ ! -e "$tmp/json_runs" ]; then pass "$1"
  else fail "$1" "rc=$rc: $(cat "$tmp/err")"; fi
}
json_refused json_steps_negative '{"shardlm": {"steps": -5}}' '"steps" must be an integer >= 0'
json_refused json_seed_negative '{"shardlm": {"seed": -1}}' '"seed" must be an integer >= 0'
json_refused json_threads_negative '{"shardlm": {"threads": -1}}' '"threads" must be an integer >= 0'
json_refused json_momentum_negative '{"optimizer": {"type": "SGD", "params": {"momentum": -1}}}' 'momentum must be >= 0'
json_refused json_weight_decay_negative '{"optimizer": {"type": "AdamW", "params": {"weight_decay": -0.1}}}' 'weight_decay must be >= 0'
json_refused json_warmup_negative '{"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": -3}}}' 'warmup_num_steps must be a positive integer'

# a config without a scheduler block: WarmupCosineLR, warmup over max(2, steps/10), down to 0.1 x lr
if prepare_tiny_data; then
  echo '{"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}' >"$tmp/nosched.json"
  "$BIN" train --config "$tmp/nosched.json" --model gpt2-tiny --data "$tmp/data" --seq-len 32 --steps 40 --no-save \
    --sample-tokens 0 --eval-interval 0 --metrics "$tmp/m.jsonl" >"$tmp/ns.out" 2>&1
  rc=$?
  lrs=$(sed 's/.*"lr":\([0-9.e+-]*\).*/\1/' "$tmp/m.jsonl" | tr '\n' ' ')
  # DeepSpeed's step indexing (training.md): steps 1 and 2 use iterations -1 and 0 (lr 0), step 3 a quarter
  # of lr (warmup 4 = 40/10, linear), step 6 about lr, then cosine down towards 0.1 x lr (reached at step 41)
  if [ $rc -eq 0 ] && grep -Pq '"type":\s*"WarmupCosineLR"' "$tmp/ns.out" && grep -Pq '"warmup_num_steps":\s*4,' "$tmp/ns.out" &&
     grep -Pq '"cos_min_ratio":\s*0.1,' "$tmp/ns.out" &&
     echo "$lrs" | awk '{ ok = $1 == 0 && $2 == 0 && $3 > 0.0024 && $3 < 0.0026 && $6 > 0.0099 && $40 > 0.001 && $40 < 0.0011; exit !ok }'; then
    pass config_without_scheduler_uses_default_warmup_cosine
  else fail config_without_scheduler_uses_default_warmup_cosine "rc=$rc lrs=$lrs"; tail -5 "$tmp/ns.out"; fi
  # --warmup-steps over a config's scheduler block (no --lr-schedule): the flag sets the block's
  # warmup_num_steps (flags apply after the file), so WarmupLR reaches lr by step 6 instead of step 101
  echo '{"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "scheduler": {"type": "WarmupLR",
        "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 100, "warmup_type": "linear"}}}' \
    >"$tmp/ws.json"
  "$BIN" train --config "$tmp/ws.json" --warmup-steps 4 --model gpt2-tiny --data "$tmp/data" --seq-len 32 --steps 8 \
    --no-save --sample-tokens 0 --eval-interval 0 --metrics "$tmp/mw.jsonl" >"$tmp/ws.out" 2>&1
  rc=$?
  lrs=$(sed 's/.*"lr":\([0-9.e+-]*\).*/\1/' "$tmp/mw.jsonl" | tr '\n' ' ')
  if [ $rc -eq 0 ] && grep -Pq '"warmup_num_steps":\s*4\b' "$tmp/ws.out" &&
     echo "$lrs" | awk '{ ok = $3 > 0.0024 && $3 < 0.0026 && $6 > 0.00999 && $6 < 0.01001 && $8 > 0.00999 && $8 < 0.01001; exit !ok }'; then
    pass warmup_steps_flag_sets_config_block
  else fail warmup_steps_flag_sets_config_block "rc=$rc lrs=$lrs"; tail -5 "$tmp/ws.out"; fi
fi
exit 0
