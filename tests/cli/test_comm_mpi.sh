#!/usr/bin/env bash
# test_comm_mpi.sh: the MPI comm backend under mpirun. Compiles tests/mpi/test_comm_mpi.c and
# tests/mpi/test_comm_v_mpi.c (the variable-count collectives) against the library of the build
# that "$SHARDLM_BIN" belongs to (build/ or build/asan/, with the Makefile's flags; the sanitizer
# flags for build/asan), then runs each with -np 2, 3 and 4 (oversubscribed: the test machine may
# have fewer cores). Each program prints one PASS/FAIL line per check from rank 0. Prints "SKIP comm_mpi: ..." and exits 0 when mpirun or mpicc is missing; skips silently
# (exit 0) while "$SHARDLM_BIN" is not built.
set -u
BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$BIN" ] || exit 0
bdir=$(dirname "$BIN")
[ -f "$bdir/libshardlm.a" ] || exit 0
if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
  echo "SKIP comm_mpi: mpirun not found"; exit 0
fi
tmp=$(mktemp -d /tmp/shardlm_test_comm_mpi_XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# The Makefile's flags (keep in step with it).
BLAS_DIR=${BLAS_DIR:-/usr/lib/x86_64-linux-gnu/openblas-openmp}
BLAS_INC=${BLAS_INC:-/usr/include/x86_64-linux-gnu/openblas-openmp}
flags="-std=c17 -Wall -Wextra -Werror -D_GNU_SOURCE -fopenmp -g -Iinclude -Isrc -I$BLAS_INC $(mpicc --showme:compile)"
case "$bdir" in
  *asan*) flags="$flags -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" ;;
  *) flags="$flags -O2" ;;
esac
libs="-L$BLAS_DIR -Wl,-rpath,$BLAS_DIR -lopenblas -lcjson -lpcre2-8 -lutf8proc $(mpicc --showme:link) -lm"
progs="test_comm_mpi test_comm_v_mpi"
for prog in $progs; do
  # shellcheck disable=SC2086
  if ! ${CC:-gcc} $flags "tests/mpi/$prog.c" "$bdir/libshardlm.a" -o "$tmp/$prog" $libs >"$tmp/cc.log" 2>&1; then
    echo "FAIL ${prog#test_}_compiles"; cat "$tmp/cc.log"; exit 1
  fi
done

# Open MPI in a container: allow root, oversubscribe the cores, yield instead of spinning when
# idle (2 cores, 4 ranks), no CMA single-copy (ptrace is often forbidden), shared memory + self only.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader
# Open MPI keeps allocations alive until exit that LeakSanitizer reports as leaks; the library's
# own leaks are covered by the non-MPI unit tests, which run with leak detection on.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
# The launcher variables of an outer job must not leak into ours.
unset SHARDLM_RANK SHARDLM_WORLD_SIZE RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR

status=0
for prog in $progs; do
  for np in 2 3 4; do
    out="$tmp/$prog.out$np.txt" err="$tmp/$prog.err$np.txt"
    timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "$tmp/$prog" >"$out" 2>"$err"; rc=$?
    cat "$out"
    if [ $rc -ne 0 ]; then
      status=1
      grep -q '^FAIL ' "$out" || echo "FAIL np${np}_${prog#test_}_mpirun_exit_status_$rc"
      tail -n 40 "$err"
    fi
  done
done
exit $status
