#!/usr/bin/env bash
# test_report.sh: `shardlm report` (ds_report): exits 0 and prints the key rows (compiler, OpenBLAS,
# OpenMP, MPI, cJSON, PCRE2, the comm and ops backends, the launch environment, CUDA), also on a
# machine without a GPU or CUDA driver (this one, when ldconfig knows no libcuda.so.1), reports the
# launcher it finds, survives a malformed launcher variable, and rejects an unknown flag with exit 2.
# Prints PASS/FAIL lines for tests/run.sh. Skips silently (exit 0) while "$SHARDLM_BIN" is not an
# executable.
set -u
BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$BIN" ] || exit 0
tmp=$(mktemp -d /tmp/shardlm_test_report_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failures=0
check() {  # check NAME COMMAND...: PASS if the command succeeds
  local name=$1; shift
  if "$@" >>"$tmp/log" 2>&1; then echo "PASS $name"; else echo "FAIL $name"; failures=$((failures + 1)); tail -n 20 "$tmp/log"; fi
}
# Run without any launcher's variables, so the report sees a single process.
clean_env() { env -u SHARDLM_RANK -u SHARDLM_WORLD_SIZE -u RANK -u WORLD_SIZE -u OMPI_COMM_WORLD_RANK \
  -u OMPI_COMM_WORLD_SIZE -u PMI_RANK -u PMI_SIZE -u SLURM_PROCID -u SLURM_NTASKS -u SLURM_STEP_NUM_TASKS "$@"; }

# 1. Plain run: exit 0 and every key row.
clean_env "$BIN" report >"$tmp/out.txt" 2>"$tmp/err.txt"; rc=$?
check report_exits_0 test $rc -eq 0
for key in "compiler" "C standard" "sanitizers" "OpenBLAS config" "OpenBLAS core" "OpenBLAS threads" \
           "OpenMP max threads" "MPI library" "MPI standard" "cJSON" "PCRE2" "comm self" "comm mpi" \
           "comm nccl" "ops cpu" "ops cuda" "launcher" "rank / world size" "CUDA driver" "GPUs" \
           "CUDA runtime" "cuDNN" "NCCL"; do
  check "report_row_${key//[^A-Za-z0-9]/_}" grep -q "^  $key  *[^ ]" "$tmp/out.txt"
done
check report_openblas_version grep -Eq '^  OpenBLAS config +OpenBLAS [0-9]' "$tmp/out.txt"
check report_mpi_version grep -Eq '^  MPI standard +[0-9]+\.[0-9]+$' "$tmp/out.txt"
check report_mpi_library grep -Eq '^  MPI library +(Open MPI|MPICH|Intel|.*MPI)' "$tmp/out.txt"
check report_comm_backends_built grep -Eq '^  comm mpi +built in' "$tmp/out.txt"
check report_ops_cpu_built grep -Eq '^  ops cpu +built in' "$tmp/out.txt"
# The ops cuda row follows the build: "built in (...)" when the library has the CUDA backend.
if nm "$(dirname "$BIN")/libshardlm.a" 2>/dev/null | grep -Eq ' [DR] sl_ops_cuda$'; then
  check report_ops_cuda_built grep -Eq '^  ops cuda +built in \(.*cuBLASLt loaded at run time; fp32 and bf16 activation storage\)$' "$tmp/out.txt"
else
  check report_ops_cuda_not_built grep -Eq '^  ops cuda +not built \(no nvcc at build time, or CUDA=0\)$' "$tmp/out.txt"
fi
check report_single_process grep -Eq '^  rank / world size +0 / 1$' "$tmp/out.txt"
check report_launcher_none grep -Eq '^  launcher +none$' "$tmp/out.txt"

# 2. No GPU: where the loader cannot find libcuda.so.1 (CUDA_HOME pointed at an empty directory), the
# report still exits 0 and gives the reason. On a machine with a driver, check the GPU row's form instead.
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  clean_env CUDA_HOME="$tmp/nocuda" "$BIN" report >"$tmp/nogpu.txt" 2>&1; rc=$?
  check report_no_gpu_exits_0 test $rc -eq 0
  check report_no_gpu_driver_reason grep -Eq '^  CUDA driver +not available: no CUDA driver \(libcuda\.so\.1 not found\)' "$tmp/nogpu.txt"
  check report_no_gpu_gpus_reason grep -Eq '^  GPUs +not available: ' "$tmp/nogpu.txt"
else
  check report_gpu_rows grep -Eq '^  GPUs +([0-9]+|not available: .+)$' "$tmp/out.txt"
fi

# 3. A launcher's variables are reported; a malformed one is named, not fatal.
clean_env OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=2 \
  "$BIN" report >"$tmp/ompi.txt" 2>&1; rc=$?
check report_ompi_exits_0 test $rc -eq 0
check report_ompi_launcher grep -Eq '^  launcher +mpirun \(Open MPI\)$' "$tmp/ompi.txt"
check report_ompi_rank grep -Eq '^  rank / world size +1 / 4$' "$tmp/ompi.txt"
clean_env SHARDLM_RANK=x SHARDLM_WORLD_SIZE=2 "$BIN" report >"$tmp/bad.txt" 2>&1; rc=$?
check report_bad_env_exits_0 test $rc -eq 0
check report_bad_env_named grep -Eq '^  launcher +not available: .*SHARDLM_RANK' "$tmp/bad.txt"
# a malformed run-time switch (settings.h) is named by report, and stops a run
clean_env SHARDLM_ATTENTION_GRID=diagonal "$BIN" report >"$tmp/badgrid.txt" 2>&1; rc=$?
check report_bad_setting_exits_0 test $rc -eq 0
check report_bad_setting_named grep -q 'SHARDLM_ATTENTION_GRID="diagonal": expected tiles or heads' "$tmp/badgrid.txt"
clean_env SHARDLM_ATTENTION_GRID=diagonal "$BIN" train --steps 1 >"$tmp/badgrid_train.txt" 2>&1; rc=$?
check bad_setting_stops_train test $rc -ne 0
check bad_setting_stops_train_named grep -q 'SHARDLM_ATTENTION_GRID="diagonal"' "$tmp/badgrid_train.txt"
clean_env SHARDLM_ATTENTION_DQ=sometimes "$BIN" report >"$tmp/baddq.txt" 2>&1
check report_bad_dq_setting_named grep -q 'SHARDLM_ATTENTION_DQ="sometimes": expected split, atomic or ordered' "$tmp/baddq.txt"
clean_env SHARDLM_ATTENTION_DQ=atomic "$BIN" report >"$tmp/dq.txt" 2>&1
check report_lists_the_dq_setting grep -Eq 'SHARDLM_ATTENTION_DQ +atomic' "$tmp/dq.txt"
clean_env SHARDLM_CUDNN_WORKSPACE_MB=0 "$BIN" report >"$tmp/badws.txt" 2>&1
check report_bad_workspace_named grep -q 'SHARDLM_CUDNN_WORKSPACE_MB="0": expected an integer from 1 to 1048576' "$tmp/badws.txt"
clean_env SHARDLM_CUDNN_WORKSPACE_MB=256 "$BIN" report >"$tmp/ws.txt" 2>&1
check report_lists_the_workspace_setting grep -Eq 'SHARDLM_CUDNN_WORKSPACE_MB +256' "$tmp/ws.txt"
# SHARDLM_CUDNN_LIBRARY: only the file it names is loaded; one that does not load is named with the
# loader's reason, and the report still exits 0
clean_env SHARDLM_CUDNN_LIBRARY="$tmp/none/libcudnn.so.9" "$BIN" report >"$tmp/cudnnlib.txt" 2>&1; rc=$?
check report_bad_cudnn_library_exits_0 test $rc -eq 0
check report_bad_cudnn_library_named grep -Eq "^  cuDNN +not available: SHARDLM_CUDNN_LIBRARY=$tmp/none/libcudnn.so.9: " "$tmp/cudnnlib.txt"
check report_lists_the_cudnn_library_setting grep -Eq "SHARDLM_CUDNN_LIBRARY +$tmp/none/libcudnn.so.9" "$tmp/cudnnlib.txt"

# 4. Flags: --help exits 0, an unknown flag exits 2 with a message.
"$BIN" report --help >"$tmp/help.txt" 2>&1; rc=$?
check report_help_exits_0 test $rc -eq 0
check report_listed_in_help sh -c "'$BIN' --help | grep -q '^  report '"
"$BIN" report --bogus >"$tmp/bogus.txt" 2>&1; rc=$?
check report_bad_flag_exits_2 test $rc -eq 2
check report_bad_flag_message grep -q "unknown flag '--bogus'" "$tmp/bogus.txt"

[ $failures -eq 0 ]
