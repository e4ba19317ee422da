#!/usr/bin/env bash
# bench/build_bench.sh [BUILD_DIR]: builds BUILD_DIR/libshardlm.a through the Makefile (B=BUILD_DIR,
# CU_B=$CU_B or BUILD_DIR; MAKE_JOBS jobs) and links the benchmark programs against it with the
# Makefile's flags: BUILD_DIR/bench_train (bench/bench_train.c) and BUILD_DIR/bench_gemm
# (bench/bench_gemm.c). When the library holds CUDA objects (nvcc was found), the programs also link
# the static CUDA runtime, as the Makefile links build/shardlm. Used by bench/run.sh (build/) and
# bench/gpu.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
CU_B=${CU_B:-$B}
BLAS_DIR=${BLAS_DIR:-/usr/lib/x86_64-linux-gnu/openblas-openmp}
BLAS_INC=${BLAS_INC:-/usr/include/x86_64-linux-gnu/openblas-openmp}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
make --no-print-directory -j"${MAKE_JOBS:-2}" B="$B" CU_B="$CU_B" "$B/libshardlm.a" >/dev/null
# the library's comm module links Open MPI (as the Makefile does)
MPI_CFLAGS=${MPI_CFLAGS:-$(mpicc --showme:compile 2>/dev/null || true)}
MPI_LIBS=${MPI_LIBS:-$(mpicc --showme:link 2>/dev/null || true)}
CUDA_LIBS=""
if ar t "$B/libshardlm.a" | grep -q '\.cu\.o$'; then
    CUDA_LIBS="-L$CUDA_HOME/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++"
fi
for prog in bench_train bench_gemm bench_decode; do
    # shellcheck disable=SC2086
    ${CC:-gcc} -Iinclude -Isrc -I"$BLAS_INC" $MPI_CFLAGS -std=c17 -Wall -Wextra -Werror -D_GNU_SOURCE -O3 \
        -march=native -fno-fast-math -fno-math-errno -fopenmp "bench/$prog.c" "$B/libshardlm.a" -o "$B/$prog" \
        -L"$BLAS_DIR" -Wl,-rpath,"$BLAS_DIR" -lopenblas -ldnnl -lcjson -lpcre2-8 -lutf8proc $MPI_LIBS $CUDA_LIBS -lm
done
