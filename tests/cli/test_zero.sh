#!/usr/bin/env bash
# test_zero.sh: ZeRO stages 0-3 under mpirun (oversubscribed on 2 cores).
#   * For the same global batch (12 sequences) and seed, world sizes 1-4 x stages 0-3 give the loss
#     curve of one process within 2e-4 relative per step. Why that tolerance: fp32 sums taken in
#     another order (each rank's GEMMs sum over fewer rows, and the ranks' partial gradients are
#     added in the collective's order) differ by a few ulps per step, which 8 steps of Adam at
#     lr 1e-2 grow to ~1e-5 relative; 2e-4 leaves a margin and still catches any real error (a
#     missing or doubled gradient contribution moves the loss by > 1e-2 within two steps).
#   * Within one world size, stages 1, 2 and 3 do the same arithmetic per element as stage 0: the
#     weights and the consolidated optimizer state are bit-identical (GPT-2 with a tied head, and
#     LLaMA with an untied head), with prefetching on or off.
#   * Gradient accumulation at stages 2 and 3 (reduced every micro-batch) matches the bigger batch.
#   * Memory: the per-rank bytes printed at start equal the formula for each stage, and at stage 3
#     the model states are 1/N of stage 0's plus the gathered windows.
#   * Checkpoints: a 4-rank stage-3 checkpoint resumes on 4 ranks bit-for-bit, resumes on 2 ranks at
#     stage 1 on the same loss curve, and consolidates to the weights it holds.
# Prints PASS/FAIL lines for tests/run.sh; prints one SKIP line when mpirun is missing.
set -u
BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$BIN" ] || exit 0
if ! command -v mpirun >/dev/null; then echo "SKIP zero: mpirun not found"; exit 0; fi
DATA=${SHARDLM_DATA:-../shared/data}
tmp=$(mktemp -d /tmp/shardlm_test_zero_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
log="$tmp/log"
export OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=0  # Open MPI's own allocations are not ours to report
root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
run() { local n=$1; shift; if [ "$n" -eq 1 ]; then timeout 300 "$@"; else timeout 300 mpirun "${root[@]}" --oversubscribe -np "$n" "$@"; fi; }
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; [ $# -gt 0 ] && echo "  $*"; tail -n 20 "$log"; }
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/'; }
close() {  # close NAME A B: every line of files A and B within 2e-4 relative
  if [ -s "$2" ] && [ "$(wc -l <"$2")" -eq "$(wc -l <"$3")" ] &&
     paste "$2" "$3" | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 2e-4 * $2) bad = 1 } END { exit bad }'; then
    pass "$1"
  else
    fail "$1"; paste "$2" "$3" | head -12
  fi
}
same() {  # same NAME FILE...: all files exist and are byte-identical
  local name=$1 first=$2; shift 2
  for f in "$first" "$@"; do [ -f "$f" ] || { fail "$name" "missing $f"; return; }; done
  for f in "$@"; do cmp -s "$first" "$f" || { fail "$name" "$f differs from $first"; return; }; done
  pass "$name"
}

mkdir -p "$tmp/corpus"
cp "$DATA"/sotu/179*.txt "$tmp/corpus/"
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/data" --train-tokenizer 512 >>"$log" 2>&1
common=(train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --steps 8 --seed 3 --lr 1e-2 --no-shuffle
        --eval-interval 4 --eval-batches 2 --sample-tokens 0 --log-interval 4 --threads 1)

# ---- world sizes 1-4 x stages 0-3, global batch 12
for n in 1 2 3 4; do
  b=$((12 / n))
  for s in 0 1 2 3; do
    d="$tmp/w${n}s$s"
    run $n "$BIN" "${common[@]}" --batch-size $b --zero-stage $s --save-dir "$d" >"$d.out" 2>&1 || fail "world${n}_stage${s}_runs"
    losses "$d" >"$d.loss"
  done
