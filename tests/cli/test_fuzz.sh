#!/usr/bin/env bash
# test_fuzz.sh: runs every libFuzzer target of tests/fuzz (built by `make fuzz` into build/fuzz/bin,
# with ASan/UBSan) for a bounded time from its committed seed corpus (tests/fuzz/corpus/NAME). A crash,
# sanitizer report, leak or timeout fails the target and keeps the input under build/fuzz/artifacts.
# It runs in the sanitizer pass of tests/run.sh only (the plain pass prints nothing), once per
# `make test`. SHARDLM_FUZZ_SECONDS sets the time per target (default 20).
set -u
cd "$(dirname "$0")/../.."
case "${SHARDLM_BIN:-}" in *asan*) ;; *) exit 0 ;; esac
secs=${SHARDLM_FUZZ_SECONDS:-20}
art=build/fuzz/artifacts
mkdir -p "$art"
bins=(build/fuzz/bin/fuzz_*)
if [ ! -x "${bins[0]}" ]; then echo "FAIL fuzz_targets_built (run make fuzz)"; exit 0; fi
for bin in "${bins[@]}"; do
  name=$(basename "$bin")
  seeds=tests/fuzz/corpus/$name
  work=$(mktemp -d /tmp/shardlm_fuzzwork_XXXXXX)  # the new corpus, and the targets' files (TMPDIR)
  mkdir -p "$work/corpus"
  log=build/fuzz/$name.log
  # -close_fd_mask=1: the targets' stdout is noise; stderr keeps the sanitizer reports
  TMPDIR=$work timeout $((secs + 60)) "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
    -close_fd_mask=1 -artifact_prefix="$art/$name-" "$work/corpus" "$seeds" >"$log" 2>&1
  rc=$?
  runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1)
  if [ $rc -eq 0 ]; then
    echo "PASS $name ($runs in ${secs}s)"
  else
    echo "FAIL $name (exit $rc; input kept in $art; log $log)"
    grep -E 'ERROR|runtime error|SUMMARY|Test unit written' "$log" | head -5
  fi
  rm -rf "$work"
done
