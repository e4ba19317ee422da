#!/usr/bin/env bash
# test_lora_zero.sh: ZeRO 1-3 and AdamW8bit over LoRA adapters under mpirun (oversubscribed on 2 cores).
# ZeRO then partitions the adapters' buffer alone; the frozen base stays whole on every rank.
#   * At 2 ranks (gpt2-tiny: tied head, AdamW) and 3 ranks (llama-tiny: untied head, all-linear,
#     AdamW8bit with min_8bit_size 256, so 8-bit and 32-bit state and blocks cut by the shards),
#     stages 1, 2 and 3 log stage 0's losses and save its adapters, byte for byte; AdamW's optimizer
#     state (the ranks' shards joined in order) equals stage 0's single file; under bf16 and fp16
#     stage 3's adapters equal stage 0's too. With gradient
#     accumulation stage 3 follows stage 0 within 2e-4 (its sums run in another order).
#   * The memory line: the bytes this rank allocated equal the printed formula 4P + (the stage's ZeRO
#     formula over the adapters' A parameters), for every stage at 2 ranks.
#   * Checkpoints: at 2 ranks, 3 + resume + 3 steps equal 6 straight (adapters, optimizer shards,
#     losses) at stages 0 and 3; the 3-rank AdamW8bit checkpoints of stages 0-3 continue on 1 process
#     to the same adapters whatever stage wrote them, and the stage-3 one on 2 ranks at stage 1.
# Prints PASS/FAIL lines for tests/run.sh; prints one SKIP line when mpirun is missing.
. "$(dirname "$0")/lib.sh" lora_zero
if ! command -v mpirun >/dev/null; then echo "SKIP lora_zero: mpirun not found"; exit 0; fi
log="$tmp/log"
root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
run() { local n=$1; shift; if [ "$n" -eq 1 ]; then timeout 300 "$@"; else timeout 300 mpirun "${root[@]}" --oversubscribe -np "$n" "$@"; fi; }
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/'; }
prepare_tiny_data || { echo "SKIP lora_zero: no ../shared/data/sotu"; exit 0; }
base=(train --data "$tmp/data" --seq-len 32 --seed 3 --lr 1e-2 --no-shuffle --eval-interval 0 --sample-tokens 0
      --log-interval 1 --threads 1 --lora-r 4)

# ---- 2 ranks, gpt2-tiny, AdamW: stages 1-3 equal stage 0; the memory line against the formula
g=("${base[@]}" --model gpt2-tiny --steps 6 --batch-size 2 --lora-targets c_attn,c_proj,c_fc)
for s in 0 1 2 3; do
  run 2 "$BIN" "${g[@]}" --zero-stage $s --save-dir "$tmp/g$s" >"$tmp/g$s.out" 2>&1 || { fail "gpt2_stage${s}_runs"; tail -5 "$tmp/g$s.out"; }
  losses "$tmp/g$s" >"$tmp/g$s.loss"
  joined_state "$tmp/g$s/step_00000006" >"$tmp/g$s.state"
done
[ "$(wc -l <"$tmp/g0.loss")" -eq 6 ] && same gpt2_2ranks_stages_1_2_3_losses_equal_stage0 "$tmp/g0.loss" "$tmp/g1.loss" \
  "$tmp/g2.loss" "$tmp/g3.loss" || fail gpt2_2ranks_stages_1_2_3_losses_equal_stage0 "$(wc -l <"$tmp/g0.loss") losses"
same gpt2_2ranks_stages_1_2_3_adapters_equal_stage0 "$tmp"/g{0,1,2,3}/step_00000006/adapter_model.safetensors
[ "$(wc -l <"$tmp/g0.state")" -eq 2 ] && same gpt2_2ranks_stages_1_2_3_adamw_state_equals_stage0 "$tmp"/g{0,1,2,3}.state ||
  fail gpt2_2ranks_stages_1_2_3_adamw_state_equals_stage0 "no state read"