done
for n in 1 2 3 4; do
  for s in 0 1 2 3; do
    [ "$n$s" = 10 ] || close "world${n}_stage${s}_matches_one_process" "$tmp/w${n}s$s.loss" "$tmp/w1s0.loss"
  done
  for s in 0 1 2 3; do
    "$BIN" convert --checkpoint "$tmp/w${n}s$s" --output "$tmp/w${n}s$s.hf" --with-optimizer >>"$log" 2>&1
  done
  same "world${n}_stages_1_2_3_weights_equal_stage0" "$tmp/w${n}s0.hf/model.safetensors" \
    "$tmp/w${n}s1.hf/model.safetensors" "$tmp/w${n}s2.hf/model.safetensors" "$tmp/w${n}s3.hf/model.safetensors"
  same "world${n}_stages_1_2_3_optimizer_equals_stage0" "$tmp/w${n}s0.hf/optimizer.safetensors" \
    "$tmp/w${n}s1.hf/optimizer.safetensors" "$tmp/w${n}s2.hf/optimizer.safetensors" "$tmp/w${n}s3.hf/optimizer.safetensors"
done
[ -f "$tmp/w4s3/step_00000008/optim_00003_of_00004.safetensors" ] && pass stage3_writes_one_optimizer_shard_per_rank ||
  fail stage3_writes_one_optimizer_shard_per_rank

# ---- LLaMA (untied head in the last unit) and prefetch off
llama=(train --model llama-tiny --data "$tmp/data" --seq-len 32 --steps 6 --seed 5 --lr 1e-2 --no-shuffle
       --eval-interval 0 --sample-tokens 0 --log-interval 3 --threads 1 --batch-size 4)
echo '{"gradient_clipping": 1.0, "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0}}' >"$tmp/noprefetch.json"
run 3 "$BIN" "${llama[@]}" --zero-stage 0 --save-dir "$tmp/l0" >>"$log" 2>&1 || fail llama_stage0_runs
run 3 "$BIN" "${llama[@]}" --zero-stage 3 --save-dir "$tmp/l3" >>"$log" 2>&1 || fail llama_stage3_runs
run 3 "$BIN" "${llama[@]}" --config "$tmp/noprefetch.json" --save-dir "$tmp/l3np" >>"$log" 2>&1 || fail llama_noprefetch_runs
same llama_world3_stage3_weights_equal_stage0 "$tmp/l0/step_00000006/model.safetensors" "$tmp/l3/step_00000006/model.safetensors"
same stage3_prefetch_off_is_bit_identical "$tmp/l3/step_00000006/model.safetensors" "$tmp/l3np/step_00000006/model.safetensors"

# ---- accumulation: 2 x micro 3 per rank = micro 6, reduced every micro-batch at stages 2 and 3
for s in 2 3; do
  run 2 "$BIN" "${common[@]}" --batch-size 3 --grad-accum 2 --zero-stage $s --save-dir "$tmp/acc$s" >>"$log" 2>&1 ||
    fail "stage${s}_accumulation_runs"
  losses "$tmp/acc$s" >"$tmp/acc$s.loss"
  close "stage${s}_accumulation_matches_bigger_batch" "$tmp/acc$s.loss" "$tmp/w2s0.loss"
done

# ---- memory against the formula; a deeper model so the windows are small next to the whole
cat >"$tmp/deep.json" <<'EOF'
{"model_type": "gpt2", "vocab_size": 512, "n_positions": 64, "n_embd": 64, "n_layer": 8, "n_head": 4}
EOF
mem=(train --model "$tmp/deep.json" --data "$tmp/data" --seq-len 32 --steps 1 --batch-size 4 --no-save
     --eval-interval 0 --sample-tokens 0 --threads 1)
for n in 1 3 4; do
  for s in 0 1 2 3; do
    run $n "$BIN" "${mem[@]}" --zero-stage $s >"$tmp/mem$n$s.out" 2>&1 || fail "memory_world${n}_stage${s}_runs"
    got=$(sed -n 's/.*total [0-9.]* MB = \([0-9]*\) bytes.*/\1/p' "$tmp/mem$n$s.out")
    want=$(sed -n 's/.*formula .*: \([0-9]*\) bytes;.*/\1/p' "$tmp/mem$n$s.out")
    if [ -n "$got" ] && [ "$got" = "$want" ]; then pass "memory_world${n}_stage${s}_matches_formula"
    else fail "memory_world${n}_stage${s}_matches_formula" "allocated '$got', formula '$want'"; grep -A1 'memory per' "$tmp/mem$n$s.out"; fi
  done
