#!/usr/bin/env bash
# test_adam8.sh: `shardlm train` with optimizer AdamW8bit (bitsandbytes' 8-bit AdamW) end to end:
#   * resume is bit-for-bit (20 steps straight == 10 + resume + 10; model and 8-bit state files
#     byte-identical), for GPT-2 and LLaMA with gradient accumulation, under --precision bf16, and for
#     LoRA adapters (their state only; the checkpoint a PEFT directory with the optimizer shard);
#   * the memory line's state bytes are 2 per 8-bit element + 8 per block + 8 per 32-bit element,
#     and its optimizer state figure is that number (with LoRA: over the adapters' elements only);
#   * ZeRO: at 3 ranks (gpt2-tiny's 43904 parameters in slices of 14635 cut blocks), stages 1, 2 and 3
#     give stage 0's weights and consolidated 8-bit state bit for bit; a 3-rank stage-3 checkpoint
#     resumes on 2 ranks at stage 1 and on 1 process;
#   * its loss tracks AdamW's (gpt2-tiny, 40 steps: final loss within 3%);
#   * bad input: a checkpoint of another optimizer, another min_8bit_size, a bad min_8bit_size, an
#     AdamW state file in place of the 8-bit one.
# Prints PASS/FAIL lines for tests/run.sh; skips (exit 0) when "$SHARDLM_BIN" is not built.
. "$(dirname "$0")/lib.sh" adam8
log="$tmp/log"
root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
mpi() { local n=$1; shift; timeout 300 mpirun "${root[@]}" --oversubscribe -np "$n" "$@"; }
same() {  # same NAME FILE...: all files exist and are byte-identical
  local name=$1 first=$2; shift 2
  for f in "$first" "$@"; do [ -f "$f" ] || { fail "$name" "missing $f"; return; }; done
  for f in "$@"; do cmp -s "$first" "$f" || { fail "$name" "$f differs from $first"; return; }; done
  pass "$name"
}
final_loss() { grep '"loss"' "$1/metrics.jsonl" | tail -1 | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/'; }

prepare_tiny_data || { echo "SKIP adam8: no ../shared/data/sotu"; exit 0; }
common=(--data "$tmp/data" --seq-len 32 --batch-size 2 --grad-accum 2 --threads 2 --lr 1e-2 --seed 7
        --eval-interval 0 --sample-tokens 0 --log-interval 5 --optimizer adamw8bit)

# LoRA r=32 on c_attn, c_proj, c_fc: c_fc's lora_B (128 x 32) and mlp.c_proj's lora_A (32 x 128) have
# 4096 elements, 8-bit state at the default min_8bit_size; the other adapters keep 32-bit state
lora=(--lora-r 32 --lora-alpha 32 --lora-targets c_attn,c_proj,c_fc)

# ---- resume bit for bit
for run in gpt2-tiny llama-tiny gpt2-tiny-bf16 gpt2-tiny-lora; do
  case $run in
    *-bf16) model=${run%-bf16} extra=(--precision bf16) ;;
    *-lora) model=${run%-lora} extra=("${lora[@]}") ;;
    *) model=$run extra=() ;;
  esac
  "$BIN" train --model "$model" "${common[@]}" "${extra[@]}" --steps 20 --save-interval 10 \
    --save-dir "$tmp/$run-straight" >"$tmp/$run.out" 2>&1
  rc1=$?
  mkdir -p "$tmp/$run-split" && cp -r "$tmp/$run-straight/step_00000010" "$tmp/$run-split/" &&
    echo step_00000010 >"$tmp/$run-split/latest"
  "$BIN" train --model "$model" "${common[@]}" "${extra[@]}" --steps 20 --save-dir "$tmp/$run-split" --resume \
    >>"$log" 2>&1
  rc2=$?
  if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]; then pass "${run}_train_and_resume_run"; else
    fail "${run}_train_and_resume_run" "exit codes $rc1 $rc2"; tail -5 "$tmp/$run.out" "$log"; fi
  a="$tmp/$run-straight/step_00000020"; b="$tmp/$run-split/step_00000020"
  weights=model.safetensors; [ "$run" = gpt2-tiny-lora ] && weights=adapter_model.safetensors
  same "${run}_resume_is_bit_for_bit" "$a/$weights" "$b/$weights"
  same "${run}_resumed_8bit_state_is_bit_for_bit" "$a/optim_00000_of_00001.safetensors" "$b/optim_00000_of_00001.safetensors"
done

