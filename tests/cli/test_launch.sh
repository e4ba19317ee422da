#!/usr/bin/env bash
# test_launch.sh: `shardlm launch` with small shell-script workers, on the fork and mpirun backends:
#   * ranks 0..N-1 with the right environment (torchrun names + SHARDLM_* for fork; OMPI_* for mpirun);
#   * per-rank logs in --log-dir, --tee prefixes "[rank N] ";
#   * a worker exiting 3 stops the others within seconds, launch exits 3 naming rank, host and log;
#     a worker killed by SIGKILL gives 137; a missing program gives 127;
#   * --max-restarts relaunches the group (SHARDLM_RESTART_COUNT), and gives up after N restarts;
#   * SIGINT to launch reaches every worker;
#   * --dry-run plans for hostfile / --include / --exclude / train, --print-sbatch, and bad flags.
# Prints PASS/FAIL lines for tests/run.sh; skips (exit 0) when "$SHARDLM_BIN" is not built or does
# not know `launch` yet.
set -u
BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$BIN" ] || exit 0
"$BIN" launch --help >/dev/null 2>&1 || exit 0
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
tmp=$(mktemp -d /tmp/shardlm_test_launch_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
log="$tmp/log"
: >"$log"
host=$(hostname)
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; [ $# -gt 0 ] && echo "  $*"; tail -n 15 "$log"; }
check() {  # check NAME CONDITION-COMMAND...
  local name=$1; shift
  if "$@" >>"$log" 2>&1; then pass "$name"; else fail "$name"; fi
}
have_mpirun=0; command -v mpirun >/dev/null 2>&1 && have_mpirun=1
now() { date +%s.%N; }
elapsed_below() { awk -v a="$1" -v b="$(now)" -v lim="$2" 'BEGIN { exit !(b - a < lim) }'; }

# --- workers -------------------------------------------------------------------------------
# env.sh: writes its view of the environment to OUT/env_RANK, prints to stdout and stderr
cat >env.sh <<'EOF'
#!/bin/sh
r=${RANK:-${OMPI_COMM_WORLD_RANK:-x}}
env | grep -E '^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|SHARDLM_[A-Z_]*|MASTER_ADDR|MASTER_PORT|OMPI_COMM_WORLD_RANK|OMPI_COMM_WORLD_SIZE|CUDA_VISIBLE_DEVICES)=' | sort >"$OUT/env_$r"
echo "hello from $r"
echo "complaint from $r" >&2
EOF
# fail.sh: rank 1 exits 3 (or kills itself with SIGKILL when HOW=kill); the others wait 60 s, in a sleep
# whose argument is this run's own (60.<pid>), so that another test run on the machine does not look like
# a worker left behind
SLEEP_MARK="60.$$"
cat >fail.sh <<'EOF'
#!/bin/sh
r=${RANK:-$OMPI_COMM_WORLD_RANK}
if [ "$r" = 1 ]; then
  sleep 0.3
  echo "rank 1 gives up"
  if [ "${HOW:-exit}" = kill ]; then kill -9 $$; fi
  exit 3
fi
trap 'echo "rank $r stopped" >"$OUT/stopped_$r"; exit 143' TERM
sleep SLEEP_MARK & wait
EOF
sed -i "s/SLEEP_MARK/$SLEEP_MARK/" fail.sh
# flaky.sh: rank 0 fails on the first attempt only (a marker file remembers)
cat >flaky.sh <<'EOF'
#!/bin/sh
r=${RANK:-$OMPI_COMM_WORLD_RANK}
echo "attempt $SHARDLM_RESTART_COUNT rank $r" >>"$OUT/attempts"
if [ "$r" = 0 ] && [ ! -e "$OUT/marker" ]; then touch "$OUT/marker"; exit 4; fi
exit 0
EOF
# intr.sh: waits; writes a marker when SIGINT or SIGTERM arrives
cat >intr.sh <<'EOF'
#!/bin/sh
r=${RANK:-$OMPI_COMM_WORLD_RANK}
trap 'echo int >"$OUT/got_$r"; exit 130' INT
trap 'echo term >"$OUT/got_$r"; exit 143' TERM
touch "$OUT/ready_$r"
sleep 60.4343 & wait
EOF
cat >always_fail.sh <<'EOF'
#!/bin/sh
exit 6
EOF
chmod +x env.sh fail.sh flaky.sh intr.sh always_fail.sh

# --- ranks and environment ----------------------------------------------------------------------
mkdir -p fork_env
OUT=$tmp/fork_env "$BIN" launch --backend fork --nproc-per-node 3 ./env.sh >fork_env/out 2>fork_env/err
rc=$?
ok=1
for r in 0 1 2; do
  f=fork_env/env_$r
  grep -qx "RANK=$r" "$f" && grep -qx "SHARDLM_RANK=$r" "$f" && grep -qx "WORLD_SIZE=3" "$f" && grep -qx "SHARDLM_WORLD_SIZE=3" "$f" &&
    grep -qx "LOCAL_RANK=$r" "$f" && grep -qx "SHARDLM_LOCAL_RANK=$r" "$f" && grep -qx "LOCAL_WORLD_SIZE=3" "$f" &&
    grep -qx "SHARDLM_NODE_RANK=0" "$f" && grep -qx "MASTER_ADDR=127.0.0.1" "$f" && grep -qx "MASTER_PORT=29500" "$f" &&
    grep -qx "SHARDLM_LAUNCHER=1" "$f" && grep -qx "SHARDLM_RESTART_COUNT=0" "$f" || ok=0
done
if [ $rc -eq 0 ] && [ $ok -eq 1 ] && [ "$(grep -c '^hello from' fork_env/out)" -eq 3 ]; then pass fork_ranks_and_env
else fail fork_ranks_and_env "rc=$rc"; cat fork_env/env_* fork_env/err; fi

if [ $have_mpirun -eq 1 ]; then
  mkdir -p mpi_env
  OUT=$tmp/mpi_env "$BIN" launch --backend mpirun --nproc-per-node 3 --master-port 29611 ./env.sh >mpi_env/out 2>mpi_env/err
  rc=$?
  ok=1
  for r in 0 1 2; do
    f=mpi_env/env_$r
    grep -qx "OMPI_COMM_WORLD_RANK=$r" "$f" && grep -qx "OMPI_COMM_WORLD_SIZE=3" "$f" && grep -qx "MASTER_ADDR=127.0.0.1" "$f" &&
      grep -qx "MASTER_PORT=29611" "$f" && grep -qx "SHARDLM_LAUNCHER=1" "$f" && ! grep -q "^SHARDLM_RANK=" "$f" || ok=0
  done
  if [ $rc -eq 0 ] && [ $ok -eq 1 ]; then pass mpirun_ranks_and_env; else fail mpirun_ranks_and_env "rc=$rc"; cat mpi_env/env_* mpi_env/err; fi
fi

# --- logs and tee -------------------------------------------------------------------------------
backends="fork"; [ $have_mpirun -eq 1 ] && backends="fork mpirun"
for b in $backends; do
  mkdir -p "logs_$b"
  OUT=$tmp/logs_$b "$BIN" launch --backend $b --nproc-per-node 2 --log-dir "$tmp/logs_$b/L" ./env.sh >"logs_$b/out" 2>"logs_$b/err"
  rc=$?
  if [ $rc -eq 0 ] && grep -qx "hello from 0" "logs_$b/L/rank_0.log" && grep -qx "complaint from 1" "logs_$b/L/rank_1.log" &&
     grep -qx "SHARDLM_LOG_DIR=$tmp/logs_$b/L" "logs_$b/env_0" && ! grep -q "hello" "logs_$b/out"; then
    pass "${b}_per_rank_logs"
  else fail "${b}_per_rank_logs" "rc=$rc"; ls -la "logs_$b/L"; cat "logs_$b/err"; fi
  OUT=$tmp/logs_$b "$BIN" launch --backend $b --nproc-per-node 2 --log-dir "$tmp/logs_$b/T" --tee 1 ./env.sh >"logs_$b/tout" 2>"logs_$b/terr"
  rc=$?
  if [ $rc -eq 0 ] && grep -qx "\[rank 1\] hello from 1" "logs_$b/tout" && ! grep -q "complaint" "logs_$b/terr" &&
     grep -qx "complaint from 1" "logs_$b/T/rank_1.log" && grep -qx "hello from 1" "logs_$b/T/rank_1.log"; then
    pass "${b}_tee_prefixes_lines_and_keeps_logs"
  else fail "${b}_tee_prefixes_lines_and_keeps_logs" "rc=$rc"; cat "logs_$b/tout" "logs_$b/terr"; fi
done

# many short lines from 4 ranks at once, and on rank 0 one line written in two parts 0.3 s apart
# while the others keep writing: every terminal line is whole and prefixed once
cat >chatty.sh <<'EOF2'
#!/bin/sh
i=0
[ "$RANK" = 0 ] && { printf 'first half, '; sleep 0.3; echo 'second half'; }
while [ $i -lt 400 ]; do echo "line $i from $RANK"; [ $i = 200 ] && sleep 0.3; i=$((i + 1)); done
exit 0
EOF2
chmod +x chatty.sh
"$BIN" launch --backend fork --nproc-per-node 4 --log-dir "$tmp/chatty" --tee 1 ./chatty.sh >chatty_out 2>chatty_err
rc=$?
nlines=$(grep -cE '^\[rank ([0-3])\] line [0-9]+ from \1$' chatty_out)
nlong=$(grep -cx '\[rank 0\] first half, second half' chatty_out)
total=$(wc -l <chatty_out)
if [ $rc -eq 0 ] && [ "$nlines" -eq 1600 ] && [ "$nlong" -eq 1 ] && [ "$total" -eq 1601 ]; then pass fork_tee_lines_never_interleave
else fail fork_tee_lines_never_interleave "rc=$rc whole=$nlines long=$nlong total=$total"; grep -vE '^\[rank ([0-3])\] line [0-9]+ from \1$' chatty_out | head -c 600; fi

# --- failures -----------------------------------------------------------------------------------
for b in $backends; do
  mkdir -p "fail_$b"
  t0=$(now)
  OUT=$tmp/fail_$b "$BIN" launch --backend $b --grace-period 1 --nproc-per-node 3 --log-dir "$tmp/fail_$b/L" ./fail.sh >"fail_$b/out" 2>"fail_$b/err"
  rc=$?
  if [ $rc -eq 3 ] && elapsed_below "$t0" 15 &&
     grep -qF "shardlm launch: rank 1 on host $host exited with code 3 (log: $tmp/fail_$b/L/rank_1.log)" "fail_$b/err" &&
     [ -e "fail_$b/stopped_0" ] && [ -e "fail_$b/stopped_2" ] && grep -qx "rank 1 gives up" "fail_$b/L/rank_1.log"; then
    pass "${b}_failed_worker_stops_the_group_and_is_named"
  else fail "${b}_failed_worker_stops_the_group_and_is_named" "rc=$rc"; cat "fail_$b/err"; ls "fail_$b"; fi
  t0=$(now)
  HOW=kill OUT=$tmp/fail_$b "$BIN" launch --backend $b --grace-period 1 --nproc-per-node 2 ./fail.sh >"fail_$b/kout" 2>"fail_$b/kerr"
  rc=$?
  if [ $rc -eq 137 ] && elapsed_below "$t0" 15 && grep -qF "rank 1 on host $host was killed by signal 9 (SIGKILL)" "fail_$b/kerr"; then
    pass "${b}_sigkilled_worker_gives_137"
  else fail "${b}_sigkilled_worker_gives_137" "rc=$rc"; cat "fail_$b/kerr"; fi
done
sleep 0.5
if pgrep -xf "sleep $SLEEP_MARK" >/dev/null 2>&1; then fail no_workers_left_behind "a 'sleep $SLEEP_MARK' worker survived"; else pass no_workers_left_behind; fi

"$BIN" launch --backend fork ./no-such-program >nf.out 2>nf.err
rc=$?
if [ $rc -eq 127 ] && grep -q "cannot run './no-such-program'" nf.err; then pass missing_program_gives_127; else fail missing_program_gives_127 "rc=$rc"; cat nf.err; fi

# --- restarts -----------------------------------------------------------------------------------
for b in $backends; do
  mkdir -p "restart_$b"
  OUT=$tmp/restart_$b "$BIN" launch --backend $b --grace-period 1 --nproc-per-node 2 --max-restarts 2 --log-dir "$tmp/restart_$b/L" ./flaky.sh >"restart_$b/out" 2>"restart_$b/err"
  rc=$?
  if [ $rc -eq 0 ] && grep -qx "shardlm launch: restarting (attempt 1 of 2)" "restart_$b/err" &&
     ! grep -q "attempt 2 of 2" "restart_$b/err" && grep -qx "attempt 1 rank 0" "restart_$b/attempts" &&
     grep -qx "attempt 1 rank 1" "restart_$b/attempts"; then
    pass "${b}_max_restarts_recovers"
  else fail "${b}_max_restarts_recovers" "rc=$rc"; cat "restart_$b/err" "restart_$b/attempts"; fi
done
"$BIN" launch --backend fork --nproc-per-node 2 --max-restarts 2 ./always_fail.sh >af.out 2>af.err
rc=$?
if [ $rc -eq 6 ] && [ "$(grep -c 'restarting (attempt' af.err)" -eq 2 ] && grep -q "attempt 2 of 2" af.err; then
  pass max_restarts_gives_up_with_the_workers_code
else fail max_restarts_gives_up_with_the_workers_code "rc=$rc"; cat af.err; fi

# --- signals ------------------------------------------------------------------------------------
for b in $backends; do
  mkdir -p "sig_$b"
  OUT=$tmp/sig_$b "$BIN" launch --backend $b --grace-period 1 --nproc-per-node 2 ./intr.sh >"sig_$b/out" 2>"sig_$b/err" &
  pid=$!
  for _ in $(seq 100); do [ -e "sig_$b/ready_0" ] && [ -e "sig_$b/ready_1" ] && break; sleep 0.1; done
  t0=$(now)
  kill -INT $pid
  wait $pid
  rc=$?
  if [ $rc -ne 0 ] && elapsed_below "$t0" 15 && [ -s "sig_$b/got_0" ] && [ -s "sig_$b/got_1" ] &&
     grep -q "received SIGINT" "sig_$b/err"; then
    pass "${b}_sigint_reaches_workers"
  else fail "${b}_sigint_reaches_workers" "rc=$rc"; cat "sig_$b/err"; ls "sig_$b"; fi
done
# the fork backend delivers the very signal (SIGINT); mpirun turns it into SIGTERM
check fork_forwards_sigint_itself grep -qx int sig_fork/got_0

# --- dry runs -----------------------------------------------------------------------------------
printf '# cluster\nworker-1 slots=4\n\nworker-2 slots=2   # small\n' >hosts
"$BIN" launch --dry-run --backend mpirun --hostfile hosts ./env.sh a 'b c' >dry1 2>&1
check dry_run_hostfile_uses_all_slots bash -c "grep -q -- '-np 6 ' dry1 && grep -q -- '--host worker-1:4,worker-2:2' dry1 &&
  grep -q 'MASTER_ADDR=worker-1' dry1 && grep -q -- '--devices=0,1,2,3@0,1' dry1 && grep -q \"./env.sh a 'b c'\\\$\" dry1"
"$BIN" launch --dry-run --backend mpirun --hostfile hosts --include 'worker-1:1,3@worker-2' ./env.sh >dry2 2>&1
check dry_run_include bash -c "grep -q -- '-np 4 ' dry2 && grep -q -- '--host worker-1:2,worker-2:2' dry2 &&
  grep -q '# host worker-1 slots 1,3 CUDA_VISIBLE_DEVICES=1,3' dry2 && grep -q -- '--devices=1,3@0,1' dry2"
"$BIN" launch --dry-run --backend mpirun --hostfile hosts --exclude worker-2 ./env.sh >dry3 2>&1
check dry_run_exclude_whole_host bash -c "grep -q -- '-np 4 ' dry3 && grep -q -- '--host worker-1:4 ' dry3 && ! grep -q 'worker-2' dry3"
"$BIN" launch --dry-run --backend fork --include localhost:1,3 ./env.sh >dry4 2>&1
check dry_run_local_include_sets_devices bash -c "[ \$(grep -c '^rank ' dry4) -eq 2 ] && grep -q '^rank 1: .*LOCAL_RANK=1 .*CUDA_VISIBLE_DEVICES=1,3 ./env.sh' dry4"
"$BIN" launch --dry-run --backend fork --nproc-per-node 2 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 ./env.sh >dry5 2>&1
check dry_run_fork_node_rank bash -c "grep -q '^rank 2: MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 RANK=2 WORLD_SIZE=4 LOCAL_RANK=0' dry5 && grep -q '^rank 3: ' dry5"
"$BIN" launch --dry-run --backend mpirun --nproc-per-node 2 train --model gpt2-tiny --steps 5 >dry6 2>&1
check dry_run_train_runs_this_binary grep -q -- "-np 2 .* -- $BIN train --model gpt2-tiny --steps 5\$" dry6
SLURM_JOB_ID=1 "$BIN" launch --dry-run --backend srun --nnodes 2 --nproc-per-node 4 train --config x.json >dry7 2>&1
check dry_run_srun bash -c "grep -q 'srun --ntasks=8 --nodes=2 --ntasks-per-node=4 --kill-on-bad-exit=1 ' dry7 && grep -q \"$BIN train --config x.json\\\$\" dry7"

"$BIN" launch --print-sbatch --nnodes 2 --nproc-per-node 4 --cpus-per-task 8 --time 02:00:00 --log-dir runs/logs train --config cfg.json >sbatch 2>&1
rc=$?
check print_sbatch bash -c "[ $rc -eq 0 ] && grep -qx '#!/bin/bash' sbatch && grep -qx '#SBATCH --nodes=2' sbatch &&
  grep -qx '#SBATCH --ntasks-per-node=4' sbatch && grep -qx '#SBATCH --cpus-per-task=8' sbatch &&
  grep -qx '#SBATCH --time=02:00:00' sbatch && grep -qx '#SBATCH --output=runs/logs/slurm-%j.out' sbatch &&
  grep -qF 'export MASTER_ADDR=\$(scontrol show hostnames \"\$SLURM_JOB_NODELIST\" | head -n1)' sbatch &&
  grep -q '^srun .*--output=runs/logs/rank_%t.log $BIN train --config cfg.json\$' sbatch && bash -n sbatch"

# --- bad flags ----------------------------------------------------------------------------------
bad() {  # bad NAME EXPECTED-MESSAGE ARGS...
  local name=$1 want=$2; shift 2
  "$BIN" launch "$@" >bad.out 2>&1
  local rc=$?
  if [ $rc -ne 0 ] && grep -qF -- "$want" bad.out; then pass "$name"; else fail "$name" "rc=$rc: $(cat bad.out)"; fi
}
printf 'a slots=2\nb slots=two\n' >badhosts
bad bad_unknown_flag "unknown flag '--bogus'" --bogus ./env.sh
bad bad_missing_value "flag --nproc-per-node expects a value" --nproc-per-node
bad bad_nproc_zero "error: flag --nproc-per-node expects an integer >= 1, got '0'" --nproc-per-node 0 ./env.sh
bad bad_no_program "needs a PROGRAM" --nproc-per-node 2
bad bad_hostfile_missing "hostfile $tmp/nope: No such file" --dry-run --backend mpirun --hostfile "$tmp/nope" ./env.sh
bad bad_hostfile_malformed "badhosts:2: slots must be a positive integer, found 'two'" --dry-run --backend mpirun --hostfile badhosts ./env.sh
bad bad_include_unknown_host "--include: host 'worker-9' is not in the host pool" --dry-run --backend mpirun --hostfile hosts --include worker-9 ./env.sh
bad bad_exclude_unknown_slot "--exclude: no slot 7 on host 'worker-2'" --dry-run --backend mpirun --hostfile hosts --exclude worker-2:7 ./env.sh
bad bad_include_and_exclude "cannot be used together" --dry-run --backend mpirun --hostfile hosts --include worker-1 --exclude worker-2 ./env.sh
bad bad_tee "error: flag --tee expects an integer in [0, 3], got '4'" --tee 4 ./env.sh
bad bad_backend "--backend expects" --backend ssh ./env.sh
bad bad_elastic_nnodes "elastic ranges" --nnodes 1:4 ./env.sh
bad bad_fork_multi_host "--backend fork runs workers on this host only" --dry-run --backend fork --hostfile hosts ./env.sh
exit 0
