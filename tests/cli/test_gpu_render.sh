#!/usr/bin/env bash
# test_gpu_render.sh: bench/gpu_render.py renders the committed GPU results (bench/gpu_results.jsonl and
# bench/gpu_sdpa.jsonl, the last GPU session's files) into exactly the GPU section bench/RESULTS.md holds
# (its numbers come from the files, none edited by hand), with the attention-alone table; without
# --sdpa the table is left out; a malformed call is refused. Prints PASS/FAIL lines for tests/run.sh.
. "$(dirname "$0")/lib.sh" gpu_render
cd "$(dirname "$0")/../.." || exit 1
section() { sed -n '/<!-- gpu-section:begin -->/,/<!-- gpu-section:end -->/p' "$1"; }
command -v python3 >/dev/null || { echo "SKIP gpu_render: no python3"; exit 0; }

cp bench/RESULTS.md "$tmp/R.md"
expect render_exits_0 python3 bench/gpu_render.py bench/gpu_results.jsonl "$tmp/R.md" --section "$tmp/sec.md" \
  --sdpa bench/gpu_sdpa.jsonl
expect render_matches_the_committed_section cmp <(section bench/RESULTS.md) <(section "$tmp/R.md")
expect render_section_file_is_the_section cmp <(section "$tmp/R.md") "$tmp/sec.md"
expect render_attention_alone_table grep -q '^### Attention alone, a layer' "$tmp/sec.md"
# a PyTorch line and a shardlm row of the GPT-2 124M shape (B = 64: shardlm's row is its own B)
expect render_sdpa_pytorch_line grep -Eq '^\| gpt2 \(64, 12, 1024, 64\) \| PyTorch CUDNN_ATTENTION, bhsd .*\| [0-9.]+ \| [0-9.]+ \|' "$tmp/sec.md"
expect render_sdpa_shardlm_row grep -Eq '^\| gpt2 \(64, 12, 1024, 64\) \| shardlm .*B=64\) \| [0-9.]+ \| [0-9.]+ \|' "$tmp/sec.md"
cp bench/RESULTS.md "$tmp/R2.md"
expect render_without_sdpa python3 bench/gpu_render.py bench/gpu_results.jsonl "$tmp/R2.md" --section "$tmp/sec2.md"
expect render_without_sdpa_has_no_table bash -c "! grep -q 'Attention alone' '$tmp/sec2.md'"
expect render_usage_refused bash -c "! python3 bench/gpu_render.py bench/gpu_results.jsonl >'$tmp/usage.txt' 2>&1"
expect render_usage_named grep -q 'usage: gpu_render.py' "$tmp/usage.txt"
