#!/usr/bin/env bash
# tests/gpu/pack.sh: run HERE (the machine with ../shared and a package archive) before a device-tool call
# that runs tests/gpu/suite.sh: copies the training text (sotu) and the GPT-2 tokenizer (gpt2) from
# SHARDLM_DATA (default ../shared/data) into build/gpu-data/, and fetches the library .debs into
# build/gpu-deps/ (bench/gpu_deps.sh) when that folder lacks them (oneDNN's .deb is the newest). build/
# is git-ignored: name both folders in the call's `carry` (about 13 + 24 MB). Prints their sizes.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=${SHARDLM_DATA:-../shared/data}
for d in sotu gpt2; do
    [[ -d "$src/$d" ]] || { echo "pack.sh: $src/$d not found" >&2; exit 1; }
done
rm -rf build/gpu-data
mkdir -p build/gpu-data
cp -r "$src/sotu" "$src/gpt2" build/gpu-data/
{ ls build/gpu-deps/libdnnl2_*.deb && ls build/gpu-deps/libutf8proc2_*.deb; } >/dev/null 2>&1 || bash bench/gpu_deps.sh build/gpu-deps >/dev/null
du -sh build/gpu-data build/gpu-deps
