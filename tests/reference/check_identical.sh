#!/usr/bin/env bash
# tests/reference/check_identical.sh BASE [OTHER]: shows that two revisions train bit for bit alike.
# For a refactor that must not move behaviour (issue 17): builds BASE and OTHER (a commit, or "." for
# the working tree as it is, the default) in their own directories (CUDA=0), then runs the same fixed
# seed 50-step gpt2-demo training at 2 ranks under `shardlm launch` for four configurations:
#   fp32-zero0, fp32-zero3: fp32, ZeRO stage 0 and 3;
#   bf16emu-zero0, bf16emu-zero3: --precision bf16 on the cpu-bf16 table (SHARDLM_EMULATE_BF16_STORAGE=1,
#   the GPU's bf16 activation storage emulated), ZeRO stage 0 and 3.
# and compares, per configuration, every step's logged loss (the metrics.jsonl "loss" values, as
# printed) and every file of the final checkpoint byte for byte (model, optimizer shards, config,
# trainer_state.json, manifest.json). Nothing is excluded: both sides run in their own directory with
# the same relative save path and the same data directory, so even the paths recorded in
# trainer_state.json are equal. Threads are 1 per rank. Exits 0 when all four are identical, 1 when any
# differs (naming the first differing step or file), 2 on a usage or build error.
#
# Runs by hand (not in `make test`): about 10 minutes on 2 cores (two builds, eight runs of 50 steps
# at micro-batch 4 x 64 tokens).
#   tests/reference/check_identical.sh HEAD~3          # HEAD~3 against the working tree
#   tests/reference/check_identical.sh v1 v2           # two commits
#   CONFIGS="fp32-zero0" tests/reference/check_identical.sh HEAD   # one configuration (faster)
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 BASE [OTHER]   (revisions; OTHER defaults to '.', the working tree)" >&2; exit 2
fi
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
base=$1 other=${2:-.}
tmp=$(mktemp -d /tmp/shardlm_identical_XXXXXX)
worktrees=()
cleanup() {
  for w in "${worktrees[@]}"; do git -C "$root" worktree remove --force "$w" >/dev/null 2>&1 || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# build REV NAME: the shardlm binary of REV at $tmp/NAME/shardlm
build() {
  local rev=$1 name=$2 src
  mkdir -p "$tmp/$name"
  if [ "$rev" = . ]; then
    src=$root
  else
    src=$tmp/$name/src
    git -C "$root" worktree add --detach "$src" "$rev" >/dev/null 2>&1 || { echo "cannot check out $rev" >&2; exit 2; }
    worktrees+=("$src")
    ln -sfn "$root/../shared" "$tmp/$name/shared"  # ../shared next to the checkout, as in the repository
  fi
  echo "building $rev ($name) ..."
  make -C "$src" --no-print-directory -j2 CUDA=0 NCCL=0 B="$tmp/$name/build" "$tmp/$name/build/shardlm" \
    >"$tmp/$name/build.log" 2>&1 || { echo "build of $rev failed: see below" >&2; tail -20 "$tmp/$name/build.log"; exit 2; }
  ln -sfn "$tmp/$name/build/shardlm" "$tmp/$name/shardlm"
}
build "$base" a
build "$other" b

# the data, prepared once (by BASE) and read by both
"$tmp/a/shardlm" prepare --input "$root/../shared/data/sotu" --tokenizer "$root/../shared/data/gpt2" \
  --output "$tmp/data" >"$tmp/prepare.log" 2>&1 || { echo "prepare failed" >&2; tail "$tmp/prepare.log"; exit 2; }

# run NAME CONFIG: one configuration's run in $tmp/NAME/run (cwd), checkpoint in ck-CONFIG
run() {
  local name=$1 cfg=$2 zero precision emulate=0
  case $cfg in
    fp32-zero0) zero=0 precision=fp32 ;; fp32-zero3) zero=3 precision=fp32 ;;
    bf16emu-zero0) zero=0 precision=bf16 emulate=1 ;; bf16emu-zero3) zero=3 precision=bf16 emulate=1 ;;
  esac
  mkdir -p "$tmp/$name/run"
  (cd "$tmp/$name/run" && OMP_NUM_THREADS=1 SHARDLM_EMULATE_BF16_STORAGE=$emulate \
     "$tmp/$name/shardlm" launch --nproc-per-node 2 -- train --model gpt2-demo --data "$tmp/data" --steps 50 \
     --seed 1337 --batch-size 4 --seq-len 64 --threads 1 --lr 1e-3 --zero-stage "$zero" --precision "$precision" \
     --eval-interval 0 --sample-tokens 0 --log-interval 1 --save-dir "ck-$cfg" >"log-$cfg" 2>&1) ||
    { echo "run $name $cfg failed:" >&2; tail -20 "$tmp/$name/run/log-$cfg" >&2; exit 2; }
}

status=0
for cfg in ${CONFIGS:-fp32-zero0 fp32-zero3 bf16emu-zero0 bf16emu-zero3}; do
  echo "running $cfg ..."
  run a "$cfg"
  run b "$cfg"
  A=$tmp/a/run/ck-$cfg B=$tmp/b/run/ck-$cfg
  sed -n 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$A/metrics.jsonl" >"$tmp/a-$cfg.loss"
  sed -n 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$B/metrics.jsonl" >"$tmp/b-$cfg.loss"
  n=$(wc -l <"$tmp/a-$cfg.loss")
  if [ "$n" -ne 50 ] || ! cmp -s "$tmp/a-$cfg.loss" "$tmp/b-$cfg.loss"; then
    first=$(diff "$tmp/a-$cfg.loss" "$tmp/b-$cfg.loss" | sed -n '2p' || true)
    echo "DIFFERENT: $cfg losses ($n steps logged; first difference: ${first:-none})"; status=1; continue
  fi
  files=0 bad=""
  for f in "$A"/step_00000050/*; do
    files=$((files + 1))
    cmp -s "$f" "$B/step_00000050/$(basename "$f")" || { bad=$(basename "$f"); break; }
  done
  [ "$(ls "$A/step_00000050" | wc -l)" -eq "$(ls "$B/step_00000050" | wc -l)" ] || bad=${bad:-"the file lists"}
  if [ -n "$bad" ] || [ "$files" -eq 0 ]; then echo "DIFFERENT: $cfg checkpoint: ${bad:-no files}"; status=1
  else echo "same: $cfg (50 losses, $files checkpoint files byte for byte)"; fi
done
[ $status -eq 0 ] && echo "identical: $base and $other train alike in: ${CONFIGS:-all four configurations}"
exit $status
