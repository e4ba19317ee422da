#!/usr/bin/env bash
# test_faults.sh: fault tolerance of a 2-rank data-parallel job under `shardlm launch` (mpirun
# underneath), with deterministic faults from SHARDLM_FAULT (include/shardlm/fault.h):
#   * a worker killed mid-step makes `launch` exit non-zero within seconds, naming the rank;
#   * no partial checkpoint ever becomes `latest`;
#   * relaunching with --resume finishes with the same final model as an uninterrupted run (bits);
#   * a worker killed while writing a checkpoint leaves the previous one as `latest`, loadable;
#   * --max-restarts relaunches by itself and the job completes with the same result;
#   * the same with ZeRO stage 3 (sharded parameters gathered on rank 0 at save, scattered at load).
# Prints PASS/FAIL lines for tests/run.sh; one SKIP line when mpirun is missing.
set -u
BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$BIN" ] || exit 0
if ! command -v mpirun >/dev/null; then echo "SKIP faults: mpirun not found"; exit 0; fi
DATA=${SHARDLM_DATA:-../shared/data}
tmp=$(mktemp -d /tmp/shardlm_test_faults_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
log="$tmp/log"
export OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; [ $# -gt 0 ] && echo "  $*"; tail -n 15 "$log"; }

mkdir -p "$tmp/corpus"
cp "$DATA"/sotu/179*.txt "$tmp/corpus/"
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/data" --train-tokenizer 512 >>"$log" 2>&1
job() {  # job SAVE_DIR [extra train flags]: a 2-rank, 12-step run checkpointing every 4 steps
  local dir=$1; shift
  timeout 300 "$BIN" launch --nproc-per-node 2 --grace-period 1 --log-dir "$dir.logs" "$@" train --model gpt2-tiny \
    --data "$tmp/data" --seq-len 32 --batch-size 2 --steps 12 --save-interval 4 --seed 5 --lr 1e-2 --threads 1 \
    --eval-interval 0 --sample-tokens 0 --log-interval 4 --save-dir "$dir" --resume --zero-stage "${ZERO:-0}"
}

job "$tmp/clean" >>"$log" 2>&1 || fail clean_run
final="$tmp/clean/step_00000012/model.safetensors"

# 1. rank 1 dies in the middle of step 6
start=$(date +%s)
SHARDLM_FAULT=1:6:step job "$tmp/a" >"$tmp/a.out" 2>&1
rc=$?; took=$(( $(date +%s) - start ))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 1" "$tmp/a.out"; then pass killed_worker_fails_the_job_naming_the_rank
else fail killed_worker_fails_the_job_naming_the_rank "exit $rc"; tail -3 "$tmp/a.out"; fi
# the whole job, step time included, must stop well inside a minute
[ $took -lt 60 ] && pass job_stops_within_seconds || fail job_stops_within_seconds "took $took s"
if grep -qx step_00000004 "$tmp/a/latest" && [ ! -e "$tmp/a/step_00000008" ]; then pass no_partial_checkpoint_is_latest
else fail no_partial_checkpoint_is_latest "latest: $(cat "$tmp/a/latest" 2>/dev/null)"; fi
job "$tmp/a" >>"$log" 2>&1
if cmp -s "$final" "$tmp/a/step_00000012/model.safetensors"; then pass relaunch_resumes_to_the_same_final_model
else fail relaunch_resumes_to_the_same_final_model; fi

# 2. rank 0 dies while writing the step-8 checkpoint (files written, not yet committed)
SHARDLM_FAULT=0:8:save job "$tmp/b" >"$tmp/b.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -qx step_00000004 "$tmp/b/latest" && [ ! -e "$tmp/b/step_00000008" ]; then
  pass kill_during_checkpoint_write_keeps_previous_latest
else
  fail kill_during_checkpoint_write_keeps_previous_latest "exit $rc, latest $(cat "$tmp/b/latest" 2>/dev/null)"
fi
"$BIN" generate --model "$tmp/b" --max-new-tokens 3 --seed 1 >/dev/null 2>>"$log" &&
  pass previous_checkpoint_still_loads || fail previous_checkpoint_still_loads
job "$tmp/b" >>"$log" 2>&1
cmp -s "$final" "$tmp/b/step_00000012/model.safetensors" && pass resume_after_failed_save_matches ||
  fail resume_after_failed_save_matches

# 3. --max-restarts: the launcher relaunches by itself (faults fire on the first attempt only)
SHARDLM_FAULT=1:10:step job "$tmp/c" --max-restarts 2 >"$tmp/c.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "restarting (attempt 1 of 2)" "$tmp/c.out" &&
   cmp -s "$final" "$tmp/c/step_00000012/model.safetensors"; then
  pass max_restarts_recovers_to_the_same_final_model
else
  fail max_restarts_recovers_to_the_same_final_model "exit $rc"; tail -5 "$tmp/c.out"
fi

# 4. ZeRO stage 3: a kill during the save, a relaunch, and --max-restarts after a mid-step kill
export ZERO=3
job "$tmp/z3clean" >>"$log" 2>&1 || fail zero3_clean_run
z3final="$tmp/z3clean/step_00000012/model.safetensors"
SHARDLM_FAULT=0:8:save job "$tmp/z3b" >>"$log" 2>&1
if grep -qx step_00000004 "$tmp/z3b/latest" && [ ! -e "$tmp/z3b/step_00000008" ]; then
  pass zero3_kill_during_checkpoint_write_keeps_previous_latest
else
  fail zero3_kill_during_checkpoint_write_keeps_previous_latest "latest $(cat "$tmp/z3b/latest" 2>/dev/null)"
fi
job "$tmp/z3b" >>"$log" 2>&1
cmp -s "$z3final" "$tmp/z3b/step_00000012/model.safetensors" && pass zero3_resume_after_failed_save_matches ||
  fail zero3_resume_after_failed_save_matches
SHARDLM_FAULT=1:6:step job "$tmp/z3c" --max-restarts 1 >"$tmp/z3c.out" 2>&1
if [ $? -eq 0 ] && cmp -s "$z3final" "$tmp/z3c/step_00000012/model.safetensors"; then
  pass zero3_max_restarts_recovers_to_the_same_final_model
else
  fail zero3_max_restarts_recovers_to_the_same_final_model; tail -5 "$tmp/z3c.out"
fi
exit 0
