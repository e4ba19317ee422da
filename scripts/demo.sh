#!/usr/bin/env bash
# scripts/demo.sh: the main job on the built-in default, from a fresh Debian machine:
# install what is missing, build, tokenize the State of the Union corpus in ../shared/data/sotu,
# train the small gpt2-demo model for a few minutes on the CPU (checkpoint in runs/demo), then
# sample from the checkpoint. Extra arguments go to `shardlm train` (e.g. --steps 50).
set -eu
cd "$(dirname "$0")/.."
bash scripts/setup.sh
make -s -j"$(nproc)" build/shardlm
DATA_SRC=${SHARDLM_DATA:-../shared/data}
if [ ! -f data/sotu/train_000000.bin ]; then
  build/shardlm prepare --input "$DATA_SRC/sotu" --tokenizer "$DATA_SRC/gpt2" --output data/sotu
fi
build/shardlm train --data data/sotu --save-dir runs/demo "$@"
build/shardlm generate --model runs/demo --prompt "My fellow citizens," --max-new-tokens 60 --seed 1
