#!/usr/bin/env bash
# test_cuda_build.sh: the CUDA ops backend is built and wired up, checked without a GPU (CI). When
# $CUDA_HOME/bin/nvcc exists (and CUDA=0 was not given to make), for the build directory holding
# "$SHARDLM_BIN":
#   - libshardlm.a defines sl_ops_cuda and every cuda_* function cuda_ops.h declares (the C-linkage
#     ones; the templated ops of cuda_ops.cuh are checked through the tables below), and refers to no
#     cuBLASLt symbol (libcublasLt is dlopen'ed); the shardlm binary needs neither libcudart.so nor
#     libcublasLt.so (static CUDA runtime);
#   - a small program linked like the binary finds every entry of sl_ops_cuda and sl_ops_cuda_bf16
#     filled (names "cuda" / "cuda-bf16", on_device 1, act_bf16 0 / 1, the bf16 table with its own
#     ops and the same memory functions), sl_ops_for_precision picks cuda-bf16 only for bf16 on cuda
#     when not switched off (SHARDLM_BF16_STORAGE=0) and a CPU bf16-storage table for bf16 on cpu, and
#     sl_ops_for_device gives the CPU table for "cpu", names the value and the
#     choices for a bad one, rejects "cuda:x", and (on a machine without a GPU) fails "cuda" with
#     "no usable CUDA GPU";
#   - tests/gpu/test_ops_cuda.c, test_model_cuda.c and test_generate_cuda.c compile and link against the library (they run
#     only on a GPU);
#   - `shardlm report` says the ops cuda backend is built in;
#   - (main build only) tests/gpu/session.sh, the one-call GPU session, runs through every stage in
#     its dry mode (SHARDLM_GPU_SUITE_DRY=1: no GPU; the benchmark's CPU dry run) and leaves its
#     summary, logs and the benchmark's files in $OUT.
# Without nvcc it prints SKIP lines. Prints PASS/FAIL lines for tests/run.sh. Skips silently (exit 0)
# while "$SHARDLM_BIN" is not an executable.
set -u
cd "$(dirname "$0")/../.." || exit 1
BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$BIN" ] || exit 0
bdir=$(dirname "$BIN")
lib="$bdir/libshardlm.a"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
  echo "SKIP cuda_build: no $CUDA_HOME/bin/nvcc (the CUDA backend is not built on this machine)"; exit 0
