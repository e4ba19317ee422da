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
#   7. DDP and ZeRO stages 1-3 on the GPU through the NCCL comm backend, at world size 1 (one GPU runs
#      the device path of N ranks: bucketed all-reduce ordered after backward's stream, reduce-scatter,
#      all-gather, ZeRO-3 windows, checkpoints staged through the host): fp32 stages 0-3 and bf16
#      stages 1 and 3 give byte-identical step-20 weights and optimizer state, and identical losses,
#      to the plain single-GPU run (a one-rank collective moves data without arithmetic, and the 1/N
#      scaling is by 1); a bf16 stage-3 NCCL run resumed from its step-10 checkpoint, and a plain run
#      resumed from it, reach the same bytes; a stage-3 run samples text after training.
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
# 7. NCCL at world size 1: DDP and ZeRO 1-3 against the plain single-GPU run, bit for bit
if "$BIN" report 2>/dev/null | grep -Eq '^  comm nccl +built in'; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  unset SHARDLM_RANK SHARDLM_WORLD_SIZE RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
  one_rank() {  # one process under mpirun (a singleton MPI start without it)
    if command -v mpirun >/dev/null 2>&1; then mpirun --allow-run-as-root -np 1 "$@"; else "$@"; fi
  }
  step_losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/,"tokens_per_s".*//'; }
  same_run() {  # same_run NAME DIR REF: step-20 weights, optimizer state and every step's loss identical
    local a="$2/step_00000020" b="$3/step_00000020"
    if cmp -s "$a/model.safetensors" "$b/model.safetensors" &&
       cmp -s "$a/optim_00000_of_00001.safetensors" "$b/optim_00000_of_00001.safetensors" &&
       [ -s "$2/metrics.jsonl" ] && [ "$(step_losses "$2")" = "$(step_losses "$3")" ]; then
      pass "$1"
    else
      fail "$1" "step-20 checkpoint or losses differ between $2 and $3"
    fi
  }
  n20=("${common[@]}" --steps 20 --device cuda --save-interval 10)
  "$BIN" "${n20[@]}" --precision fp32 --save-dir "$tmp/n_plain" >"$logdir/nccl1_plain.log" 2>&1 ||
    fail nccl1_plain_runs "$(tail -3 "$logdir/nccl1_plain.log")"
  for s in 0 1 2 3; do
    sample=0; [ $s -eq 3 ] && sample=16   # stage 3 gathers the weights on the GPU to sample after training
    one_rank "$BIN" "${n20[@]}" --precision fp32 --comm-backend nccl --zero-stage $s --sample-tokens $sample \
      --save-dir "$tmp/n_s$s" >"$logdir/nccl1_fp32_stage$s.log" 2>&1 ||
      fail "nccl1_fp32_stage${s}_runs" "$(tail -3 "$logdir/nccl1_fp32_stage$s.log")"
    same_run "nccl_world1_fp32_stage${s}_bit_identical_to_one_gpu" "$tmp/n_s$s" "$tmp/n_plain"
  done
  grep -q '^sample (16 tokens' "$logdir/nccl1_fp32_stage3.log" && pass nccl_world1_stage3_samples_after_training ||
    fail nccl_world1_stage3_samples_after_training "$(tail -3 "$logdir/nccl1_fp32_stage3.log")"
  # bf16: fp32 master slices, gathered for the checkpoint (stage 1 through host memory, stage 3
  # through the windows); the reference is step 5's plain bf16 run with the same flags
  for s in 1 3; do
    one_rank "$BIN" "${n20[@]}" --precision bf16 --comm-backend nccl --zero-stage $s --save-dir "$tmp/nb_s$s" \
      >"$logdir/nccl1_bf16_stage$s.log" 2>&1 || fail "nccl1_bf16_stage${s}_runs" "$(tail -3 "$logdir/nccl1_bf16_stage$s.log")"
    same_run "nccl_world1_bf16_stage${s}_bit_identical_to_one_gpu" "$tmp/nb_s$s" "$tmp/r1"
  done
  # resume a ZeRO-3 NCCL run from its step-10 checkpoint, with NCCL stage 3 and with a plain GPU run
  for how in nccl plain; do
    d="$tmp/nr_$how"; mkdir -p "$d" && cp -r "$tmp/nb_s3/step_00000010" "$d/" && echo step_00000010 >"$d/latest"
    if [ $how = nccl ]; then
      one_rank "$BIN" "${n20[@]}" --precision bf16 --comm-backend nccl --zero-stage 3 --resume auto --save-dir "$d" \
        >"$logdir/nccl1_resume_$how.log" 2>&1
    else
      "$BIN" "${n20[@]}" --precision bf16 --resume auto --save-dir "$d" >"$logdir/nccl1_resume_$how.log" 2>&1
    fi || fail "nccl1_resume_${how}_runs" "$(tail -3 "$logdir/nccl1_resume_$how.log")"
    cmp -s "$d/step_00000020/model.safetensors" "$tmp/nb_s3/step_00000020/model.safetensors" &&
      cmp -s "$d/step_00000020/optim_00000_of_00001.safetensors" "$tmp/nb_s3/step_00000020/optim_00000_of_00001.safetensors" &&
      pass "nccl_world1_stage3_checkpoint_resumes_${how}_bit_identical" ||
      fail "nccl_world1_stage3_checkpoint_resumes_${how}_bit_identical"
  done
else
  fail nccl_backend_built "shardlm report does not list the nccl comm backend as built in"
fi

echo "logs: $logdir"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
