#!/usr/bin/env bash
# tests/gpu/suite.sh (`make test-gpu-suite`): the GPU verification of the CUDA backend in one call,
# on a machine with an NVIDIA GPU (the rest of the tests run without one, in `make test`).
#   1. tests/gpu/run.sh: every CUDA op against the CPU op on random inputs (fp32 within 1e-5
#      relative; optimizer passes and rounding bit-identical; every op run twice is bit-identical),
#      and the NCCL comm backend against MPI.
#   2. tests/gpu/test_model_cuda.c: gpt2-tiny and llama-tiny logits/loss (1e-5) and every gradient
#      (1e-4) against the CPU fp32 path; 5 AdamW steps agree with the CPU (1e-4) and two GPU runs
#      are bit-identical. bf16 activation storage (cuda-bf16) against the CPU's emulation of it: loss
#      1e-2, logits and gradients 5e-2, the arena about half, 5 steps bit-identical run to run.
#      tests/gpu/test_generate_cuda.c: decoding on the GPU (KV cache in device memory, the CUDA decode
#      kernel) against the CPU: prefill and every step's logits within 2e-5, greedy tokens equal
#      (outside near-ties), sl_generate's greedy tokens equal, bit-identical run to run; bf16
#      storage against the CPU's emulation within 5e-2. In `train`: `shardlm generate --device cuda`
#      on the step-20 checkpoint prints the CPU's greedy text.
#   3. 300 training steps of gpt2-demo on the GPU (fp32; bf16 with bf16 activation storage and with
#      fp32 storage, SHARDLM_BF16_STORAGE=0) against the CPU fp32 curve: every
#      step's loss within 2e-2 relative (fp32) / 5e-2 (bf16); why: the backends sum in different
#      orders, and 300 Adam steps grow ulp-level differences to ~1e-3; a real error (a wrong
#      gradient, a missing unscale) moves the curve by far more within a few steps.
#   4. fp16 on the GPU with SHARDLM_FAULT=0:5:overflow: exactly step 5 is skipped (one log line;
#      checkpoints 4 and 5 hold identical weights and optimizer state).
#   5. A GPU run resumed from its step-10 checkpoint reaches a byte-identical step-20 checkpoint.
#   6. compute-sanitizer (memcheck, racecheck, synccheck; memcheck again with bf16) on 2 steps: no errors.
#   7. DDP and ZeRO stages 1-3 on the GPU through the NCCL comm backend, at world size 1 (one GPU runs
#      the device path of N ranks: bucketed all-reduce ordered after backward's stream, reduce-scatter,
#      all-gather, ZeRO-3 windows, checkpoints staged through the host): fp32 stages 0-3 and bf16
#      stages 1 and 3 give byte-identical step-20 weights and optimizer state, and identical losses,
#      to the plain single-GPU run (bf16 with bf16 activation storage; a one-rank collective moves
#      data without arithmetic, and the 1/N
#      scaling is by 1); a bf16 stage-3 NCCL run resumed from its step-10 checkpoint, and a plain run
#      resumed from it, reach the same bytes; a stage-3 run samples text after training.
#
# usage: suite.sh [build|ops|train|all] (default all), one device-tool call each or together:
#   build  make (B=build/gpu) + `shardlm report` + the GPU test programs compile (tests/gpu/run.sh build);
#   ops    1 and 2 (the op groups, NCCL collectives, the model);  train  3-7;  all  everything.
# Every part builds first (a no-op when build/gpu is up to date, e.g. on a warm machine), every step runs
# under `timeout`, and the whole part within SUITE_BUDGET_S (default 570 s: the device tool stops a
# command at 600). Libraries the machine lacks come from carried .debs (scripts/gpu_env.sh; run
# tests/gpu/pack.sh here first). Data: SHARDLM_DATA, else build/gpu-data (tests/gpu/pack.sh), else
# ../shared/data; holds sotu/ and the tokenizer gpt2/. Logs go to a temporary directory; at the end (also
# on an early exit) they are packed into $OUT/gpu_suite_PART.tgz and the PASS / FAIL / SKIP lines and the
# final one copied to $OUT/gpu_suite_PART_summary.txt (when OUT is set; else the directory is kept).
# SHARDLM_GPU_SUITE_DRY=1 skips only the nvidia-smi check (a dry run of the scripting without a GPU).
# Ends "N passed, N failed".
set -u
cd "$(dirname "$0")/../.." || exit 1
part=${1:-all}
case $part in build | ops | train | all) ;; *) echo "usage: tests/gpu/suite.sh [build|ops|train|all]" >&2; exit 2 ;; esac
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export CUDA_HOME
B=${SHARDLM_GPU_BUILD:-build/gpu}
BIN=$B/shardlm
BUDGET=${SUITE_BUDGET_S:-570}
if [ -n "${SHARDLM_DATA:-}" ]; then DATA=$SHARDLM_DATA
elif [ -d build/gpu-data/sotu ]; then DATA=build/gpu-data
else DATA=../shared/data; fi
export SHARDLM_DATA=$DATA
logdir=$(mktemp -d /tmp/shardlm_gpu_suite_XXXXXX)
tmp=$(mktemp -d /tmp/shardlm_gpu_train_XXXXXX)
summary=$logdir/summary.txt
passed=0 failed=0
note() { echo "$*" | tee -a "$summary"; }
pass() { note "PASS $1"; passed=$((passed + 1)); }
fail() { note "FAIL $1"; shift; [ $# -gt 0 ] && echo "  $*"; failed=$((failed + 1)); }
finish() {
  note "$passed passed, $failed failed"
  if [ -n "${OUT:-}" ]; then
    tar -czf "$OUT/gpu_suite_$part.tgz" -C "$logdir" . && cp "$summary" "$OUT/gpu_suite_${part}_summary.txt"
    rm -rf "$logdir"
  else
    echo "logs: $logdir"
  fi
  rm -rf "$tmp"
  exit $((failed > 0))
}
trap finish EXIT
trap 'note "FAIL suite_interrupted"; failed=$((failed + 1)); exit 1' INT TERM
count() {  # adds a sub-suite's "N passed, N failed" line
  local line; line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -1)
  if [ -z "$line" ]; then fail "$2_summary" "no summary line in $1"; return; fi
  passed=$((passed + $(echo "$line" | cut -d' ' -f1))); failed=$((failed + $(echo "$line" | cut -d' ' -f3)))
}
# t LIMIT LOG COMMAND...: COMMAND under timeout (LIMIT s, or what the budget leaves less 15 s), output to
# LOG; its exit status (124 on a timeout, noted in the summary)
t() {
  local limit=$1 log=$2 rc; shift 2
  local room=$((BUDGET - SECONDS - 15))
  [ "$room" -lt "$limit" ] && limit=$room
  if [ "$limit" -lt 5 ]; then echo "not run: out of the suite's budget" >"$log"; note "TIMEOUT $(basename "$log"): out of the suite's budget (${BUDGET}s)"; return 124; fi
  timeout -k 10 "$limit" "$@" >"$log" 2>&1; rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then note "TIMEOUT $(basename "$log") after ${limit}s: $*"; rc=124; fi
  return $rc
}

echo "gpu suite: part $part, build $B, data $DATA, logs $logdir"
if [ "${SHARDLM_GPU_SUITE_DRY:-0}" = 1 ]; then
  echo "dry run (SHARDLM_GPU_SUITE_DRY=1): no nvidia-smi check"
elif nvidia-smi -L >"$logdir/gpus.txt" 2>&1; then
  cat "$logdir/gpus.txt"
else
  note "SKIP gpu suite: no GPU (nvidia-smi -L failed)"; exit 0
fi
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh
gpu_env_setup "$logdir/deps.log"; echo "$GPU_ENV_MSG" | tee -a "$logdir/deps.log"

# the build: every part (make is a no-op on an up-to-date build/gpu)
if ! t 300 "$logdir/build.log" make -j"$(nproc)" B="$B" CU_B="$B" "$BIN"; then
  fail build "$(tail -20 "$logdir/build.log")"; exit 1
fi
[ "$part" = build ] || [ "$part" = all ] && pass build
t 150 "$logdir/build_tests.txt" env SHARDLM_BUILD="$B" bash tests/gpu/run.sh build
if [ "$part" = build ] || [ "$part" = all ]; then
  grep -E '^(PASS|FAIL|SKIP)' "$logdir/build_tests.txt" | tee -a "$summary"
  count "$logdir/build_tests.txt" gpu_test_programs
  "$BIN" report >"$logdir/report.txt" 2>&1
  grep -Eq '^  ops cuda +built in' "$logdir/report.txt" && pass cuda_backend_built ||
    fail cuda_backend_built "$(cat "$logdir/report.txt")"
  grep -Eq '^  comm nccl +built in' "$logdir/report.txt" && pass nccl_backend_built ||
    fail nccl_backend_built "$(grep -E 'nccl|comm' "$logdir/report.txt")"
fi

# 1. ops and NCCL
if [ "$part" = ops ] || [ "$part" = all ]; then
  t 420 "$logdir/ops_and_nccl.txt" env SHARDLM_BUILD="$B" bash tests/gpu/run.sh
  grep -E '^(PASS|FAIL|SKIP)' "$logdir/ops_and_nccl.txt" | tee -a "$summary"
  count "$logdir/ops_and_nccl.txt" ops_and_nccl

  # 2. the model (test_model_cuda), and decoding with the KV cache on the GPU (test_generate_cuda)
  for what in model generate; do
    prog="$B/gpu_tests/test_${what}_cuda"
    if [ -x "$prog" ]; then
      t 120 "$logdir/$what.txt" "$prog" cuda:0
      grep -E '^(PASS|FAIL|SKIP)' "$logdir/$what.txt" | tee -a "$summary"
      count "$logdir/$what.txt" "$what"
    else
      fail "test_${what}_cuda_built" "$(grep -A20 "test_${what}_cuda" "$logdir/build_tests.txt" | head -20)"
    fi
  done
fi
[ "$part" = train ] || [ "$part" = all ] || exit 0

# data for the training checks
t 120 "$logdir/prepare.log" "$BIN" prepare --input "$DATA/sotu" --tokenizer "$DATA/gpt2" --output "$tmp/data" ||
  fail prepare "$(tail -5 "$logdir/prepare.log")"
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
t 240 "$logdir/train_cpu.log" env OMP_NUM_THREADS="$(nproc)" "$BIN" "${common[@]}" --steps 300 --device cpu --no-save \
  --save-dir "$tmp/cpu" --metrics "$tmp/cpu/metrics.jsonl" || fail train_cpu_runs "$(tail -3 "$logdir/train_cpu.log")"
# bf16: with bf16 activation storage (the default, cuda-bf16) and with fp32 storage (SHARDLM_BF16_STORAGE=0)
for p in fp32 bf16 bf16_fp32_storage; do
  t 120 "$logdir/train_gpu_$p.log" env SHARDLM_BF16_STORAGE="$([ $p = bf16_fp32_storage ] && echo 0 || echo 1)" \
    "$BIN" "${common[@]}" --steps 300 --device cuda --precision "${p%%_*}" --no-save \
    --save-dir "$tmp/gpu_$p" --metrics "$tmp/gpu_$p/metrics.jsonl" || fail "train_gpu_${p}_runs" "$(tail -3 "$logdir/train_gpu_$p.log")"
  losses "$tmp/gpu_$p" >"$tmp/gpu_$p.loss"
done
losses "$tmp/cpu" >"$tmp/cpu.loss"
paste "$tmp/cpu.loss" "$tmp/gpu_fp32.loss" "$tmp/gpu_bf16.loss" "$tmp/gpu_bf16_fp32_storage.loss" >"$logdir/loss_curves.tsv"
close gpu_fp32_300_steps_track_cpu_fp32 2e-2 "$tmp/gpu_fp32.loss" "$tmp/cpu.loss"
close gpu_bf16_300_steps_track_cpu_fp32 5e-2 "$tmp/gpu_bf16.loss" "$tmp/cpu.loss"
close gpu_bf16_fp32_storage_300_steps_track_cpu_fp32 5e-2 "$tmp/gpu_bf16_fp32_storage.loss" "$tmp/cpu.loss"

# 4. fp16 with an injected overflow at step 5
t 120 "$logdir/overflow.log" env SHARDLM_FAULT=0:5:overflow "$BIN" "${common[@]}" --steps 8 --device cuda --precision fp16 \
  --save-interval 1 --save-dir "$tmp/ov" || fail fp16_overflow_run "$(tail -3 "$logdir/overflow.log")"
[ "$(grep -c 'gradient overflow' "$logdir/overflow.log")" -eq 1 ] && grep -q '^step 5 | fp16 gradient overflow' "$logdir/overflow.log" &&
  pass gpu_fp16_overflow_skips_exactly_step_5 || fail gpu_fp16_overflow_skips_exactly_step_5 "$(grep overflow "$logdir/overflow.log")"
cmp -s "$tmp/ov/step_00000004/model.safetensors" "$tmp/ov/step_00000005/model.safetensors" &&
  cmp -s "$tmp/ov/step_00000004/optim_00000_of_00001.safetensors" "$tmp/ov/step_00000005/optim_00000_of_00001.safetensors" &&
  ! cmp -s "$tmp/ov/step_00000005/model.safetensors" "$tmp/ov/step_00000006/model.safetensors" &&
  pass gpu_skipped_step_changes_nothing || fail gpu_skipped_step_changes_nothing

# 5. resume on the GPU (bf16 activation storage)
t 120 "$logdir/resume_a.log" "$BIN" "${common[@]}" --steps 20 --device cuda --precision bf16 --save-interval 10 \
  --save-dir "$tmp/r1" || fail gpu_run_20 "$(tail -3 "$logdir/resume_a.log")"
mkdir -p "$tmp/r2" && cp -r "$tmp/r1/step_00000010" "$tmp/r2/" && echo step_00000010 >"$tmp/r2/latest"
t 120 "$logdir/resume_b.log" "$BIN" "${common[@]}" --steps 20 --device cuda --precision bf16 --resume auto \
  --save-dir "$tmp/r2" || fail gpu_resume_runs "$(tail -3 "$logdir/resume_b.log")"
cmp -s "$tmp/r1/step_00000020/model.safetensors" "$tmp/r2/step_00000020/model.safetensors" &&
  cmp -s "$tmp/r1/step_00000020/optim_00000_of_00001.safetensors" "$tmp/r2/step_00000020/optim_00000_of_00001.safetensors" &&
  pass gpu_resume_is_bit_identical || fail gpu_resume_is_bit_identical

# 5b. generate --device cuda (weights, KV cache and activations on the GPU) against --device cpu on
# that checkpoint: the same greedy text (fp32; a near-tie of two logits could part them, which
# test_generate_cuda counts separately)
gen=(generate --model "$tmp/r1" --prompt-ids 464,3290,318 --max-new-tokens 32 --temperature 0)
t 60 "$logdir/generate_cpu.txt" "$BIN" "${gen[@]}" --device cpu 2>"$logdir/generate_cpu.err" ||
  fail generate_cpu_runs "$(tail -3 "$logdir/generate_cpu.err")"
t 60 "$logdir/generate_gpu.txt" "$BIN" "${gen[@]}" --device cuda 2>"$logdir/generate_gpu.err" ||
  fail generate_gpu_runs "$(tail -3 "$logdir/generate_gpu.err")"
grep -q 'cuda ops' "$logdir/generate_gpu.err" && [ -s "$logdir/generate_gpu.txt" ] &&
  cmp -s "$logdir/generate_cpu.txt" "$logdir/generate_gpu.txt" && pass generate_device_cuda_greedy_equals_cpu ||
  fail generate_device_cuda_greedy_equals_cpu "cpu: $(head -c 300 "$logdir/generate_cpu.txt") | gpu: $(head -c 300 "$logdir/generate_gpu.txt") $(tail -2 "$logdir/generate_gpu.err")"

# 6. compute-sanitizer
CS=$(command -v compute-sanitizer 2>/dev/null || echo "$CUDA_HOME/bin/compute-sanitizer")
if [ -x "$CS" ]; then
  for tool in memcheck racecheck synccheck memcheck_bf16; do
    t 120 "$logdir/sanitizer_$tool.log" "$CS" --tool "${tool%_bf16}" --error-exitcode 99 "$BIN" "${common[@]}" --model gpt2-tiny \
      --seq-len 32 --batch-size 2 --steps 2 --device cuda --precision "$([ $tool = memcheck_bf16 ] && echo bf16 || echo fp32)" \
      --no-save; rc=$?
    # memcheck and synccheck end with "ERROR SUMMARY: 0 errors"; racecheck with
    # "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)".
    summary="ERROR SUMMARY: 0 errors"
    [ "$tool" = racecheck ] && summary="RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
    grep -qF "$summary" "$logdir/sanitizer_$tool.log" && [ $rc -eq 0 ] && pass "compute_sanitizer_${tool}_clean" ||
      fail "compute_sanitizer_${tool}_clean" "$(grep -E 'SUMMARY|Invalid|Race|error' "$logdir/sanitizer_$tool.log" | head -5)"
  done
else
  fail compute_sanitizer_available "$CS not found"
fi
# 7. NCCL at world size 1: DDP and ZeRO 1-3 against the plain single-GPU run, bit for bit
if "$BIN" report 2>/dev/null | grep -Eq '^  comm nccl +built in'; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  unset SHARDLM_RANK SHARDLM_WORLD_SIZE RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
  one_rank=()   # one process under mpirun; without it a singleton MPI start (scripts/gpu_env.sh)
  command -v mpirun >/dev/null 2>&1 && one_rank=(mpirun --allow-run-as-root -np 1)
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
  t 120 "$logdir/nccl1_plain.log" "$BIN" "${n20[@]}" --precision fp32 --save-dir "$tmp/n_plain" ||
    fail nccl1_plain_runs "$(tail -3 "$logdir/nccl1_plain.log")"
  for s in 0 1 2 3; do
    sample=0; [ $s -eq 3 ] && sample=16   # stage 3 gathers the weights on the GPU to sample after training
    t 120 "$logdir/nccl1_fp32_stage$s.log" ${one_rank[@]+"${one_rank[@]}"} "$BIN" "${n20[@]}" --precision fp32 --comm-backend nccl --zero-stage $s \
      --sample-tokens $sample --save-dir "$tmp/n_s$s" ||
      fail "nccl1_fp32_stage${s}_runs" "$(tail -3 "$logdir/nccl1_fp32_stage$s.log")"
    same_run "nccl_world1_fp32_stage${s}_bit_identical_to_one_gpu" "$tmp/n_s$s" "$tmp/n_plain"
  done
  grep -q '^sample (16 tokens' "$logdir/nccl1_fp32_stage3.log" && pass nccl_world1_stage3_samples_after_training ||
    fail nccl_world1_stage3_samples_after_training "$(tail -3 "$logdir/nccl1_fp32_stage3.log")"
  # bf16: fp32 master slices, gathered for the checkpoint (stage 1 through host memory, stage 3
  # through the windows, each converted to bf16 for the GEMMs); the reference is step 5's plain bf16
  # run with the same flags
  for s in 1 3; do
    t 120 "$logdir/nccl1_bf16_stage$s.log" ${one_rank[@]+"${one_rank[@]}"} "$BIN" "${n20[@]}" --precision bf16 --comm-backend nccl --zero-stage $s \
      --save-dir "$tmp/nb_s$s" || fail "nccl1_bf16_stage${s}_runs" "$(tail -3 "$logdir/nccl1_bf16_stage$s.log")"
    same_run "nccl_world1_bf16_stage${s}_bit_identical_to_one_gpu" "$tmp/nb_s$s" "$tmp/r1"
  done
  # resume a ZeRO-3 NCCL run from its step-10 checkpoint, with NCCL stage 3 and with a plain GPU run
  for how in nccl plain; do
    d="$tmp/nr_$how"; mkdir -p "$d" && cp -r "$tmp/nb_s3/step_00000010" "$d/" && echo step_00000010 >"$d/latest"
    if [ $how = nccl ]; then
      t 120 "$logdir/nccl1_resume_$how.log" ${one_rank[@]+"${one_rank[@]}"} "$BIN" "${n20[@]}" --precision bf16 --comm-backend nccl --zero-stage 3 \
        --resume auto --save-dir "$d"
    else
      t 120 "$logdir/nccl1_resume_$how.log" "$BIN" "${n20[@]}" --precision bf16 --resume auto --save-dir "$d"
    fi || fail "nccl1_resume_${how}_runs" "$(tail -3 "$logdir/nccl1_resume_$how.log")"
    cmp -s "$d/step_00000020/model.safetensors" "$tmp/nb_s3/step_00000020/model.safetensors" &&
      cmp -s "$d/step_00000020/optim_00000_of_00001.safetensors" "$tmp/nb_s3/step_00000020/optim_00000_of_00001.safetensors" &&
      pass "nccl_world1_stage3_checkpoint_resumes_${how}_bit_identical" ||
      fail "nccl_world1_stage3_checkpoint_resumes_${how}_bit_identical"
  done
else
  fail nccl_backend_built "shardlm report does not list the nccl comm backend as built in"
fi

