#!/usr/bin/env bash
# test_train.sh: `shardlm train` and `shardlm generate` end to end on a small prepared corpus:
#   * resume is bit-for-bit: 20 steps straight == 10 steps + resume + 10 steps (model and optimizer
#     files byte-identical, same losses), for GPT-2 and LLaMA, with gradient accumulation;
#   * the loss falls; metrics are JSON lines; `latest` points at the newest checkpoint;
#   * a DeepSpeed JSON config is honoured (batch rule, scheduler) and an impossible one is refused;
#   * bad input (missing data, malformed config, corrupt checkpoint, unknown flag, a comm backend that
#     cannot carry the device's memory) exits non-zero with a message naming the problem, and never
#     damages the existing checkpoint.
# Prints PASS/FAIL lines for tests/run.sh; skips (exit 0) when "$SHARDLM_BIN" is not built.
set -u
BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$BIN" ] || exit 0
DATA=${SHARDLM_DATA:-../shared/data}
tmp=$(mktemp -d /tmp/shardlm_test_train_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
log="$tmp/log"
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; [ $# -gt 0 ] && echo "  $*"; tail -n 15 "$log"; }
expect() {  # expect NAME CONDITION-COMMAND...
  local name=$1; shift
  if "$@" >>"$log" 2>&1; then pass "$name"; else fail "$name"; fi
}

# a small corpus with its own small BPE vocabulary keeps the runs fast (also under sanitizers)
mkdir -p "$tmp/corpus"
cp "$DATA"/sotu/179*.txt "$tmp/corpus/"
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/data" --train-tokenizer 512 --val-fraction 0.2 >>"$log" 2>&1
expect prepare_small_corpus test -f "$tmp/data/train_000000.bin"

common=(--data "$tmp/data" --seq-len 32 --batch-size 2 --grad-accum 2 --threads 2 --lr 1e-2 --seed 7
        --eval-interval 5 --eval-batches 2 --sample-tokens 0 --log-interval 5)

for model in gpt2-tiny llama-tiny; do
  "$BIN" train --model $model "${common[@]}" --steps 20 --save-interval 10 --save-dir "$tmp/$model-straight" >>"$log" 2>&1
  rc1=$?
  # an interrupted run: keep only the step-10 checkpoint of a 20-step run, then resume to 20
  mkdir -p "$tmp/$model-split"
  cp -r "$tmp/$model-straight/step_00000010" "$tmp/$model-split/"
  echo step_00000010 >"$tmp/$model-split/latest"
  head -n "$(grep -n '"step":10,' "$tmp/$model-straight/metrics.jsonl" | tail -1 | cut -d: -f1)" \
    "$tmp/$model-straight/metrics.jsonl" >"$tmp/$model-split/metrics.jsonl"
  rc2=$?
  "$BIN" train --model $model "${common[@]}" --steps 20 --save-dir "$tmp/$model-split" --resume >>"$log" 2>&1
  rc3=$?
  if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ]; then pass "${model}_train_and_resume_run"; else fail "${model}_train_and_resume_run" "exit codes $rc1 $rc2 $rc3"; fi
  a="$tmp/$model-straight/step_00000020"; b="$tmp/$model-split/step_00000020"
  if cmp -s "$a/model.safetensors" "$b/model.safetensors" && cmp -s "$a/optim_00000_of_00001.safetensors" "$b/optim_00000_of_00001.safetensors"; then
    pass "${model}_resume_is_bit_for_bit"
  else
    fail "${model}_resume_is_bit_for_bit" "model/optimizer files differ between straight and resumed runs"
  fi
  # the losses of steps 11..20 are identical too
  grep '"loss"' "$tmp/$model-straight/metrics.jsonl" | sed -n '11,20p' | sed 's/,"tokens_per_s".*//' >"$tmp/l1"
  grep '"loss"' "$tmp/$model-split/metrics.jsonl" | sed -n '11,20p' | sed 's/,"tokens_per_s".*//' >"$tmp/l2"
  if [ -s "$tmp/l1" ] && cmp -s "$tmp/l1" "$tmp/l2"; then pass "${model}_resumed_losses_identical"; else fail "${model}_resumed_losses_identical"; diff "$tmp/l1" "$tmp/l2" | head; fi
  first=$(grep '"loss"' "$tmp/$model-straight/metrics.jsonl" | head -1 | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
  last=$(grep '"loss"' "$tmp/$model-straight/metrics.jsonl" | sed -n '20p' | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
  expect "${model}_loss_falls" awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }'
  expect "${model}_latest_points_at_last_step" grep -qx step_00000020 "$tmp/$model-split/latest"
done

expect metrics_are_json_lines python3 -c "
import json,sys
rows=[json.loads(l) for l in open('$tmp/gpt2-tiny-straight/metrics.jsonl')]
assert any('val_loss' in r for r in rows) and sum('loss' in r for r in rows)==20
"

# generate from the checkpoint (tokenizer found through the training data recorded in the checkpoint)
"$BIN" generate --model "$tmp/gpt2-tiny-straight" --prompt "The" --max-new-tokens 10 --seed 3 >"$tmp/gen1" 2>>"$log"
rc=$?
"$BIN" generate --model "$tmp/gpt2-tiny-straight" --prompt "The" --max-new-tokens 10 --seed 3 >"$tmp/gen2" 2>>"$log"
if [ $rc -eq 0 ] && [ -s "$tmp/gen1" ] && cmp -s "$tmp/gen1" "$tmp/gen2"; then pass generate_is_deterministic_for_a_seed; else fail generate_is_deterministic_for_a_seed; fi

# DeepSpeed JSON config: train_batch_size 8 with micro 2 -> accumulation 4; WarmupLR scheduler
cat >"$tmp/ds.json" <<JSON
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.5, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "betas": [0.9, 0.99], "weight_decay": 0.01}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.002, "warmup_num_steps": 3, "warmup_type": "linear"}},
 "shardlm": {"model": "gpt2-tiny", "seq_len": 16, "steps": 3}, "wall_clock_breakdown": false}
