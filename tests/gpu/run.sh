#!/usr/bin/env bash
# tests/gpu/run.sh (`make test-gpu`): the NCCL comm backend against the MPI one on GPUs. Compiles
# tests/gpu/test_comm_nccl.c against build/libshardlm.a (or $SHARDLM_BUILD/libshardlm.a) and CUDA's
# runtime, then runs it under mpirun with one process per GPU: NP=2 by default (NCCL needs a GPU per
# process; with one GPU it runs NP=1, which checks the calls but not the communication). Ends with
# "N passed, N failed". Prints SKIP and exits 0 when the library was built without NCCL, or when no
# GPU is visible. Not part of `make test`.
set -u
cd "$(dirname "$0")/../.."
bdir=${SHARDLM_BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
lib="$bdir/libshardlm.a"
[ -f "$lib" ] || { echo "FAIL test_gpu: $lib is not built (run make first)"; exit 1; }
if ! nm "$lib" 2>/dev/null | grep -q ' T sl_comm_nccl_init_world$'; then
  echo "SKIP test_gpu: $lib was built without NCCL (no $CUDA_HOME/include/nccl.h or libnccl at build time)"; exit 0
fi
command -v mpirun >/dev/null 2>&1 || { echo "FAIL test_gpu: mpirun not found"; exit 1; }
ngpu=0
command -v nvidia-smi >/dev/null 2>&1 && ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
[ "$ngpu" -gt 0 ] || { echo "SKIP test_gpu: no CUDA GPU visible (nvidia-smi -L)"; exit 0; }
np=${NP:-2}
[ "$np" -gt "$ngpu" ] && { echo "note: $ngpu GPU(s) visible: running with $ngpu process(es) instead of $np"; np=$ngpu; }

tmp=$(mktemp -d /tmp/shardlm_test_gpu_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
BLAS_DIR=${BLAS_DIR:-/usr/lib/x86_64-linux-gnu/openblas-openmp}
BLAS_INC=${BLAS_INC:-/usr/include/x86_64-linux-gnu/openblas-openmp}
flags="-std=c17 -Wall -Wextra -Werror -D_GNU_SOURCE -fopenmp -g -O2 -Iinclude -Isrc -I$BLAS_INC -isystem $CUDA_HOME/include $(mpicc --showme:compile)"
libs="-L$BLAS_DIR -Wl,-rpath,$BLAS_DIR -lopenblas -lcjson -lpcre2-8 $(mpicc --showme:link) -L$CUDA_HOME/lib64 -Wl,-rpath,$CUDA_HOME/lib64 -lcudart -lm"
# shellcheck disable=SC2086
if ! ${CC:-gcc} $flags tests/gpu/test_comm_nccl.c "$lib" -o "$tmp/test_comm_nccl" $libs >"$tmp/cc.log" 2>&1; then
  echo "FAIL comm_nccl_compiles"; cat "$tmp/cc.log"; echo "0 passed, 1 failed"; exit 1
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
unset SHARDLM_RANK SHARDLM_WORLD_SIZE RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR
timeout 600 mpirun --allow-run-as-root -np "$np" "$tmp/test_comm_nccl" >"$tmp/out.txt" 2>"$tmp/err.txt"; rc=$?
cat "$tmp/out.txt"
passed=$(grep -c '^PASS ' "$tmp/out.txt"); failed=$(grep -c '^FAIL ' "$tmp/out.txt")
if [ $rc -ne 0 ]; then
  [ "$failed" -eq 0 ] && { echo "FAIL np${np}_nccl_mpirun_exit_status_$rc"; failed=1; }
  tail -n 60 "$tmp/err.txt"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
