#!/usr/bin/env bash
# test_two_nodes.sh: a 2-rank training across two "nodes" that can only talk over TCP:
#   * two network namespaces joined by a veth pair (10.77.0.1/24 and 10.77.0.2/24, loopback up in
#     each); mpirun runs in the first, and its rsh launch agent (a script in place of ssh) starts the
#     second node's Open MPI daemon with `ip netns exec` in the second, so each rank sees only its own
#     namespace's interfaces (checked: rank 0 sees 10.77.0.1, rank 1 sees 10.77.0.2);
#   * Open MPI is restricted to the TCP transport on that subnet (btl tcp,self: no shared memory;
#     btl_tcp_if_include / oob_tcp_if_include 10.77.0.0/24), and launch_env sees two nodes of one
#     rank each (tests/slurm/launch_env_probe.c);
#   * the training completes on 2 ranks, the veth counters show at least half the gradient volume
#     (8 steps x 4 bytes x parameters) crossing the link in each direction, and the final model
#     equals the same run on one host (mpirun -np 2, shared memory) byte for byte (or, if the bits
#     ever differ, losses within 2e-4 relative);
#   * `shardlm launch --hostfile` (two hosts, one slot each) runs the same job across the link, with
#     a log per rank, and gives the same bits.
# Prints PASS/FAIL lines for tests/run.sh. Prints one "SKIP two_nodes: REASON" line and exits 0
# where the machine forbids it (not root, no `ip`, no CAP_NET_ADMIN to create namespaces or veths).
# The ASan build skips it (the plain build covers it; SHARDLM_TEST_ASAN_LAUNCHERS=1 runs it anyway).
# The namespaces and the veth pair are deleted on exit.
set -u
BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$BIN" ] || exit 0
skip() { echo "SKIP two_nodes: $*"; exit 0; }
case "$BIN" in
  *asan*) [ -n "${SHARDLM_TEST_ASAN_LAUNCHERS:-}" ] ||
    { echo "SKIP two_nodes (asan build): the plain build covers it (SHARDLM_TEST_ASAN_LAUNCHERS=1 runs it)"; exit 0; } ;;
esac
REPO=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
LIB=$(dirname "$BIN")/libshardlm.a
DATA=${SHARDLM_DATA:-$REPO/../shared/data}
[ "$(id -u)" -eq 0 ] || skip "needs root (ip netns add)"
command -v ip >/dev/null || skip "the ip command (iproute2) is missing"
command -v mpirun >/dev/null || skip "mpirun not found"

tmp=$(mktemp -d /tmp/shardlm_test_two_nodes_XXXXXX)
log="$tmp/log"
# names unique to this run, so concurrent runs do not collide (interface names: at most 15 chars)
ns_a=shardlm_n1_$$; ns_b=shardlm_n2_$$
veth_a=slv${$}a; veth_b=slv${$}b
addr_a=10.77.0.1; addr_b=10.77.0.2
made_a=0; made_b=0
cleanup() {
  [ $made_a -eq 1 ] && ip netns pids "$ns_a" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  [ $made_b -eq 1 ] && ip netns pids "$ns_b" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  ip link del "$veth_a" 2>/dev/null  # only if it never left this namespace
  [ $made_a -eq 1 ] && ip netns del "$ns_a" 2>/dev/null  # deleting a namespace deletes its veth end
  [ $made_b -eq 1 ] && ip netns del "$ns_b" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; [ $# -gt 0 ] && echo "  $*"; tail -n 20 "$log"; }

# --- the two nodes ------------------------------------------------------------------------------
ip netns add "$ns_a" 2>"$tmp/err" || skip "cannot create a network namespace: $(head -n 1 "$tmp/err")"
made_a=1
ip netns add "$ns_b" 2>"$tmp/err" || skip "cannot create a network namespace: $(head -n 1 "$tmp/err")"
made_b=1
ip link add "$veth_a" type veth peer name "$veth_b" 2>"$tmp/err" || skip "cannot create a veth pair: $(head -n 1 "$tmp/err")"
{ ip link set "$veth_a" netns "$ns_a" && ip link set "$veth_b" netns "$ns_b" &&
  ip -n "$ns_a" addr add $addr_a/24 dev "$veth_a" && ip -n "$ns_b" addr add $addr_b/24 dev "$veth_b" &&
  ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up &&
  ip -n "$ns_a" link set "$veth_a" up && ip -n "$ns_b" link set "$veth_b" up; } 2>"$tmp/err" ||
  skip "cannot configure the veth pair: $(head -n 1 "$tmp/err")"
# the link is up when a TCP connection crosses it (bash's /dev/tcp: no ping needed); a refused
# connection (nothing listens on port 9) proves the path as well as an accepted one
up=0
for _ in $(seq 50); do
  out=$(ip netns exec "$ns_a" timeout 2 bash -c "exec 3<>/dev/tcp/$addr_b/9" 2>&1)
  case $out in *refused*|"") up=1; break ;; esac
  sleep 0.1
done
if [ $up -eq 1 ]; then pass veth_link_is_up; else fail veth_link_is_up "$out"; exit 0; fi

# ssh's stand-in: "agent HOST COMMAND..." runs COMMAND in the namespace that owns HOST
cat >"$tmp/agent.sh" <<EOF
#!/bin/sh
host=\$1; shift
case \$host in
  $addr_a) ns=$ns_a ;;
  $addr_b) ns=$ns_b ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
