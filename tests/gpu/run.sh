#!/usr/bin/env bash
# tests/gpu/run.sh (`make test-gpu`): the GPU tests, against build/libshardlm.a (or
# $SHARDLM_BUILD/libshardlm.a). Not part of `make test`: they need a GPU.
#   1. tests/gpu/test_ops_cuda.c: every CUDA op against the CPU op (one GPU; SHARDLM_DEVICE picks the
#      device, default cuda:0), one process per op group under `timeout 120` (a CUDA error is sticky in
#      the backend: one failure would fail every later case of its process). Linked like the shardlm
#      binary: static CUDA runtime, cuBLASLt dlopen'ed. SKIP when the library has no CUDA backend (no
#      sl_ops_cuda) or no GPU is visible.
#   2. tests/gpu/test_comm_nccl.c: the NCCL comm backend against the MPI one, under mpirun with one
#      process per GPU: NP=2 by default (NCCL needs a GPU per process; with one GPU it runs NP=1,
#      which checks the calls but not the communication). SKIP when the library was built without
#      NCCL, no GPU is visible or mpirun is missing.
#   3. Data-parallel training on 2 GPUs through NCCL (SKIP with fewer than 2 GPUs, or without NCCL,
#      mpirun or $SHARDLM_BUILD/shardlm): gpt2-tiny, 8 steps, global batch 6. DDP and ZeRO stages 1-3
#      on 2 GPUs follow 2 MPI ranks on the CPU within 2e-3 relative per step (another backend: GEMMs,
#      attention and reductions sum in other orders; a real error, e.g. a gradient reduced before
#      backward wrote it, moves the loss by > 1e-2 within two steps) and one GPU within 2e-4 (the
#      CPU tests' tolerance for a different world size); a 2-GPU ZeRO-3 run resumed from its step-4
#      checkpoint reaches byte-identical step-8 weights.
# `run.sh build` only compiles the test programs (test_ops_cuda, test_model_cuda, test_generate_cuda,
# test_comm_nccl) into
# $SHARDLM_BUILD/gpu_tests/, which the runs reuse while newer than the library and their source.
# Output goes to stdout as it comes (tee). SHARDLM_GPU_SUITE_DRY=1 counts one GPU without nvidia-smi (a dry
# run of the scripting on a machine without one). Ends with one "N passed, N failed" over all; exits
# non-zero on any failure.
set -u
cd "$(dirname "$0")/../.." || exit 1
bdir=${SHARDLM_BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
lib="$bdir/libshardlm.a"
[ -f "$lib" ] || { echo "FAIL test_gpu: $lib is not built (run make first)"; echo "0 passed, 1 failed"; exit 1; }
ngpu=0
command -v nvidia-smi >/dev/null 2>&1 && ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
[ "${SHARDLM_GPU_SUITE_DRY:-0}" = 1 ] && [ "$ngpu" -eq 0 ] && ngpu=1

tmp=$(mktemp -d /tmp/shardlm_test_gpu_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh
gpu_env_setup "$tmp/deps.log" || echo "note: $GPU_ENV_MSG"
BLAS_DIR=${BLAS_DIR:-/usr/lib/x86_64-linux-gnu/openblas-openmp}
BLAS_INC=${BLAS_INC:-/usr/include/x86_64-linux-gnu/openblas-openmp}
base_flags="-std=c17 -Wall -Wextra -Werror -D_GNU_SOURCE -fopenmp -g -O2 -Iinclude -Isrc -I$BLAS_INC $MPI_CFLAGS"
base_libs="-L$BLAS_DIR -Wl,-rpath,$BLAS_DIR -lopenblas -ldnnl -lcjson -lpcre2-8 -lutf8proc $MPI_LIBS"
tdir="$bdir/gpu_tests"
passed=0; failed=0

# count FILE: adds FILE's PASS / FAIL lines to the totals
count() {
  passed=$((passed + $(grep -c '^PASS ' "$1"))); failed=$((failed + $(grep -c '^FAIL ' "$1")))
}
# build_prog NAME: tests/gpu/NAME.c -> $tdir/NAME (unless up to date); prints FAIL and returns 1 on an error
build_prog() {
  local prog="$tdir/$1" src="tests/gpu/$1.c" extra="-L$CUDA_HOME/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++"
  [ "$prog" -nt "$lib" ] && [ "$prog" -nt "$src" ] && return 0
  [ "$1" = test_comm_nccl ] && extra="-isystem $CUDA_HOME/include -L$CUDA_HOME/lib64 -Wl,-rpath,$CUDA_HOME/lib64 -lcudart"
  mkdir -p "$tdir"
  # shellcheck disable=SC2086
  if ! timeout 120 ${CC:-gcc} $base_flags "$src" "$lib" -o "$prog" $base_libs $extra -lm >"$tmp/cc_$1.log" 2>&1; then
    echo "FAIL $1_compiles"; tail -n 30 "$tmp/cc_$1.log"; failed=$((failed + 1)); rm -f "$prog"; return 1
  fi
}
has_cuda() { nm "$lib" 2>/dev/null | grep -Eq ' [DR] sl_ops_cuda$'; }
has_nccl() { nm "$lib" 2>/dev/null | grep -q ' T sl_comm_nccl_init_world$'; }
build_all() {
  if has_cuda; then
    build_prog test_ops_cuda && echo "PASS test_ops_cuda_compiles" && passed=$((passed + 1))
    build_prog test_model_cuda && echo "PASS test_model_cuda_compiles" && passed=$((passed + 1))
    build_prog test_generate_cuda && echo "PASS test_generate_cuda_compiles" && passed=$((passed + 1))
  else
    echo "SKIP test_ops_cuda, test_model_cuda, test_generate_cuda: $lib was built without the CUDA ops backend"
  fi
  if has_nccl; then
    build_prog test_comm_nccl && echo "PASS test_comm_nccl_compiles" && passed=$((passed + 1))
  else
    echo "SKIP test_comm_nccl: $lib was built without NCCL"
  fi
}

# ---- 1. CUDA ops against the CPU ops, one process per op group ------------------------------------
run_ops() {
  has_cuda || { echo "SKIP ops_cuda: $lib was built without the CUDA ops backend (no nvcc at build time, or CUDA=0)"; return; }
  [ "$ngpu" -gt 0 ] || { echo "SKIP ops_cuda: no CUDA GPU visible (nvidia-smi -L)"; return; }
  build_prog test_ops_cuda || return
  unset SHARDLM_RANK SHARDLM_WORLD_SIZE RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
  local dev=${SHARDLM_DEVICE:-cuda:0} g rc
  for g in $("$tdir/test_ops_cuda" "$dev" list); do
    echo "-- op group $g"
    timeout -k 10 120 "$tdir/test_ops_cuda" "$dev" "$g" 2>&1 | tee "$tmp/ops_$g.txt"; rc=${PIPESTATUS[0]}
    count "$tmp/ops_$g.txt"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      echo "FAIL ops_cuda_${g}_timed_out_after_120s"; failed=$((failed + 1))
    elif [ "$rc" -ne 0 ] && ! grep -q '^FAIL ' "$tmp/ops_$g.txt"; then
      echo "FAIL ops_cuda_${g}_exit_status_$rc"; failed=$((failed + 1))
    fi
  done
}

# ---- 2. NCCL against MPI --------------------------------------------------------------------------
run_nccl() {
  has_nccl || { echo "SKIP comm_nccl: $lib was built without NCCL (no $CUDA_HOME/include/nccl.h or libnccl at build time)"; return; }
  command -v mpirun >/dev/null 2>&1 || { echo "SKIP comm_nccl: no mpirun on this machine (Open MPI's runtime is not installed)"; return; }
  [ "$ngpu" -gt 0 ] || { echo "SKIP comm_nccl: no CUDA GPU visible (nvidia-smi -L)"; return; }
  local np=${NP:-2} rc
  [ "$np" -gt "$ngpu" ] && { echo "note: $ngpu GPU(s) visible: running with $ngpu process(es) instead of $np"; np=$ngpu; }
  build_prog test_comm_nccl || return
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  unset SHARDLM_RANK SHARDLM_WORLD_SIZE RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR
  timeout -k 10 300 mpirun --allow-run-as-root -np "$np" "$tdir/test_comm_nccl" 2>&1 | tee "$tmp/nccl.txt"; rc=${PIPESTATUS[0]}
  count "$tmp/nccl.txt"
  if [ "$rc" -ne 0 ] && ! grep -q '^FAIL ' "$tmp/nccl.txt"; then
    echo "FAIL np${np}_nccl_mpirun_exit_status_$rc"; failed=$((failed + 1))
  fi
}

# ---- 3. DDP / ZeRO on 2 GPUs against MPI on the CPU -------------------------------------------------
run_train_nccl() {
  local bin="$bdir/shardlm" data=${SHARDLM_DATA:-../shared/data}
  [ -z "${SHARDLM_DATA:-}" ] && [ -d build/gpu-data/sotu ] && data=build/gpu-data
  [ "$ngpu" -ge 2 ] || { echo "SKIP train_nccl_2gpu: $ngpu GPU(s) visible, 2 needed"; return; }
  [ -x "$bin" ] || { echo "SKIP train_nccl_2gpu: $bin is not built"; return; }
  "$bin" report 2>/dev/null | grep -Eq '^  comm nccl +built in' || { echo "SKIP train_nccl_2gpu: built without NCCL"; return; }
  command -v mpirun >/dev/null 2>&1 || { echo "SKIP train_nccl_2gpu: no mpirun on this machine"; return; }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  unset SHARDLM_RANK SHARDLM_WORLD_SIZE RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR
  local t="$tmp/train" log="$tmp/train/log"
  mkdir -p "$t/corpus" && cp "$data"/sotu/179*.txt "$t/corpus/"
  "$bin" prepare --input "$t/corpus" --output "$t/data" --train-tokenizer 512 >>"$log" 2>&1
  local common=(train --model gpt2-tiny --data "$t/data" --seq-len 32 --steps 8 --seed 3 --lr 1e-2 --no-shuffle
                --eval-interval 4 --eval-batches 2 --sample-tokens 0 --log-interval 4 --threads 1)
  ok() { echo "PASS $1"; passed=$((passed + 1)); }
  bad() { echo "FAIL $1"; shift; [ $# -gt 0 ] && echo "  $*"; tail -n 15 "$log"; failed=$((failed + 1)); }
  losses() { grep '"loss"' "$1/metrics.jsonl" 2>/dev/null | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/'; }
  close() {  # close NAME TOL DIR_A DIR_B: every step's loss within TOL relative
    losses "$3" >"$t/a"; losses "$4" >"$t/b"
    if [ -s "$t/a" ] && [ "$(wc -l <"$t/a")" -eq "$(wc -l <"$t/b")" ] &&
       paste "$t/a" "$t/b" | awk -v tol="$2" '{ d = $1 - $2; if (d < 0) d = -d; if (d > tol * $2) bad = 1 } END { exit bad }'; then
      ok "$1"
    else
      bad "$1" "$(paste "$t/a" "$t/b" | head -8 | tr '\n' ' ')"
    fi
  }
  timeout 600 mpirun --allow-run-as-root -np 2 "$bin" "${common[@]}" --batch-size 3 --device cpu --save-dir "$t/cpu2" \
    >>"$log" 2>&1 || bad train_mpi_cpu_2_ranks_runs
  timeout 600 "$bin" "${common[@]}" --batch-size 6 --device cuda --save-dir "$t/gpu1" >>"$log" 2>&1 || bad train_1gpu_runs
  for s in 0 1 2 3; do
    timeout 600 mpirun --allow-run-as-root -np 2 "$bin" "${common[@]}" --batch-size 3 --device cuda --comm-backend nccl \
      --zero-stage $s --save-interval 4 --save-dir "$t/nccl_s$s" >>"$log" 2>&1 || bad "train_nccl_2gpu_stage${s}_runs"
    close "nccl_2gpu_stage${s}_tracks_mpi_2_ranks_on_cpu" 2e-3 "$t/nccl_s$s" "$t/cpu2"
    close "nccl_2gpu_stage${s}_matches_1gpu" 2e-4 "$t/nccl_s$s" "$t/gpu1"
  done
  mkdir -p "$t/resume" && cp -r "$t/nccl_s3/step_00000004" "$t/resume/" && echo step_00000004 >"$t/resume/latest"
  timeout 600 mpirun --allow-run-as-root -np 2 "$bin" "${common[@]}" --batch-size 3 --device cuda --comm-backend nccl \
    --zero-stage 3 --resume auto --save-dir "$t/resume" >>"$log" 2>&1 || bad train_nccl_2gpu_stage3_resume_runs
  if cmp -s "$t/nccl_s3/step_00000008/model.safetensors" "$t/resume/step_00000008/model.safetensors" &&
     cmp -s "$t/nccl_s3/step_00000008/optim_00001_of_00002.safetensors" "$t/resume/step_00000008/optim_00001_of_00002.safetensors"; then
    ok nccl_2gpu_stage3_resume_is_bit_for_bit
  else
    bad nccl_2gpu_stage3_resume_is_bit_for_bit
  fi
}

if [ "${1:-}" = build ]; then
  build_all
else
  run_ops
  run_nccl
  run_train_nccl
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