# ---- the memory line: state bytes against the formula, and the total's optimizer figure
line=$(grep 'optimizer AdamW8bit state on this rank' "$tmp/gpt2-tiny.out")
n8=$(echo "$line" | sed -n 's/.* 2 B x \([0-9]*\) (8-bit.*/\1/p')
nb=$(echo "$line" | sed -n 's/.* 8 B x \([0-9]*\) blocks of 256.*/\1/p')
n32=$(echo "$line" | sed -n 's/.* 8 B x \([0-9]*\) (32-bit.*/\1/p')
bytes=$(echo "$line" | sed -n 's/.* = \([0-9]*\) bytes.*/\1/p')
# gpt2-tiny: wte (512 x 32 = 16384) and each block's c_fc / mlp.c_proj (4096) are 8-bit; 128 blocks of 256
if [ "$n8" = 32768 ] && [ "$nb" = 128 ] && [ -n "$n32" ] && [ "$bytes" = $((2 * n8 + 8 * nb + 8 * n32)) ]; then
  pass state_bytes_equal_the_formula
else
  fail state_bytes_equal_the_formula "$line"
fi
mb=$(grep -o 'optimizer state [0-9.]* MB' "$tmp/gpt2-tiny.out" | awk '{ print $3 }')
awk -v a="$mb" -v b="$bytes" 'BEGIN { exit !(a == sprintf("%.2f", b / 1e6)) }' && pass memory_line_counts_the_8bit_state ||
  fail memory_line_counts_the_8bit_state "$mb MB vs $bytes bytes"
# the adapters' state only (the base frozen): 2 blocks x 2 tensors of 4096 8-bit elements, 64 blocks
line=$(grep 'optimizer AdamW8bit state on this rank' "$tmp/gpt2-tiny-lora.out")
n8=$(echo "$line" | sed -n 's/.* 2 B x \([0-9]*\) (8-bit.*/\1/p')
nb=$(echo "$line" | sed -n 's/.* 8 B x \([0-9]*\) blocks of 256.*/\1/p')
n32=$(echo "$line" | sed -n 's/.* 8 B x \([0-9]*\) (32-bit.*/\1/p')
bytes=$(echo "$line" | sed -n 's/.* = \([0-9]*\) bytes.*/\1/p')
A=$(sed -n 's/.* adapters \([0-9]*\) parameters.*/\1/p' "$tmp/gpt2-tiny-lora.out")
mb=$(grep -o 'optimizer state [0-9.]* MB' "$tmp/gpt2-tiny-lora.out" | awk '{ print $3 }')
if [ "$n8" = 16384 ] && [ "$nb" = 64 ] && [ -n "$A" ] && [ $((n8 + n32)) = "$A" ] &&
   [ "$bytes" = $((2 * n8 + 8 * nb + 8 * n32)) ] && awk -v a="$mb" -v b="$bytes" 'BEGIN { exit !(a == sprintf("%.2f", b / 1e6)) }'; then
  pass lora_state_bytes_equal_the_formula
else
  fail lora_state_bytes_equal_the_formula "$line (adapters $A, $mb MB)"
fi

# ---- ZeRO at 3 ranks: stages 1-3 equal stage 0 bit for bit; a checkpoint loads at other world sizes
if command -v mpirun >/dev/null; then
  zc=(train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --steps 6 --seed 3 --lr 1e-2 --no-shuffle
      --eval-interval 0 --sample-tokens 0 --log-interval 3 --threads 1 --batch-size 2 --optimizer adamw8bit)
  for s in 0 1 2 3; do
    OMP_NUM_THREADS=1 mpi 3 "$BIN" "${zc[@]}" --zero-stage $s --save-dir "$tmp/z$s" >"$tmp/z$s.out" 2>&1 ||
      { fail "zero_stage${s}_runs"; tail -5 "$tmp/z$s.out"; }
    "$BIN" convert --checkpoint "$tmp/z$s" --output "$tmp/z$s.hf" --with-optimizer >>"$log" 2>&1
  done
  same zero_stages_1_2_3_weights_equal_stage0 "$tmp/z0.hf/model.safetensors" "$tmp/z1.hf/model.safetensors" \
    "$tmp/z2.hf/model.safetensors" "$tmp/z3.hf/model.safetensors"
  same zero_stages_1_2_3_8bit_state_equals_stage0 "$tmp/z0.hf/optimizer.safetensors" \
    "$tmp/z1.hf/optimizer.safetensors" "$tmp/z2.hf/optimizer.safetensors" "$tmp/z3.hf/optimizer.safetensors"
  [ -f "$tmp/z3/step_00000006/optim_00002_of_00003.safetensors" ] && pass zero3_writes_one_8bit_shard_per_rank ||
    fail zero3_writes_one_8bit_shard_per_rank
  # the 3-rank stage-3 checkpoint continues on 2 ranks (stage 1) and on 1 process, each saving a state that
  # consolidates; a resave right after loading (no step) holds the state it loaded, bit for bit
  OMP_NUM_THREADS=1 mpi 2 "$BIN" "${zc[@]}" --steps 8 --zero-stage 1 --save-dir "$tmp/z3" --resume >"$tmp/r2.out" 2>&1 &&
    grep -q '"step":8' "$tmp/z3/metrics.jsonl" && pass zero3_checkpoint_resumes_on_2_ranks_stage1 ||
    { fail zero3_checkpoint_resumes_on_2_ranks_stage1; tail -5 "$tmp/r2.out"; }
  mkdir -p "$tmp/z3b" && cp -r "$tmp/z3/step_00000006" "$tmp/z3b/" && echo step_00000006 >"$tmp/z3b/latest"
  "$BIN" "${zc[@]}" --steps 7 --save-dir "$tmp/z3b" --resume >"$tmp/r1.out" 2>&1 &&
    "$BIN" convert --checkpoint "$tmp/z3b" --output "$tmp/z3b.hf" --with-optimizer >>"$log" 2>&1 &&
    pass zero3_checkpoint_resumes_on_1_process || { fail zero3_checkpoint_resumes_on_1_process; tail -5 "$tmp/r1.out"; }
else
  echo "SKIP adam8 ZeRO: mpirun not found"
fi

# ---- loss tracks AdamW (gpt2-tiny, 40 steps, same seed and data)
lc=(--model gpt2-tiny --data "$tmp/data" --seq-len 32 --batch-size 4 --threads 2 --lr 1e-2 --seed 11 --steps 40
    --eval-interval 0 --sample-tokens 0 --log-interval 10)
"$BIN" train "${lc[@]}" --optimizer adamw --save-dir "$tmp/fp32" >>"$log" 2>&1
"$BIN" train "${lc[@]}" --optimizer adamw8bit --save-dir "$tmp/8bit" >>"$log" 2>&1
a=$(final_loss "$tmp/fp32"); b=$(final_loss "$tmp/8bit")
echo "  gpt2-tiny 40 steps: AdamW loss $a, AdamW8bit loss $b"
awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.03 * a) }' &&
  pass loss_tracks_adamw || fail loss_tracks_adamw "AdamW $a, AdamW8bit $b"

# ---- bad input: clear errors, exit non-zero, the checkpoint untouched
bad() {  # bad NAME EXPECTED-MESSAGE ARGS...
  local name=$1 msg=$2; shift 2
  if "$BIN" "$@" >"$tmp/bad.out" 2>&1; then fail "$name" "exit 0"; return; fi
  grep -q -- "$msg" "$tmp/bad.out" && pass "$name" || { fail "$name" "no \"$msg\" in:"; cat "$tmp/bad.out"; }
}
ck="$tmp/gpt2-tiny-straight"
before=$(cat "$ck/latest")
bad adamw_checkpoint_with_adamw8bit_is_refused 'checkpoint optimizer "AdamW8bit" differs from this run'"'"'s "AdamW"' \
  train --model gpt2-tiny "${common[@]:0:${#common[@]}-2}" --optimizer adamw --steps 25 --save-dir "$ck" --resume
echo '{"optimizer": {"type": "AdamW8bit", "params": {"lr": 0.01, "min_8bit_size": 0}}}' >"$tmp/min0.json"
bad other_min_8bit_size_is_refused "min_8bit_size 4096, this run has 0" \
  train --config "$tmp/min0.json" --model gpt2-tiny "${common[@]}" --steps 25 --save-dir "$ck" --resume
bad other_min_8bit_size_is_refused_with_the_flag "min_8bit_size 4096, this run has 0" \
  train --config "$tmp/min0.json" --model gpt2-tiny "${common[@]:0:${#common[@]}-2}" --steps 25 --save-dir "$ck" --resume
echo '{"optimizer": {"type": "AdamW8bit", "params": {"min_8bit_size": -5}}}' >"$tmp/minneg.json"
bad negative_min_8bit_size_is_refused "optimizer.params.min_8bit_size must be a whole number" \
  train --config "$tmp/minneg.json" --model gpt2-tiny "${common[@]}" --steps 2
[ "$(cat "$ck/latest")" = "$before" ] && pass refused_runs_leave_the_checkpoint || fail refused_runs_leave_the_checkpoint
# an AdamW state file in place of the 8-bit one (checksums skipped): refused by name, not misread
mkdir -p "$tmp/swap" && cp -r "$ck/step_00000020" "$tmp/swap/" && echo step_00000020 >"$tmp/swap/latest" &&
  cp "$(ls -d "$tmp"/fp32/step_* | tail -1)/optim_00000_of_00001.safetensors" "$tmp/swap/step_00000020/"
bad foreign_state_file_is_refused "not an AdamW8bit state file" \
  train --model gpt2-tiny "${common[@]}" --steps 22 --save-dir "$tmp/swap" --resume --no-verify
