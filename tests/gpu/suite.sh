#!/usr/bin/env bash
# tests/gpu/suite.sh (`make test-gpu-suite`): the GPU verification of the CUDA backend in one call,
# on a machine with an NVIDIA GPU (the rest of the tests run without one, in `make test`).
#   1. tests/gpu/run.sh: every CUDA op against the CPU op on random inputs (fp32 within 1e-5
#      relative; optimizer passes and rounding bit-identical; every op run twice is bit-identical),
#      and the NCCL comm backend against MPI.
#   2. tests/gpu/test_model_cuda.c: gpt2-tiny and llama-tiny logits/loss (1e-5) and every gradient
#      (1e-4) against the CPU fp32 path; 5 AdamW steps agree with the CPU (1e-4) and two GPU runs
#      are bit-identical.
#   3. 300 training steps of gpt2-demo on the GPU (fp32, and bf16) against the CPU fp32 curve: every
#      step's loss within 2e-2 relative (fp32) / 5e-2 (bf16); why: the backends sum in different
#      orders, and 300 Adam steps grow ulp-level differences to ~1e-3; a real error (a wrong
#      gradient, a missing unscale) moves the curve by far more within a few steps.
#   4. fp16 on the GPU with SHARDLM_FAULT=0:5:overflow: exactly step 5 is skipped (one log line;
#      checkpoints 4 and 5 hold identical weights and optimizer state).
#   5. A GPU run resumed from its step-10 checkpoint reaches a byte-identical step-20 checkpoint.
#   6. compute-sanitizer (memcheck, racecheck, synccheck) on 2 steps: no errors.
# Logs go to $OUT/gpu_suite (when OUT is set) or a temporary directory. Ends "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
DATA=${SHARDLM_DATA:-../shared/data}
logdir=${OUT:+$OUT/gpu_suite}
logdir=${logdir:-$(mktemp -d /tmp/shardlm_gpu_suite_XXXXXX)}
mkdir -p "$logdir"
passed=0 failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; shift; [ $# -gt 0 ] && echo "  $*"; failed=$((failed + 1)); }
count() {  # adds a sub-suite's "N passed, N failed" line
  local line; line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -1)
  if [ -z "$line" ]; then fail "$2_summary" "no summary line in $1"; return; fi
  passed=$((passed + $(echo "$line" | cut -d' ' -f1))); failed=$((failed + $(echo "$line" | cut -d' ' -f3)))
}
nvidia-smi -L >"$logdir/gpus.txt" 2>&1 || { echo "SKIP gpu suite: no GPU (nvidia-smi -L failed)"; exit 0; }
cat "$logdir/gpus.txt"
make -j"$(nproc)" all >"$logdir/build.log" 2>&1 || { fail build "$(tail -20 "$logdir/build.log")"; echo "$passed passed, $failed failed"; exit 1; }
BIN=build/shardlm
"$BIN" report >"$logdir/report.txt" 2>&1
grep -q "ops cuda.*built in" "$logdir/report.txt" && pass cuda_backend_built || fail cuda_backend_built "$(cat "$logdir/report.txt")"

# 1. ops and NCCL
bash tests/gpu/run.sh >"$logdir/ops_and_nccl.txt" 2>&1
grep -E '^(PASS|FAIL|SKIP)' "$logdir/ops_and_nccl.txt"
count "$logdir/ops_and_nccl.txt" ops_and_nccl

# 2. the model
BLAS_DIR=${BLAS_DIR:-/usr/lib/x86_64-linux-gnu/openblas-openmp}
BLAS_INC=${BLAS_INC:-/usr/include/x86_64-linux-gnu/openblas-openmp}
# shellcheck disable=SC2046
if gcc -std=c17 -Wall -Wextra -Werror -D_GNU_SOURCE -fopenmp -O2 -Iinclude -Isrc -I"$BLAS_INC" $(mpicc --showme:compile) \
     tests/gpu/test_model_cuda.c build/libshardlm.a -o "$logdir/test_model_cuda" -L"$BLAS_DIR" -Wl,-rpath,"$BLAS_DIR" \
     -lopenblas -lcjson -lpcre2-8 $(mpicc --showme:link) -L"$CUDA_HOME/lib64" -lcudart_static -ldl -lrt -lpthread -lm \
     -lstdc++ >"$logdir/model_cc.log" 2>&1; then
  "$logdir/test_model_cuda" cuda:0 >"$logdir/model.txt" 2>&1
  grep -E '^(PASS|FAIL)' "$logdir/model.txt"
  count "$logdir/model.txt" model
else
  fail test_model_cuda_compiles "$(tail -20 "$logdir/model_cc.log")"
fi

