#!/usr/bin/env bash
# tests/gpu/run.sh (`make test-gpu`): the GPU tests, against build/libshardlm.a (or
# $SHARDLM_BUILD/libshardlm.a). Not part of `make test`: they need a GPU.
#   1. tests/gpu/test_ops_cuda.c: every CUDA op against the CPU op (one process, one GPU; SHARDLM_DEVICE
#      picks the device, default cuda:0). Linked like the shardlm binary: static CUDA runtime,
#      cuBLASLt dlopen'ed. SKIP when the library has no CUDA backend (no sl_ops_cuda) or no GPU is visible.
#   2. tests/gpu/test_comm_nccl.c: the NCCL comm backend against the MPI one, under mpirun with one
#      process per GPU: NP=2 by default (NCCL needs a GPU per process; with one GPU it runs NP=1,
#      which checks the calls but not the communication). SKIP when the library was built without
#      NCCL or no GPU is visible.
# Ends with one "N passed, N failed" over both; exits non-zero on any failure.
set -u
cd "$(dirname "$0")/../.." || exit 1
bdir=${SHARDLM_BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
lib="$bdir/libshardlm.a"
[ -f "$lib" ] || { echo "FAIL test_gpu: $lib is not built (run make first)"; echo "0 passed, 1 failed"; exit 1; }
ngpu=0
command -v nvidia-smi >/dev/null 2>&1 && ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')

tmp=$(mktemp -d /tmp/shardlm_test_gpu_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
BLAS_DIR=${BLAS_DIR:-/usr/lib/x86_64-linux-gnu/openblas-openmp}
BLAS_INC=${BLAS_INC:-/usr/include/x86_64-linux-gnu/openblas-openmp}
base_flags="-std=c17 -Wall -Wextra -Werror -D_GNU_SOURCE -fopenmp -g -O2 -Iinclude -Isrc -I$BLAS_INC $(mpicc --showme:compile 2>/dev/null)"
base_libs="-L$BLAS_DIR -Wl,-rpath,$BLAS_DIR -lopenblas -lcjson -lpcre2-8 $(mpicc --showme:link 2>/dev/null)"
passed=0; failed=0

# count FILE: adds FILE's PASS / FAIL lines to the totals
count() {
  passed=$((passed + $(grep -c '^PASS ' "$1"))); failed=$((failed + $(grep -c '^FAIL ' "$1")))
}

# ---- 1. CUDA ops against the CPU ops --------------------------------------------------------------
run_ops() {
  if ! nm "$lib" 2>/dev/null | grep -Eq ' [DR] sl_ops_cuda$'; then
    echo "SKIP ops_cuda: $lib was built without the CUDA ops backend (no nvcc at build time, or CUDA=0)"; return
  fi
  [ "$ngpu" -gt 0 ] || { echo "SKIP ops_cuda: no CUDA GPU visible (nvidia-smi -L)"; return; }
  # shellcheck disable=SC2086
  if ! ${CC:-gcc} $base_flags tests/gpu/test_ops_cuda.c "$lib" -o "$tmp/test_ops_cuda" $base_libs \
       -L"$CUDA_HOME/lib64" -lcudart_static -ldl -lrt -lpthread -lstdc++ -lm >"$tmp/cc_ops.log" 2>&1; then
    echo "FAIL ops_cuda_compiles"; cat "$tmp/cc_ops.log"; failed=$((failed + 1)); return
  fi
  unset SHARDLM_RANK SHARDLM_WORLD_SIZE RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
  timeout 1200 "$tmp/test_ops_cuda" "${SHARDLM_DEVICE:-cuda:0}" >"$tmp/ops.txt" 2>"$tmp/ops_err.txt"; local rc=$?
  grep -v '^[0-9]* passed, [0-9]* failed$' "$tmp/ops.txt"
  count "$tmp/ops.txt"
  if [ $rc -ne 0 ] && ! grep -q '^FAIL ' "$tmp/ops.txt"; then
    echo "FAIL ops_cuda_exit_status_$rc"; failed=$((failed + 1))
  fi
  [ $rc -ne 0 ] && tail -n 40 "$tmp/ops_err.txt"
}

# ---- 2. NCCL against MPI --------------------------------------------------------------------------
run_nccl() {
  if ! nm "$lib" 2>/dev/null | grep -q ' T sl_comm_nccl_init_world$'; then
    echo "SKIP comm_nccl: $lib was built without NCCL (no $CUDA_HOME/include/nccl.h or libnccl at build time)"; return
  fi
  command -v mpirun >/dev/null 2>&1 || { echo "FAIL comm_nccl: mpirun not found"; failed=$((failed + 1)); return; }
  [ "$ngpu" -gt 0 ] || { echo "SKIP comm_nccl: no CUDA GPU visible (nvidia-smi -L)"; return; }
  local np=${NP:-2}
  [ "$np" -gt "$ngpu" ] && { echo "note: $ngpu GPU(s) visible: running with $ngpu process(es) instead of $np"; np=$ngpu; }
  # shellcheck disable=SC2086
  if ! ${CC:-gcc} $base_flags -isystem "$CUDA_HOME/include" tests/gpu/test_comm_nccl.c "$lib" -o "$tmp/test_comm_nccl" \
       $base_libs -L"$CUDA_HOME/lib64" -Wl,-rpath,"$CUDA_HOME/lib64" -lcudart -lm >"$tmp/cc_nccl.log" 2>&1; then
    echo "FAIL comm_nccl_compiles"; cat "$tmp/cc_nccl.log"; failed=$((failed + 1)); return
  fi
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  unset SHARDLM_RANK SHARDLM_WORLD_SIZE RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR
  timeout 600 mpirun --allow-run-as-root -np "$np" "$tmp/test_comm_nccl" >"$tmp/nccl.txt" 2>"$tmp/nccl_err.txt"; local rc=$?
  cat "$tmp/nccl.txt"
  count "$tmp/nccl.txt"
  if [ $rc -ne 0 ]; then
    grep -q '^FAIL ' "$tmp/nccl.txt" || { echo "FAIL np${np}_nccl_mpirun_exit_status_$rc"; failed=$((failed + 1)); }
    tail -n 60 "$tmp/nccl_err.txt"
  fi
}

run_ops
run_nccl
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
