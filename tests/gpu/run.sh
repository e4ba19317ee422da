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
#   3. Data-parallel training on 2 GPUs through NCCL (SKIP with fewer than 2 GPUs, or without NCCL,
#      mpirun or $SHARDLM_BUILD/shardlm): gpt2-tiny, 8 steps, global batch 6. DDP and ZeRO stages 1-3
#      on 2 GPUs follow 2 MPI ranks on the CPU within 2e-3 relative per step (another backend: GEMMs,
#      attention and reductions sum in other orders; a real error, e.g. a gradient reduced before
#      backward wrote it, moves the loss by > 1e-2 within two steps) and one GPU within 2e-4 (the
#      CPU tests' tolerance for a different world size); a 2-GPU ZeRO-3 run resumed from its step-4
#      checkpoint reaches byte-identical step-8 weights.
# Ends with one "N passed, N failed" over all; exits non-zero on any failure.
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

# ---- 3. DDP / ZeRO on 2 GPUs against MPI on the CPU -------------------------------------------------
run_train_nccl() {
  local bin="$bdir/shardlm" data=${SHARDLM_DATA:-../shared/data}
  [ "$ngpu" -ge 2 ] || { echo "SKIP train_nccl_2gpu: $ngpu GPU(s) visible, 2 needed"; return; }
  [ -x "$bin" ] || { echo "SKIP train_nccl_2gpu: $bin is not built"; return; }
  "$bin" report 2>/dev/null | grep -Eq '^  comm nccl +built in' || { echo "SKIP train_nccl_2gpu: built without NCCL"; return; }
  command -v mpirun >/dev/null 2>&1 || { echo "FAIL train_nccl_2gpu: mpirun not found"; failed=$((failed + 1)); return; }
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

run_ops
run_nccl
run_train_nccl
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