[ -f "$tmp/g3/step_00000006/optim_00001_of_00002.safetensors" ] && pass zero_writes_one_adapter_state_shard_per_rank ||
  fail zero_writes_one_adapter_state_shard_per_rank
if python3 - "$tmp"/g{0,1,2,3}.out <<'PY'
import re, sys
for path in sys.argv[1:]:
    t = open(path).read()
    got = int(re.search(r"total [0-9.]+ MB = (\d+) bytes", t).group(1))
    m = re.search(r"formula 4P \+ (\S+ \+ \S+ \+ \S+) with P=(\d+) A=(\d+) S=(\d+) W=(\d+) K=(\d+): (\d+) bytes", t)
    formula, (P, A, S, W, K, f) = m.group(1), map(int, m.groups()[1:])
    stage = int(re.search(r"ZeRO stage (\d)", t).group(1))
    Pp = 2 * S  # stages 1-2 pad the adapters' buffer to 2 slices
    want = 4 * P + {0: 8 * A + K * A, 1: 4 * Pp + 4 * (Pp + S) + K * S, 2: 4 * Pp + 4 * (S + W) + K * S,
                    3: 8 * (S + W) + K * S}[stage]
    assert got == f == want, (path, formula, got, f, want)
    assert stage == 0 or S == (A + 1) // 2, (path, S, A)
PY
then pass memory_line_equals_the_formula_at_every_stage; else fail memory_line_equals_the_formula_at_every_stage; fi

# bf16 (bf16 activation storage where the CPU has it: the base's and the adapters' bf16 copies, the
# adapter windows' bf16 twins at stage 3) and fp16 (loss scaling): stage 3 equals stage 0 too
for prec in bf16 fp16; do
  for s in 0 3; do run 2 "$BIN" "${g[@]}" --precision $prec --zero-stage $s --save-dir "$tmp/$prec$s" >>"$log" 2>&1; done
  same "${prec}_stage3_adapters_equal_stage0" "$tmp/${prec}0/step_00000006/adapter_model.safetensors" \
    "$tmp/${prec}3/step_00000006/adapter_model.safetensors"
done

# gradient accumulation: stages 2-3 reduce every micro-batch (the running sum added in another order
# than stage 0's, so within 2e-4 rather than bit for bit, as for full training in test_zero.sh)
for s in 0 3; do
  run 2 "$BIN" "${g[@]}" --grad-accum 2 --zero-stage $s --save-dir "$tmp/acc$s" >>"$log" 2>&1
  losses "$tmp/acc$s" >"$tmp/acc$s.loss"
done
paste "$tmp/acc0.loss" "$tmp/acc3.loss" | awk 'NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d; if (d > 2e-4 * $1) bad = 1 }
  END { exit bad || n != 6 }' && pass stage3_with_accumulation_follows_stage0 ||
  { fail stage3_with_accumulation_follows_stage0; paste "$tmp/acc0.loss" "$tmp/acc3.loss"; }

# ---- 3 ranks, llama-tiny, AdamW8bit: stages 1-3 equal stage 0
echo '{"optimizer": {"type": "AdamW8bit", "params": {"lr": 0.01, "min_8bit_size": 256}}}' >"$tmp/adam8.json"
l=("${base[@]}" --model llama-tiny --steps 6 --batch-size 2 --lora-targets all-linear --config "$tmp/adam8.json"
   --lr-schedule constant)
for s in 0 1 2 3; do
  run 3 "$BIN" "${l[@]}" --zero-stage $s --save-dir "$tmp/l$s" >"$tmp/l$s.out" 2>&1 || { fail "llama_stage${s}_runs"; tail -5 "$tmp/l$s.out"; }
  losses "$tmp/l$s" >"$tmp/l$s.loss"
done
[ "$(wc -l <"$tmp/l0.loss")" -eq 6 ] && same llama_adamw8bit_3ranks_stages_1_2_3_losses_equal_stage0 \
  "$tmp"/l{0,1,2,3}.loss || fail llama_adamw8bit_3ranks_stages_1_2_3_losses_equal_stage0
