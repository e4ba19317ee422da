#!/usr/bin/env bash
# test_supervise.sh: `shardlm launch` supervision (docs/launch.md, "Supervision"), local processes only:
#   * hang detection: 2 ranks that heartbeat, one stopped with SIGSTOP: the job is torn down within
#     the stated time (hang timeout + grace period + 1 s on fork, + 2 x (grace + 1) s more on mpirun),
#     exit code 124, the rank named with its host; the same with 2 real `shardlm train` ranks under
#     mpirun (the heartbeat comes from the training loop's thread);
#   * a program that never heartbeats is never called hung; --hang-timeout 0 turns detection off;
#   * launcher death: `shardlm launch` killed with SIGKILL takes every process of the job with it
#     (wrappers, mpirun, the programs and their children) within grace + 1 s (fork) or
#     2 x (grace + 1) + 1 s (mpirun);
#   * output to a file under mpirun (which gives ranks a pseudo-terminal): one plain line per
#     training step, no '\r' progress.
# Bounds below add 3 s of slack for a loaded machine and the sanitizer build.
. "$(dirname "$0")/lib.sh" supervise
cd "$tmp" || exit 1
export OUT=$tmp
host=$(hostname)
have_mpirun=0; command -v mpirun >/dev/null 2>&1 && have_mpirun=1
backends="fork"; [ $have_mpirun -eq 1 ] && backends="fork mpirun"
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
below() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
wait_for() {  # wait_for SECONDS FILE...: until every file exists and is non-empty
  local n=$(( $1 * 10 )); shift
  for _ in $(seq "$n"); do
    local ok=1; for f in "$@"; do [ -s "$f" ] || ok=0; done
    [ $ok -eq 1 ] && return 0; sleep 0.1
  done
  return 1
}
# every process of a job started from $tmp has $tmp in its command line; sleeps carry a unique value
job_gone_within() {  # job_gone_within SECONDS
  local n=$(( $1 * 10 ))
  for _ in $(seq "$n"); do
    pgrep -f "$tmp/|61\.$$" >/dev/null 2>&1 || return 0; sleep 0.1
  done
  return 1
}

# beat.sh: heartbeats every 0.2 s (the whole protocol: rewrite the file with changing content)
cat >beat.sh <<'EOF2'
#!/bin/sh
r=${RANK:-$OMPI_COMM_WORLD_RANK}
echo $$ >"$OUT/pid_$r.tmp" && mv "$OUT/pid_$r.tmp" "$OUT/pid_$r"
i=0
while :; do i=$((i + 1)); echo "beat $i step $i shell" >"$SHARDLM_HEARTBEAT_FILE"; sleep 0.2; done
EOF2
# quiet.sh: never heartbeats, works 2.5 s and succeeds
printf '#!/bin/sh\nsleep 2.5\nexit 0\n' >quiet.sh
# orphan.sh: waits in a child, as a program with helpers would
cat >orphan.sh <<EOF2
#!/bin/sh
r=\${RANK:-\$OMPI_COMM_WORLD_RANK}
echo \$\$ >"\$OUT/ready_\$r"
sleep 61.$$ & wait
EOF2
chmod +x beat.sh quiet.sh orphan.sh

# --- a stopped rank is found, named and the job torn down ------------------------------------------
for b in $backends; do
  rm -f pid_*
  grace=1 hang=2
  limit=$(( hang + grace + 1 + 3 )); [ $b = mpirun ] && limit=$(( limit + 2 * (grace + 1) ))
  "$BIN" launch --backend $b --nproc-per-node 2 --grace-period $grace --hang-timeout $hang --log-dir "$tmp/hang_$b" \
    "$tmp/beat.sh" >"hang_$b.out" 2>"hang_$b.err" &
  lp=$!
  if ! wait_for 20 pid_0 pid_1; then fail "${b}_stopped_rank_is_named_and_job_torn_down" "workers did not start"; kill -9 $lp; continue; fi
  sleep 0.5
  kill -STOP "$(cat pid_1)"
  t0=$(now)
  wait $lp; rc=$?
  took=$(since "$t0")
  if [ $rc -eq 124 ] && below "$took" $limit &&
     grep -q "^shardlm launch: rank 1 on host $host hung: no heartbeat for [0-9.]* s (last: step [0-9]* shell); it was killed and the job stopped, exit code 124 (log: $tmp/hang_$b/rank_1.log)\$" "hang_$b.err" &&
     job_gone_within 3; then
    pass "${b}_stopped_rank_is_named_and_job_torn_down"
  else fail "${b}_stopped_rank_is_named_and_job_torn_down" "rc=$rc took=${took}s limit=${limit}s"; cat "hang_$b.err"; fi
done

# a program that never heartbeats is not watched; --hang-timeout 0 turns detection off
"$BIN" launch --backend fork --nproc-per-node 2 --hang-timeout 1 "$tmp/quiet.sh" >quiet.out 2>&1
rc=$?
if [ $rc -eq 0 ]; then pass program_without_heartbeat_is_not_called_hung
else fail program_without_heartbeat_is_not_called_hung "rc=$rc"; cat quiet.out; fi
rm -f pid_*
"$BIN" launch --backend fork --nproc-per-node 1 --grace-period 1 --hang-timeout 0 "$tmp/beat.sh" >off.out 2>&1 &
lp=$!
if wait_for 20 pid_0; then
  kill -STOP "$(cat pid_0)"
  sleep 3
  if kill -0 $lp 2>/dev/null && ! grep -q "no heartbeat" off.out; then pass hang_timeout_0_turns_detection_off
  else fail hang_timeout_0_turns_detection_off; cat off.out; fi
else fail hang_timeout_0_turns_detection_off "worker did not start"; fi
kill -TERM $lp; wait $lp 2>/dev/null
job_gone_within 5 || fail hang_timeout_0_job_stops "leftover: $(pgrep -af "$tmp/")"

# --- the same with two real training ranks ----------------------------------------------------------
if [ $have_mpirun -eq 1 ] && prepare_tiny_data; then
  grace=1 hang=3 limit=$(( 3 + 1 + 1 + 2 * 2 + 3 ))
  "$BIN" launch --backend mpirun --nproc-per-node 2 --grace-period $grace --hang-timeout $hang --log-dir "$tmp/train_logs" \
    train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --steps 1000000 --eval-interval 0 --sample-tokens 0 \
    --no-save --threads 1 >train.out 2>train.err &
  lp=$!
  started=0
  for _ in $(seq 600); do grep -q ' step [1-9][0-9]* training' train_logs/.heartbeat_1 2>/dev/null && { started=1; break; }; sleep 0.1; done
  if [ $started -eq 1 ]; then
    kill -STOP "$(awk '{ print $4 }' train_logs/.heartbeat_1)"
    t0=$(now)
    wait $lp; rc=$?
    took=$(since "$t0")
    if [ $rc -eq 124 ] && below "$took" $limit &&
       grep -q "^shardlm launch: rank 1 on host $host hung: no heartbeat for [0-9.]* s (last: step [0-9]* training); it was killed" train.err &&
       grep -q '^step [0-9]*/1000000 | loss' train_logs/rank_0.log && job_gone_within 3; then
      pass mpirun_stopped_training_rank_is_named_and_job_torn_down
    else fail mpirun_stopped_training_rank_is_named_and_job_torn_down "rc=$rc took=${took}s limit=${limit}s"; cat train.err; fi
  else
    fail mpirun_stopped_training_rank_is_named_and_job_torn_down "no training heartbeat"; cat train.err train_logs/*.log | tail; kill -9 $lp
  fi
  # output to a file (no --log-dir): one plain line per step, no carriage returns
  "$BIN" launch --backend mpirun --nproc-per-node 2 train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --steps 5 \
    --eval-interval 0 --sample-tokens 0 --no-save --threads 1 >plain.out 2>&1
  rc=$?
  if [ $rc -eq 0 ] && ! grep -q $'\r' plain.out && [ "$(grep -c '^step [1-5]/5 | loss' plain.out)" -eq 5 ]; then
    pass mpirun_progress_to_a_file_is_plain_lines
  else fail mpirun_progress_to_a_file_is_plain_lines "rc=$rc"; od -c plain.out | head; fi
fi

# --- the launcher's death takes the job down --------------------------------------------------------
for b in $backends; do
  rm -f ready_*
  grace=1
  limit=$(( grace + 1 + 3 )); [ $b = mpirun ] && limit=$(( 2 * (grace + 1) + 1 + 3 ))
  "$BIN" launch --backend $b --nproc-per-node 2 --grace-period $grace "$tmp/orphan.sh" >"orphan_$b.out" 2>&1 &
  lp=$!
  if ! wait_for 20 ready_0 ready_1; then fail "${b}_launcher_sigkill_takes_the_job_down" "workers did not start"; kill -9 $lp; continue; fi
  kill -KILL $lp
  t0=$(now)
  wait $lp 2>/dev/null
  if job_gone_within $limit; then pass "${b}_launcher_sigkill_takes_the_job_down"
  else fail "${b}_launcher_sigkill_takes_the_job_down" "after $(since "$t0") s still running:"; pgrep -af "$tmp/|61\.$$"; fi
done
exit 0
