#!/usr/bin/env bash
# scripts/setup.sh: installs the Debian packages shardlm builds against (compiler, OpenBLAS with
# OpenMP threading, oneDNN, cJSON, PCRE2, utf8proc, Open MPI). Skips apt-get when everything is already present.
set -eu
pkgs="build-essential libopenblas-openmp-dev libcjson-dev libpcre2-dev libutf8proc-dev libopenmpi-dev openmpi-bin libdnnl-dev"
# clang with libFuzzer and its OpenMP runtime: the fuzz targets of `make test` (tests/fuzz)
pkgs="$pkgs clang libclang-rt-dev libomp-dev"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  [ "${1:-}" = "--quiet" ] || echo "setup: installing$missing"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi
