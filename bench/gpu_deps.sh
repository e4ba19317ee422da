#!/usr/bin/env bash
# bench/gpu_deps.sh [DIR]: downloads, with apt-get download from this machine's Debian archive, the
# .deb files of the libraries shardlm builds against (OpenBLAS with OpenMP, cJSON, PCRE2, utf8proc, Open MPI,
# oneDNN, and the shared libraries they load) into DIR (default build/gpu-deps, which git ignores). A GPU
# machine without a package registry gets them by carrying DIR with the call (the device tool's
# `carry: ["build/gpu-deps"]`, about 24 MB); bench/gpu.sh unpacks them only when that machine lacks
# the headers or libraries, and puts on the library path only the libraries it lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build/gpu-deps}
PKGS=(libopenblas0-openmp libopenblas-openmp-dev libgfortran5 libquadmath0
      libcjson1 libcjson-dev libpcre2-8-0 libpcre2-dev libutf8proc2 libutf8proc-dev
      libopenmpi3 libopenmpi-dev libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
      libdnnl2 libdnnl-dev ocl-icd-libopencl1)
mkdir -p "$DIR"
cd "$DIR"
apt-get download "${PKGS[@]}"
ls -la
du -sh .
