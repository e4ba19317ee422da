#!/usr/bin/env bash
# test_qlora_zero.sh: ZeRO 1-3 over LoRA adapters on a quantised (NF4) base, 2 ranks under mpirun
# (oversubscribed on 2 cores). ZeRO partitions the adapters' buffer alone; the quantised base (codes,
# block statistics and full-precision tensors) stays whole on every rank, as for LoRA on an fp32 base.
#   * gpt2-tiny, AdamW: stages 1, 2 and 3 log stage 0's losses and save its adapters byte for byte, and
#     AdamW's state (the ranks' shards joined in order) equals stage 0's; under bf16 (bf16 tiles,
#     bnb_4bit_compute_dtype bfloat16) stages 1 and 3 equal bf16 stage 0 the same way.
#   * The memory line's total equals its printed formula 4P + Q + (the stage's ZeRO formula over the
#     adapters' A parameters) and that formula recomputed here, at every stage.
#   * 3 + resume + 3 equals 6 straight at stage 3 (adapters, optimizer shards, losses).
# Prints PASS/FAIL lines for tests/run.sh; prints one SKIP line when mpirun is missing.
. "$(dirname "$0")/lib.sh" qlora_zero
if ! command -v mpirun >/dev/null; then echo "SKIP qlora_zero: mpirun not found"; exit 0; fi
root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
run2() { timeout 300 mpirun "${root[@]}" --oversubscribe -np 2 "$@"; }
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/'; }
prepare_tiny_data || { echo "SKIP qlora_zero: no ../shared/data/sotu"; exit 0; }
g=(train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --seed 3 --lr 1e-2 --no-shuffle --eval-interval 0
   --sample-tokens 0 --log-interval 1 --threads 1 --batch-size 2 --quantize nf4 --lora-r 4
   --lora-targets c_attn,c_proj,c_fc --steps 6 --save-interval 3)

for p in fp32 bf16; do
  stages="0 1 2 3"; [ $p = bf16 ] && stages="0 1 3"
  for s in $stages; do
    d="$tmp/$p-z$s"
    run2 "$BIN" "${g[@]}" --precision $p --zero-stage $s --save-dir "$d" >"$d.out" 2>&1 ||
      { fail "qlora_${p}_stage${s}_runs" "$(grep -m1 error "$d.out")"; }
    losses "$d" >"$d.loss"
    joined_state "$d/step_00000006" >"$d.state"
  done
  list() { for s in $stages; do echo "$tmp/$p-z$s$1"; done; }
  [ "$(wc -l <"$tmp/$p-z0.loss")" -eq 6 ] && same "qlora_${p}_stages_losses_equal_stage0" $(list .loss) ||
    fail "qlora_${p}_stages_losses_equal_stage0" "$(wc -l <"$tmp/$p-z0.loss") losses"
  same "qlora_${p}_stages_adapters_equal_stage0" $(list /step_00000006/adapter_model.safetensors)
  [ "$(wc -l <"$tmp/$p-z0.state")" -eq 2 ] && same "qlora_${p}_stages_adamw_state_equals_stage0" $(list .state) ||
    fail "qlora_${p}_stages_adamw_state_equals_stage0" "no state read"
done
expect qlora_zero_writes_one_state_shard_per_rank test -f "$tmp/fp32-z3/step_00000006/optim_00001_of_00002.safetensors"
expect qlora_zero_bf16_runs_bf16_tiles grep -q 'ops cpu-bf16.*+quant' "$tmp/bf16-z3.out"

# the memory line: this rank's bytes = the printed formula = 4P + Q + the stage's ZeRO formula over A
if python3 - "$tmp"/fp32-z{0,1,2,3}.out "$tmp"/bf16-z3.out <<'PY'
import re, sys
for path in sys.argv[1:]:
    t = open(path).read()
    got = int(re.search(r"total [0-9.]+ MB = (\d+) bytes", t).group(1))
    stage = int(re.search(r"ZeRO stage (\d)", t).group(1))
    f = re.search(r"formula 4P \+ Q \+ .* P=(\d+) \(full-precision floats\) Q=(\d+) .*weights\): (\d+) bytes", t)
    P, Q, printed = map(int, f.groups())
    A = int(re.search(r"adapters (\d+) parameters", t).group(1))
    K = 8
    if stage == 0:
        want = 4 * P + Q + 8 * A + K * A
    else:
        S, W = map(int, re.search(r"A=\d+ S=(\d+) W=(\d+) K=", t).groups())
        assert S == (A + 1) // 2, (path, S, A)
        Pp = 2 * S  # stages 1-2 pad the adapters' buffer to 2 slices
        want = 4 * P + Q + {1: 4 * Pp + 4 * (Pp + S) + K * S, 2: 4 * Pp + 4 * (S + W) + K * S,
                            3: 8 * (S + W) + K * S}[stage]
    assert got == printed == want, (path, stage, got, printed, want)
PY
then pass qlora_memory_line_equals_the_formula_at_every_stage; else fail qlora_memory_line_equals_the_formula_at_every_stage; fi

# resume at stage 3: 3 + resume + 3 == 6 straight
cut_run "$tmp/fp32-z3" "$tmp/split3" 3
run2 "$BIN" "${g[@]}" --zero-stage 3 --save-dir "$tmp/split3" --resume >"$tmp/split3.out" 2>&1
losses "$tmp/split3" >"$tmp/split3.loss"
joined_state "$tmp/split3/step_00000006" >"$tmp/split3.state"
same qlora_zero3_resume_adapters_bit_for_bit "$tmp"/{fp32-z3,split3}/step_00000006/adapter_model.safetensors
same qlora_zero3_resume_optimizer_state_bit_for_bit "$tmp/fp32-z3.state" "$tmp/split3.state"
same qlora_zero3_resume_losses_bit_for_bit "$tmp/fp32-z3.loss" "$tmp/split3.loss"