done
# stage 3 on 4 ranks: (allocated - the windows' 8W bytes) is 1/N of stage 0 (rounding S up), and the
# whole is below half of stage 0 for this model
t0=$(sed -n 's/.*total [0-9.]* MB = \([0-9]*\) bytes.*/\1/p' "$tmp/mem40.out")
t3=$(sed -n 's/.*total [0-9.]* MB = \([0-9]*\) bytes.*/\1/p' "$tmp/mem43.out")
w3=$(sed -n 's/.* W=\([0-9]*\) .*/\1/p' "$tmp/mem43.out")
if [ -n "$t0" ] && [ -n "$t3" ] && awk -v a="$t0" -v b="$t3" -v w="$w3" \
     'BEGIN { s = b - 8 * w; r = s / (a / 4); exit !(r >= 1 && r < 1.001 && b < a / 2) }'; then
  pass stage3_states_are_1_over_n_plus_windows
else
  fail stage3_states_are_1_over_n_plus_windows "stage0 $t0 bytes, stage3 $t3 bytes, W $w3 floats"
fi

# ---- checkpoints: 4 ranks at stage 3, saved at step 4
z3=(--batch-size 3 --zero-stage 3)
run 4 "$BIN" "${common[@]}" "${z3[@]}" --save-interval 4 --save-dir "$tmp/c43" >>"$log" 2>&1 || fail stage3_save_runs
mkdir -p "$tmp/c43r"; cp -r "$tmp/c43/step_00000004" "$tmp/c43r/"; echo step_00000004 >"$tmp/c43r/latest"
run 4 "$BIN" "${common[@]}" "${z3[@]}" --save-dir "$tmp/c43r" --resume >>"$log" 2>&1 || fail stage3_resume_runs
same stage3_resume_on_4_ranks_is_bit_for_bit "$tmp/c43/step_00000008/model.safetensors" "$tmp/c43r/step_00000008/model.safetensors"
same stage3_resume_restores_optimizer_shards "$tmp/c43/step_00000008/optim_00002_of_00004.safetensors" \
  "$tmp/c43r/step_00000008/optim_00002_of_00004.safetensors"
# the same step-4 state on 2 ranks at stage 1 (global batch kept: micro 6)
mkdir -p "$tmp/c21"; cp -r "$tmp/c43/step_00000004" "$tmp/c21/"; echo step_00000004 >"$tmp/c21/latest"
run 2 "$BIN" "${common[@]}" --batch-size 6 --zero-stage 1 --save-dir "$tmp/c21" --resume >"$tmp/c21.out" 2>&1 ||
  fail stage3_checkpoint_on_2_ranks_stage1_runs
losses "$tmp/c43" | tail -n 4 >"$tmp/c43.tail"; losses "$tmp/c21" | tail -n 4 >"$tmp/c21.tail"
close stage3_checkpoint_from_4_ranks_resumes_on_2_ranks_stage1 "$tmp/c21.tail" "$tmp/c43.tail"
grep -q "resumed from .* at step 4" "$tmp/c21.out" && pass stage3_resume_reports_step || fail stage3_resume_reports_step
"$BIN" convert --checkpoint "$tmp/c43/step_00000004" --output "$tmp/c43.hf" >>"$log" 2>&1 &&
  same stage3_checkpoint_consolidates "$tmp/c43/step_00000004/model.safetensors" "$tmp/c43.hf/model.safetensors" ||
  fail stage3_checkpoint_consolidates

# ---- bad input: a stage outside 0-3 is refused before training
echo '{"zero_optimization": {"stage": 4}}' >"$tmp/bad.json"
"$BIN" "${common[@]}" --batch-size 12 --config "$tmp/bad.json" --save-dir "$tmp/bad" >"$tmp/bad.out" 2>&1
[ $? -ne 0 ] && grep -q "stage must be 0, 1, 2 or 3" "$tmp/bad.out" && pass bad_stage_is_refused || fail bad_stage_is_refused
exit 0