JSON
"$BIN" train --config "$tmp/ds.json" --data "$tmp/data" --save-dir "$tmp/ds" --sample-tokens 0 --eval-interval 0 >"$tmp/ds.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q '"gradient_accumulation_steps":[[:space:]]*4' "$tmp/ds.out" && grep -q "unknown keys ignored: wall_clock_breakdown" "$tmp/ds.out"; then
  pass deepspeed_config_batch_rule_and_unknown_key_warning
else
  fail deepspeed_config_batch_rule_and_unknown_key_warning "exit $rc"; cat "$tmp/ds.out" | tail -5
fi
lr3=$(grep '"step":3,' "$tmp/ds/metrics.jsonl" | sed 's/.*"lr":\([0-9.e+-]*\).*/\1/')
# DeepSpeed WarmupLR (linear): step 3 uses last_batch_iteration 1 -> 0.002 * 1/3
expect deepspeed_warmup_lr_schedule awk -v x="$lr3" 'BEGIN { exit !(x > 0.000666 && x < 0.000667) }'

# fine-tuning: start from a checkpoint's weights (a Hugging Face directory) into a new run
"$BIN" train --model "$tmp/gpt2-tiny-straight/step_00000020" "${common[@]}" --steps 5 --lr 1e-3 \
  --save-dir "$tmp/finetune" >"$tmp/ft.out" 2>&1