# data for the training checks
tmp=$(mktemp -d /tmp/shardlm_gpu_train_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$BIN" prepare --input "$DATA/sotu" --output "$tmp/data" >"$logdir/prepare.log" 2>&1 || fail prepare "$(tail -5 "$logdir/prepare.log")"
common=(train --model gpt2-demo --data "$tmp/data" --seq-len 128 --batch-size 8 --seed 1 --lr 1e-3 --no-shuffle
        --eval-interval 0 --sample-tokens 0 --log-interval 50)
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/'; }
close() {  # close NAME TOL A B
  local worst
  worst=$(paste "$3" "$4" | awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / $2; if (r > w) w = r } END { printf "%.3g", w }')
  if [ -s "$3" ] && [ "$(wc -l <"$3")" -eq "$(wc -l <"$4")" ] && awk -v w="$worst" -v t="$2" 'BEGIN { exit !(w <= t) }'; then
    pass "$1 (worst step $worst relative)"
  else
    fail "$1" "worst step $worst relative (tolerance $2), $(wc -l <"$3") vs $(wc -l <"$4") steps"
  fi
}

# 3. 300 steps, GPU vs CPU fp32
OMP_NUM_THREADS=$(nproc) "$BIN" "${common[@]}" --steps 300 --device cpu --no-save --save-dir "$tmp/cpu" \
  --metrics "$tmp/cpu/metrics.jsonl" >"$logdir/train_cpu.log" 2>&1 || fail train_cpu_runs "$(tail -3 "$logdir/train_cpu.log")"
for p in fp32 bf16; do
  "$BIN" "${common[@]}" --steps 300 --device cuda --precision $p --no-save --save-dir "$tmp/gpu_$p" \
    --metrics "$tmp/gpu_$p/metrics.jsonl" >"$logdir/train_gpu_$p.log" 2>&1 || fail "train_gpu_${p}_runs" "$(tail -3 "$logdir/train_gpu_$p.log")"
  losses "$tmp/gpu_$p" >"$tmp/gpu_$p.loss"
done
losses "$tmp/cpu" >"$tmp/cpu.loss"
paste "$tmp/cpu.loss" "$tmp/gpu_fp32.loss" "$tmp/gpu_bf16.loss" >"$logdir/loss_curves.tsv"
close gpu_fp32_300_steps_track_cpu_fp32 2e-2 "$tmp/gpu_fp32.loss" "$tmp/cpu.loss"
close gpu_bf16_300_steps_track_cpu_fp32 5e-2 "$tmp/gpu_bf16.loss" "$tmp/cpu.loss"

# 4. fp16 with an injected overflow at step 5
SHARDLM_FAULT=0:5:overflow "$BIN" "${common[@]}" --steps 8 --device cuda --precision fp16 --save-interval 1 \
  --save-dir "$tmp/ov" >"$logdir/overflow.log" 2>&1 || fail fp16_overflow_run "$(tail -3 "$logdir/overflow.log")"
[ "$(grep -c 'gradient overflow' "$logdir/overflow.log")" -eq 1 ] && grep -q '^step 5 | fp16 gradient overflow' "$logdir/overflow.log" &&
  pass gpu_fp16_overflow_skips_exactly_step_5 || fail gpu_fp16_overflow_skips_exactly_step_5 "$(grep overflow "$logdir/overflow.log")"
cmp -s "$tmp/ov/step_00000004/model.safetensors" "$tmp/ov/step_00000005/model.safetensors" &&
  cmp -s "$tmp/ov/step_00000004/optim_00000_of_00001.safetensors" "$tmp/ov/step_00000005/optim_00000_of_00001.safetensors" &&
  ! cmp -s "$tmp/ov/step_00000005/model.safetensors" "$tmp/ov/step_00000006/model.safetensors" &&
  pass gpu_skipped_step_changes_nothing || fail gpu_skipped_step_changes_nothing

# 5. resume on the GPU
"$BIN" "${common[@]}" --steps 20 --device cuda --precision bf16 --save-interval 10 --save-dir "$tmp/r1" \
  >"$logdir/resume_a.log" 2>&1 || fail gpu_run_20 "$(tail -3 "$logdir/resume_a.log")"
mkdir -p "$tmp/r2" && cp -r "$tmp/r1/step_00000010" "$tmp/r2/" && echo step_00000010 >"$tmp/r2/latest"
"$BIN" "${common[@]}" --steps 20 --device cuda --precision bf16 --resume auto --save-dir "$tmp/r2" \
  >"$logdir/resume_b.log" 2>&1 || fail gpu_resume_runs "$(tail -3 "$logdir/resume_b.log")"
cmp -s "$tmp/r1/step_00000020/model.safetensors" "$tmp/r2/step_00000020/model.safetensors" &&
  cmp -s "$tmp/r1/step_00000020/optim_00000_of_00001.safetensors" "$tmp/r2/step_00000020/optim_00000_of_00001.safetensors" &&
  pass gpu_resume_is_bit_identical || fail gpu_resume_is_bit_identical

# 6. compute-sanitizer
CS=$(command -v compute-sanitizer 2>/dev/null || echo "$CUDA_HOME/bin/compute-sanitizer")
if [ -x "$CS" ]; then
  for tool in memcheck racecheck synccheck; do
    "$CS" --tool $tool --error-exitcode 99 "$BIN" "${common[@]}" --model gpt2-tiny --seq-len 32 --batch-size 2 --steps 2 \
      --device cuda --no-save >"$logdir/sanitizer_$tool.log" 2>&1; rc=$?
    grep -q "ERROR SUMMARY: 0 errors" "$logdir/sanitizer_$tool.log" && [ $rc -eq 0 ] && pass "compute_sanitizer_${tool}_clean" ||
      fail "compute_sanitizer_${tool}_clean" "$(grep -E 'ERROR SUMMARY|Invalid|Race|error' "$logdir/sanitizer_$tool.log" | head -5)"
  done
else
  fail compute_sanitizer_available "$CS not found"
fi
echo "logs: $logdir"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