chmod +x "$tmp/agent.sh"
export OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=0  # Open MPI's own allocations are not ours to report
# mpirun reads these from the environment, so `shardlm launch` (which runs mpirun) gets them too
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_plm_rsh_agent="$tmp/agent.sh" OMPI_MCA_btl=tcp,self
export OMPI_MCA_btl_tcp_if_include=10.77.0.0/24 OMPI_MCA_oob_tcp_if_include=10.77.0.0/24
hosts=$addr_a:1,$addr_b:1
in_a() { timeout 120 ip netns exec "$ns_a" "$@"; }

in_a mpirun -np 2 --host $hosts sh -c \
  'echo "rank $OMPI_COMM_WORLD_RANK sees $(ip -o -4 addr show scope global | awk "{print \$4}" | tr "\n" " ")"' \
  >"$tmp/where.out" 2>>"$log"
if grep -qx "rank 0 sees $addr_a/24 " "$tmp/where.out" && grep -qx "rank 1 sees $addr_b/24 " "$tmp/where.out"; then
  pass ranks_run_in_separate_namespaces
else
  fail ranks_run_in_separate_namespaces; cat "$tmp/where.out"
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
  in_a mpirun -np 2 --host $hosts "$tmp/probe" >"$tmp/probe.out" 2>>"$log"
  if grep -qF "probe mpirun (Open MPI) | rank 0 of 2 | local 0 of 1 | node 0 |" "$tmp/probe.out" &&
     grep -qF "probe mpirun (Open MPI) | rank 1 of 2 | local 0 of 1 | node 1 |" "$tmp/probe.out"; then
    pass launch_env_sees_two_nodes
  else
    fail launch_env_sees_two_nodes; cat "$tmp/probe.out"
  fi
else
  echo "SKIP two_nodes launch_env_sees_two_nodes: cannot build tests/slurm/launch_env_probe.c against $LIB"
fi

# --- the training -------------------------------------------------------------------------------
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/'; }
same_result() {  # same_result NAME DIR: DIR's final model equals the one-host reference
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
      fail "$name" "model differs from the one-host run and the losses are not within 2e-4"; paste "$tmp/lb" "$tmp/la"
    fi
  fi
}
rx() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/rx_bytes"; }

mkdir -p "$tmp/corpus"
cp "$DATA"/sotu/179*.txt "$tmp/corpus/"
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/data" --train-tokenizer 512 >>"$log" 2>&1 || fail prepare_runs
common=(train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --batch-size 3 --steps 8 --seed 3 --lr 1e-2 --no-shuffle
        --eval-interval 0 --sample-tokens 0 --log-interval 4 --threads 1)

# the reference: both ranks on this host, in this namespace, default transports (shared memory)
( unset OMPI_MCA_plm_rsh_agent OMPI_MCA_btl OMPI_MCA_btl_tcp_if_include OMPI_MCA_oob_tcp_if_include
  timeout 120 mpirun --oversubscribe -np 2 "$BIN" "${common[@]}" --save-dir "$tmp/ref" ) >"$tmp/ref.out" 2>&1 ||
  { fail one_host_reference_runs; tail -n 10 "$tmp/ref.out"; }

t0=$(date +%s)
rx_a0=$(rx "$ns_a" "$veth_a"); rx_b0=$(rx "$ns_b" "$veth_b")
in_a mpirun -np 2 --host $hosts "$BIN" "${common[@]}" --save-dir "$tmp/two" >"$tmp/two.out" 2>&1
rc=$?
rx_a=$(($(rx "$ns_a" "$veth_a") - rx_a0)); rx_b=$(($(rx "$ns_b" "$veth_b") - rx_b0))
if [ $rc -eq 0 ] && grep -q 'data-parallel ranks: 2' "$tmp/two.out"; then
  pass two_node_training_completes
else
  fail two_node_training_completes "exit $rc"; tail -n 10 "$tmp/two.out"
fi
params=$(sed -n 's/.*(GPT-2, \([0-9]*\) parameters.*/\1/p' "$tmp/two.out" | head -n 1)
need=$((8 * 4 * ${params:-0} / 2))
echo "# two-node run: $(($(date +%s) - t0)) s; bytes received over the veth: node 1 $rx_a, node 2 $rx_b; parameters ${params:-?}"
if [ -n "$params" ] && [ "$params" -gt 0 ] && [ $rx_a -ge $need ] && [ $rx_b -ge $need ]; then
  pass gradients_cross_the_veth
else
  fail gradients_cross_the_veth "received $rx_a and $rx_b bytes, expected at least $need each"
fi
same_result two_nodes_match_one_host "$tmp/two"

# shardlm launch with a DeepSpeed hostfile: mpirun underneath, the same agent and transports
printf '%s slots=1\n%s slots=1\n' $addr_a $addr_b >"$tmp/hostfile"
in_a "$BIN" launch --hostfile "$tmp/hostfile" --log-dir "$tmp/launch_logs" "${common[@]}" --save-dir "$tmp/launch" \
  >"$tmp/launch.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q 'data-parallel ranks: 2' "$tmp/launch_logs/rank_0.log" && [ -f "$tmp/launch_logs/rank_1.log" ]; then
  pass launch_hostfile_two_nodes_trains
else
  fail launch_hostfile_two_nodes_trains "exit $rc"; tail -n 10 "$tmp/launch.out"
fi
same_result launch_hostfile_two_nodes_match_one_host "$tmp/launch"
exit 0