rc=$?
ft_first=$(grep '"loss"' "$tmp/finetune/metrics.jsonl" 2>/dev/null | head -1 | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
st_first=$(grep '"loss"' "$tmp/gpt2-tiny-straight/metrics.jsonl" | head -1 | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
# a model that starts from trained weights begins far below a fresh model's first loss
if [ $rc -eq 0 ] && [ -n "$ft_first" ] && awk -v a="$ft_first" -v b="$st_first" 'BEGIN { exit !(a < b - 0.3) }'; then
  pass finetune_starts_from_pretrained_weights
else
  fail finetune_starts_from_pretrained_weights "exit $rc, first loss $ft_first vs fresh $st_first"
fi

# --- bad input: clear message, non-zero exit, existing checkpoint untouched -----------------------
ck="$tmp/gpt2-tiny-straight"
sum_before=$(cat "$ck"/step_00000020/* | md5sum)
bad() {  # bad NAME EXPECTED-MESSAGE-REGEX ARGS...
  local name=$1 re=$2; shift 2
  "$BIN" "$@" >"$tmp/bad.out" 2>&1; local rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -Eq -- "$re" "$tmp/bad.out"; then pass "$name"; else fail "$name" "exit $rc"; cat "$tmp/bad.out" | tail -3; fi
}
bad vocabulary_mismatch_is_named "differs from the tokenizer's 50257 tokens" train --model "$tmp/gpt2-tiny-straight" --data "$tmp/data" --tokenizer "$DATA/gpt2" --seq-len 32 --save-dir "$tmp/x"
bad missing_data_dir_is_named "nodata" train --model gpt2-tiny --data "$tmp/nodata" --save-dir "$tmp/x" --steps 1
echo '{"train_batch_size": 8,' >"$tmp/broken.json"
bad malformed_config_is_named "broken.json.*malformed JSON" train --config "$tmp/broken.json" --data "$tmp/data"
echo '{"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2}' >"$tmp/odd.json"
bad impossible_batch_size_is_explained "train_batch_size 7 is not divisible" train --config "$tmp/odd.json" --data "$tmp/data"
echo '{"train_batch_size": "eight"}' >"$tmp/type.json"
bad wrong_config_type_is_named "train_batch_size.*integer" train --config "$tmp/type.json" --data "$tmp/data"
bad unknown_flag_is_named "--bogus" train --bogus 3
bad non_numeric_flag_is_named "--steps expects an integer" train --steps ten
bad too_long_sequence_is_refused "exceeds the model's maximum positions" train --model gpt2-tiny --data "$tmp/data" --seq-len 65 --save-dir "$tmp/x"
# a corrupt checkpoint copy: resuming from it fails clearly
cp -r "$ck" "$tmp/corrupt"
printf 'garbage' | dd of="$tmp/corrupt/step_00000020/model.safetensors" bs=1 seek=0 conv=notrunc 2>/dev/null
bad corrupt_checkpoint_is_named "model.safetensors" train --model gpt2-tiny "${common[@]}" --steps 25 --save-dir "$tmp/corrupt" --resume
bad resume_with_other_model_is_refused "does not match" train --model llama-tiny "${common[@]}" --steps 25 --save-dir "$ck" --resume
bad resume_with_other_micro_batch_is_refused "micro batch 2, this run uses 3" train --model gpt2-tiny "${common[@]}" --batch-size 3 --steps 25 --save-dir "$ck" --resume
bad resume_with_other_seq_len_is_refused "seq_len 32, this run uses 16" train --model gpt2-tiny "${common[@]}" --seq-len 16 --steps 25 --save-dir "$ck" --resume
# the train layer's resume check (resume.h) names the field, the checkpoint's value and this run's
bad resume_with_other_seed_is_refused "checkpoint was trained with seed 7, this run uses 8" train --model gpt2-tiny "${common[@]}" --seed 8 --steps 25 --save-dir "$ck" --resume
bad resume_without_shuffling_is_refused "checkpoint was trained with shuffling, this run does not" train --model gpt2-tiny "${common[@]}" --no-shuffle --steps 25 --save-dir "$ck" --resume
cp -r "$tmp/data" "$tmp/data2"
bad resume_with_other_data_is_refused "checkpoint was trained on data $tmp/data, this run reads $tmp/data2" train --model gpt2-tiny "${common[@]}" --data "$tmp/data2" --steps 25 --save-dir "$ck" --resume
bad non_finite_flag_is_refused "expects a finite number" train --lr nan
# comm backends and devices: NCCL moves GPU memory only, and a GPU's buffers cross processes only
# through NCCL; both refusals come before any GPU or MPI is touched (this machine may have neither)
bad nccl_on_cpu_is_refused "comm-backend nccl moves GPU memory: it needs --device cuda \(this run has --device cpu\)" \
  train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --save-dir "$tmp/x" --steps 1 --device cpu --comm-backend nccl
bad nccl_with_indexed_gpu_is_refused "takes --device cuda, not --device cuda:1" \
  train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --save-dir "$tmp/x" --steps 1 --device cuda:1 --comm-backend nccl
bad gpu_zero_without_nccl_is_refused "ZeRO stage 2 needs the nccl comm backend.*pass --comm-backend nccl" \
  train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --save-dir "$tmp/x" --steps 1 --device cuda --zero-stage 2
bad unknown_comm_backend_is_named "unknown comm backend \"gloo\"" \
  train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --save-dir "$tmp/x" --steps 1 --comm-backend gloo
echo "latest-missing" >"$tmp/corrupt/latest"
bad dangling_latest_is_named "latest-missing" generate --model "$tmp/corrupt"
# damaged token shards: truncated, and with a wrong magic number
mkdir -p "$tmp/trunc" "$tmp/magic"
cp -r "$tmp/data/tokenizer" "$tmp/trunc/"; cp -r "$tmp/data/tokenizer" "$tmp/magic/"
head -c 3000 "$tmp/data/train_000000.bin" >"$tmp/trunc/train_000000.bin"
cp "$tmp/data/train_000000.bin" "$tmp/magic/train_000000.bin"
printf '\x01\x02\x03\x04' | dd of="$tmp/magic/train_000000.bin" bs=1 seek=0 conv=notrunc 2>/dev/null
bad truncated_shard_is_named "trunc/train_000000.bin" train --model gpt2-tiny --data "$tmp/trunc" --seq-len 32 --save-dir "$tmp/x" --steps 1 --eval-interval 0
bad wrong_magic_shard_is_named "magic/train_000000.bin.*magic" train --model gpt2-tiny --data "$tmp/magic" --seq-len 32 --save-dir "$tmp/x" --steps 1 --eval-interval 0

# SIGINT: the current step finishes, a checkpoint is saved, the exit is non-zero, and it resumes
"$BIN" train --model gpt2-tiny "${common[@]}" --steps 100000 --save-dir "$tmp/sig" >"$tmp/sig.out" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "^step 5/" "$tmp/sig.out" && break; sleep 0.1; done
kill -INT $pid; wait $pid; rc=$?
if [ $rc -ne 0 ] && [ -f "$tmp/sig/latest" ] && grep -q "stopped by signal" "$tmp/sig.out"; then pass sigint_saves_a_checkpoint; else fail sigint_saves_a_checkpoint "exit $rc"; tail -3 "$tmp/sig.out"; fi
step=$(sed 's/step_0*//' "$tmp/sig/latest")
"$BIN" train --model gpt2-tiny "${common[@]}" --steps $((step + 2)) --save-dir "$tmp/sig" --resume >>"$log" 2>&1
expect resume_after_sigint grep -qx "step_$(printf %08d $((step + 2)))" "$tmp/sig/latest"

sum_after=$(cat "$ck"/step_00000020/* | md5sum)
if [ "$sum_before" = "$sum_after" ] && grep -qx step_00000020 "$ck/latest"; then pass failed_runs_leave_checkpoint_intact; else fail failed_runs_leave_checkpoint_intact; fi
exit 0
