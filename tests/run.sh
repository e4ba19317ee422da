#!/usr/bin/env bash
# tests/run.sh BUILD_DIR...: runs every unit-test binary and every CLI test script against each
# build directory, counts PASS/FAIL lines, and ends with "N passed, N failed".
# A binary that crashes (or a sanitizer report) counts as one failure named after the binary.
set -u
cd "$(dirname "$0")/.."
passed=0; failed=0; failures=()
log_dir=build/test-logs; mkdir -p "$log_dir"
for build in "$@"; do
  tag=$(basename "$build")
  for bin in "$build"/tests/test_*; do
    [ -x "$bin" ] || continue
    name=$(basename "$bin")
    log="$log_dir/$tag-$name.log"
    SHARDLM_BIN="$build/shardlm" timeout 1800 "$bin" >"$log" 2>&1; rc=$?
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log")
    passed=$((passed + p)); failed=$((failed + f))
    grep '^FAIL ' "$log" | while read -r _ t; do echo "FAIL [$tag] $name: $t"; done
    if [ "$f" -gt 0 ]; then failures+=("$tag/$name"); sed -n '1,60p' "$log" | grep -v '^PASS ' >&2; fi
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
      failed=$((failed + 1)); failures+=("$tag/$name (exit $rc)")
      echo "FAIL [$tag] $name exited with status $rc; last lines of $log:"; tail -n 30 "$log"
    fi
    echo "[$tag] $name: $p passed, $f failed"
  done
  for script in tests/cli/test_*.sh; do
    [ -f "$script" ] || continue
    name=$(basename "$script" .sh)
    log="$log_dir/$tag-$name.log"
    SHARDLM_BIN="$build/shardlm" timeout 1800 bash "$script" >"$log" 2>&1; rc=$?
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log")
    passed=$((passed + p)); failed=$((failed + f))
    if [ "$f" -gt 0 ]; then failures+=("$tag/$name"); grep -v '^PASS ' "$log" | head -n 60; fi
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
      failed=$((failed + 1)); failures+=("$tag/$name (exit $rc)")
      echo "FAIL [$tag] $name exited with status $rc"; tail -n 30 "$log"
    fi
    echo "[$tag] $name: $p passed, $f failed"
  done
done
[ ${#failures[@]} -gt 0 ] && printf 'failed: %s\n' "${failures[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