fi
if [ "${CUDA:-}" = 0 ]; then echo "SKIP cuda_build: built with CUDA=0"; exit 0; fi
tmp=$(mktemp -d /tmp/shardlm_test_cuda_build_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failures=0
check() {  # check NAME COMMAND...: PASS if the command succeeds
  local name=$1; shift
  if "$@" >>"$tmp/log" 2>&1; then echo "PASS $name"; else echo "FAIL $name"; failures=$((failures + 1)); tail -n 20 "$tmp/log"; fi
}

# 1. The library's symbols.
nm "$lib" >"$tmp/nm.txt" 2>/dev/null
check cuda_lib_has_table grep -Eq ' [DR] sl_ops_cuda$' "$tmp/nm.txt"
grep -oE 'cuda_[a-z0-9_]+\(' src/ops/cuda/cuda_ops.h | tr -d '(' | sort -u >"$tmp/declared.txt"
missing=$(while read -r f; do grep -Eq " T $f\$" "$tmp/nm.txt" || echo "$f"; done <"$tmp/declared.txt")
[ -n "$missing" ] && echo "not defined in $lib: $(tr "\n" " " <<<"$missing")" >>"$tmp/log"
check cuda_lib_defines_every_cuda_op test -z "$missing" -a -s "$tmp/declared.txt"
check cuda_lib_no_cublaslt_link sh -c "! grep -E ' U cublasLt' '$tmp/nm.txt'"
readelf -d "$BIN" >"$tmp/needed.txt" 2>&1
check cuda_binary_static_runtime sh -c "! grep -Ei 'NEEDED.*(libcudart|libcublas)' '$tmp/needed.txt'"

# 2. A program linked like the binary: the table and sl_ops_for_device.
cat >"$tmp/table.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "shardlm/error.h"
#include "shardlm/ops.h"
#include "shardlm/settings.h"
extern const sl_ops sl_ops_cuda;
// the table's functions besides the ops of ops_list.h (checked through SL_OPS)
#define FNS(X) X(set_precision) X(alloc) X(dealloc) X(memzero) X(upload) X(download) X(copy) \
  X(synchronize) X(stream) X(peak_bytes) X(reset_peak_bytes) X(sumsq) X(scale) X(add) X(nonfinite) X(round_to) \
  X(to_storage) X(adam_step) X(sgd_step)
extern const sl_ops sl_ops_cuda_bf16;
int main(int argc, char **argv) {
    int bad = 0;
#define CHECK(f) if (!sl_ops_cuda.f || !sl_ops_cuda_bf16.f) { printf("NULL entry: %s\n", #f); bad = 1; }
    FNS(CHECK)
#define CHECK_OP(ret, name, params, args, storage, flops, emulation) CHECK(name)
    SL_OPS(CHECK_OP)
    if (strcmp(sl_ops_cuda.name, "cuda") || sl_ops_cuda.on_device != 1 || sl_ops_cuda.act_bf16 != 0) {
        printf("bad name/on_device/act_bf16 of cuda\n"); bad = 1;
    }
    if (strcmp(sl_ops_cuda_bf16.name, "cuda-bf16") || sl_ops_cuda_bf16.on_device != 1 || sl_ops_cuda_bf16.act_bf16 != 1) {
        printf("bad name/on_device/act_bf16 of cuda-bf16\n"); bad = 1;
    }
    // the bf16 twin: its own storage-typed ops, the same memory functions and optimizer passes
    if (sl_ops_cuda_bf16.matmul_forward == sl_ops_cuda.matmul_forward ||
        sl_ops_cuda_bf16.attention_forward == sl_ops_cuda.attention_forward ||
        sl_ops_cuda_bf16.alloc != sl_ops_cuda.alloc || sl_ops_cuda_bf16.adam_step != sl_ops_cuda.adam_step) {
        printf("cuda-bf16 does not have its own storage-typed ops / shared memory functions\n"); bad = 1;
    }
    // which table a run trains with (precision: 0 fp32, 1 bf16, 2 fp16 as sl_precision)
    unsetenv("SHARDLM_BF16_STORAGE");
    sl_settings_load();  // the environment is read once; again after changing it
    if (sl_ops_for_precision(&sl_ops_cuda, 1) != &sl_ops_cuda_bf16 || sl_ops_for_precision(&sl_ops_cuda, 0) != &sl_ops_cuda ||
        sl_ops_for_precision(&sl_ops_cuda, 2) != &sl_ops_cuda || sl_ops_for_precision(&sl_ops_cpu, 1)->on_device ||
        !sl_ops_for_precision(&sl_ops_cpu, 1)->act_bf16) {  // cpu: cpu-bf16-onednn or the emulation
        printf("sl_ops_for_precision picks the wrong table\n"); bad = 1;
    }
    setenv("SHARDLM_BF16_STORAGE", "0", 1);
    sl_settings_load();
    if (sl_ops_for_precision(&sl_ops_cuda, 1) != &sl_ops_cuda) { printf("SHARDLM_BF16_STORAGE=0 ignored\n"); bad = 1; }
    unsetenv("SHARDLM_BF16_STORAGE");
    sl_settings_load();  // the environment is read once; again after changing it
    if (!sl_ops_cuda_built()) { printf("sl_ops_cuda_built() is 0\n"); bad = 1; }
    if (sl_ops_for_device("cpu", 0) != &sl_ops_cpu) { printf("cpu: %s\n", sl_error()); bad = 1; }
    if (sl_ops_for_device("tpu", 0) || !strstr(sl_error(), "'tpu'") || !strstr(sl_error(), "cuda:N")) {
        printf("tpu: %s\n", sl_error()); bad = 1;
    }
    if (sl_ops_for_device("cuda:x", 0) || !strstr(sl_error(), "cuda:x")) { printf("cuda:x: %s\n", sl_error()); bad = 1; }
    if (argc > 1 && !strcmp(argv[1], "nogpu")) {
        if (sl_ops_for_device("cuda", 3) || !strstr(sl_error(), "no usable CUDA GPU")) {
            printf("cuda without a GPU: '%s'\n", sl_error()); bad = 1;
        } else printf("message: %s\n", sl_error());
    }
    return bad;
}
EOF
BLAS_DIR=${BLAS_DIR:-/usr/lib/x86_64-linux-gnu/openblas-openmp}
BLAS_INC=${BLAS_INC:-/usr/include/x86_64-linux-gnu/openblas-openmp}
# MPI_CFLAGS / MPI_LIBS: the Makefile's variables (scripts/gpu_env.sh sets them on a GPU machine)
MPI_CFLAGS=${MPI_CFLAGS-$(mpicc --showme:compile 2>/dev/null)}
MPI_LIBS=${MPI_LIBS-$(mpicc --showme:link 2>/dev/null)}
flags="-std=c17 -Wall -Wextra -Werror -D_GNU_SOURCE -fopenmp -g -O1 -Iinclude -Isrc -I$BLAS_INC $MPI_CFLAGS"
grep -q ' U __asan_' "$tmp/nm.txt" && flags="$flags -fsanitize=address,undefined"  # the ASan build's library
libs="-L$BLAS_DIR -Wl,-rpath,$BLAS_DIR -lopenblas -ldnnl -lcjson -lpcre2-8 -lutf8proc $MPI_LIBS -L$CUDA_HOME/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++ -lm"
# shellcheck disable=SC2086
check cuda_table_program_links ${CC:-gcc} $flags "$tmp/table.c" "$lib" -o "$tmp/table" $libs
gpu_arg=nogpu
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && gpu_arg=gpu
check cuda_table_filled_and_device_names "$tmp/table" $gpu_arg

# 3. The GPU test program compiles and links (tests/gpu/run.sh runs it on a GPU).
# shellcheck disable=SC2086
check cuda_gpu_test_links ${CC:-gcc} $flags tests/gpu/test_ops_cuda.c "$lib" -o "$tmp/test_ops_cuda" $libs
# shellcheck disable=SC2086
check cuda_gpu_model_test_links ${CC:-gcc} $flags tests/gpu/test_model_cuda.c "$lib" -o "$tmp/test_model_cuda" $libs
# shellcheck disable=SC2086
check cuda_gpu_generate_test_links ${CC:-gcc} $flags tests/gpu/test_generate_cuda.c "$lib" -o "$tmp/test_generate_cuda" $libs

# 4. The report.
"$BIN" report >"$tmp/report.txt" 2>&1
check cuda_report_built_in grep -Eq '^  ops cuda +built in \(' "$tmp/report.txt"
check cuda_report_cublaslt_row grep -Eq '^  cuBLASLt +([0-9]+\.[0-9]+\.[0-9]+ |not available: )' "$tmp/report.txt"

# 5. The GPU session script, dry (the main build only: its build step runs make on $bdir).
session_dry() {
  mkdir -p "$tmp/out"
  SHARDLM_GPU_SUITE_DRY=1 SHARDLM_GPU_BUILD="$bdir" SESSION_TORCH=0 SESSION_BUDGET_S=300 OUT="$tmp/out" \
    bash tests/gpu/session.sh
  local f s="$tmp/out/session_summary.txt"
  for f in session_summary.txt session_logs.tgz decode.jsonl gpu_results.jsonl gpu_section.md gpu_bench.log RESULTS.md; do
    [ -s "$tmp/out/$f" ] || { echo "session.sh left no $f in \$OUT"; return 1; }
  done
  for f in '^PASS build$' '^-- op group norm: ' '^-- test_model_cuda: ' '^PASS lora_cli_train_bf16$' '^-- bench/gpu.sh ' \
           '^gpu.sh .* finished in ' '^-- bench_decode ' '^-- op group attention: ' '^[0-9]+ passed, [0-9]+ failed '; do
    grep -Eq "$f" "$s" || { echo "session summary lacks /$f/:"; cat "$s"; return 1; }
  done
}
if [ "$bdir" = build ]; then
  check cuda_session_script_dry_run session_dry
else
  echo "SKIP cuda_session_script_dry_run: $bdir is not the main build"
fi

[ $failures -eq 0 ]
