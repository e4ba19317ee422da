#!/usr/bin/env bash
# test_cpu_isa.sh: a binary compiled for instruction sets the CPU lacks says so instead of dying.
#   * cpu_features.c compiled with -mavx512fp16 (when this CPU has no AVX512-FP16) names avx512_fp16 as
#     missing; compiled for the baseline (-march=x86-64) it names nothing;
#   * `shardlm report` prints the CPU's instruction sets and the GEMM library in use;
#   * a malformed SHARDLM_GEMM stops `shardlm train` naming the variable.
# Prints PASS/FAIL lines for tests/run.sh.
set -u
BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$BIN" ] || exit 0
tmp=$(mktemp -d /tmp/shardlm_test_cpu_isa_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; [ $# -gt 0 ] && echo "  $*"; }
cat >"$tmp/main.c" <<'C'
#include "shardlm/cpu_features.h"
#include <stdio.h>
int main(void) { printf("[%s]\n", sl_cpu_missing_build_isa()); return 0; }
C
build() { ${CC:-gcc} -std=c17 -O1 -Iinclude "$@" src/ops/cpu/cpu_features.c "$tmp/main.c" -o "$tmp/isa" -lpthread; }
if build -march=x86-64 && [ "$("$tmp/isa")" = "[]" ]; then pass baseline_build_misses_nothing
else fail baseline_build_misses_nothing "$("$tmp/isa" 2>&1)"; fi
if grep -qw avx512_fp16 /proc/cpuinfo 2>/dev/null; then
  echo "PASS avx512fp16_build_names_what_is_missing (skipped: this CPU has AVX512-FP16)"
elif build -mavx512fp16 -mavx512f && out=$("$tmp/isa") && [[ "$out" == *avx512_fp16* ]]; then
  pass avx512fp16_build_names_what_is_missing
else
  fail avx512fp16_build_names_what_is_missing "${out:-build failed}"
fi
"$BIN" report >"$tmp/report.txt" 2>&1
grep -Eq '^  CPU +.*(avx|none)' "$tmp/report.txt" && pass report_shows_cpu_isa || fail report_shows_cpu_isa
grep -Eq '^  CPU GEMM \(fp32\) +(OpenBLAS|oneDNN)' "$tmp/report.txt" && pass report_shows_gemm_library ||
  fail report_shows_gemm_library "$(grep GEMM "$tmp/report.txt")"
SHARDLM_GEMM=mkl "$BIN" train --steps 1 >"$tmp/bad.txt" 2>&1
[ $? -ne 0 ] && grep -q 'SHARDLM_GEMM="mkl": expected auto, openblas or onednn' "$tmp/bad.txt" &&
  pass bad_gemm_setting_refused || fail bad_gemm_setting_refused "$(cat "$tmp/bad.txt")"