same llama_adamw8bit_3ranks_stages_1_2_3_adapters_equal_stage0 "$tmp"/l{0,1,2,3}/step_00000006/adapter_model.safetensors
grep -q "optimizer AdamW8bit state on this rank: 2 B x [0-9]* (8-bit" "$tmp/l3.out" && pass adamw8bit_state_line_for_adapters ||
  fail adamw8bit_state_line_for_adapters

# ---- checkpoints: resume bit for bit at 2 ranks (stages 0 and 3)
for s in 0 3; do
  d="$tmp/r$s"; mkdir -p "$d/split"
  run 2 "$BIN" "${g[@]}" --zero-stage $s --save-interval 3 --save-dir "$d/straight" >>"$log" 2>&1
  cp -r "$d/straight/step_00000003" "$d/split/" && echo step_00000003 >"$d/split/latest"
  head -n 3 "$d/straight/metrics.jsonl" >"$d/split/metrics.jsonl"
  run 2 "$BIN" "${g[@]}" --zero-stage $s --save-dir "$d/split" --resume >>"$log" 2>&1
  same "stage${s}_2ranks_resume_is_bit_for_bit" "$d"/{straight,split}/step_00000006/adapter_model.safetensors
  joined_state "$d/straight/step_00000006" >"$d/sa"; joined_state "$d/split/step_00000006" >"$d/sb"
  [ -s "$d/sa" ] && same "stage${s}_2ranks_resumed_state_is_bit_for_bit" "$d/sa" "$d/sb" ||
    fail "stage${s}_2ranks_resumed_state_is_bit_for_bit" "no state read"
  losses "$d/straight" >"$d/a"; losses "$d/split" >"$d/b"
  same "stage${s}_2ranks_resumed_losses_identical" "$d/a" "$d/b"
done
# ---- the 3-rank AdamW8bit checkpoints continue on 1 process (one batch of 6 = 3 x 2): the same state
# whatever stage wrote it, so the same adapters; the stage-3 one continues on 2 ranks at stage 1 too
for s in 0 1 2 3; do
  mkdir -p "$tmp/c$s" && cp -r "$tmp/l$s/step_00000006" "$tmp/c$s/" && echo step_00000006 >"$tmp/c$s/latest"
  run 1 "$BIN" "${l[@]}" --batch-size 6 --steps 8 --save-dir "$tmp/c$s" --resume >"$tmp/c$s.out" 2>&1 ||
    { fail "stage${s}_checkpoint_resumes_on_1_process"; tail -5 "$tmp/c$s.out"; }
done
same adamw8bit_checkpoints_of_every_stage_continue_alike_on_1_process "$tmp"/c{0,1,2,3}/step_00000008/adapter_model.safetensors
mkdir -p "$tmp/c3b" && cp -r "$tmp/l3/step_00000006" "$tmp/c3b/" && echo step_00000006 >"$tmp/c3b/latest"
run 2 "$BIN" "${l[@]}" --batch-size 3 --zero-stage 1 --steps 8 --save-dir "$tmp/c3b" --resume >"$tmp/c3b.out" 2>&1 &&
  [ -f "$tmp/c3b/step_00000008/optim_00001_of_00002.safetensors" ] && pass stage3_3ranks_checkpoint_resumes_on_2_ranks_stage1 ||
  { fail stage3_3ranks_checkpoint_resumes_on_2_ranks_stage1; tail -5 "$tmp/c3b.out"; }
losses "$tmp/c0" | tail -2 >"$tmp/c0.tail"; losses "$tmp/c3b" | tail -2 >"$tmp/c3b.tail"
paste "$tmp/c0.tail" "$tmp/c3b.tail" | awk 'NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d; if (d > 2e-4 * $1) bad = 1 }
  END { exit bad || n != 2 }' && pass resumed_on_2_ranks_follows_1_process ||
  { fail resumed_on_2_ranks_follows_1_process; paste "$tmp/c0.tail" "$tmp/c3b.tail"; }
exit 0
