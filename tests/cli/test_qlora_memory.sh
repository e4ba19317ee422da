#!/usr/bin/env bash
# test_qlora_memory.sh: what a QLoRA run of a GPT-2 124M-sized model (`--model gpt2`, the test data's
# 512-token vocabulary: 86.2M parameters, 84.9M of them in the blocks' linears) holds:
#   * the memory line's total equals the formula 4P + Q + (4 + 4 + K)A, and the peak resident set
#     (/usr/bin/time) is that total plus at most 96 MB (program, libraries, activations at B=1, T=64:
#     55 MB measured) and below what the linears alone take in fp32 (339.7 MB): no fp32 copy exists;
#   * under `ulimit -v 1000000` (1 GB of address space; OpenBLAS and OpenMP reserve about 0.7 GB of it)
#     LoRA on the fp32 base stops at start with a clear out-of-memory error and QLoRA trains.
# Skipped under AddressSanitizer (its shadow memory makes resident and address-space sizes meaningless).
. "$(dirname "$0")/lib.sh" qlora_memory
case "$BIN" in */asan/*) echo "note: skipped under AddressSanitizer"; exit 0 ;; esac
[ -x /usr/bin/time ] || { fail qlora_memory_needs_usr_bin_time "no /usr/bin/time"; exit 0; }
prepare_tiny_data || { fail prepare_tiny_data "no $DATA/sotu"; exit 0; }
run=(train --model gpt2 --data "$tmp/data" --seq-len 64 --batch-size 1 --threads 2 --steps 1 --eval-interval 0
     --sample-tokens 0 --no-save --lora-r 8 --lora-targets c_attn,c_proj,c_fc)

/usr/bin/time -f "peak_rss_kb %M" "$BIN" "${run[@]}" --quantize nf4 >"$tmp/q.out" 2>&1
rc=$?
line=$(grep '^memory per rank (QLoRA' "$tmp/q.out"); formula=$(grep '^  formula 4P + Q' "$tmp/q.out")
total=$(sed -n 's/.* = \([0-9]*\) bytes$/\1/p' <<<"$line"); est=$(sed -n 's/.*weights): \([0-9]*\) bytes;.*/\1/p' <<<"$formula")
rss=$(( $(sed -n 's/^peak_rss_kb //p' "$tmp/q.out") * 1024 ))
echo "QLoRA gpt2: model states $total bytes (formula $est), peak resident $rss bytes"
if [ $rc -eq 0 ] && [ -n "$total" ] && [ "$total" = "$est" ]; then pass qlora_124m_memory_line_is_the_formula
else fail qlora_124m_memory_line_is_the_formula "exit $rc: '$line' / '$formula'"; fi
if [ $rc -eq 0 ] && [ "$rss" -gt "$total" ] && [ "$rss" -le $((total + 96 * 1024 * 1024)) ] && [ "$rss" -lt 339738624 ]; then
  pass qlora_124m_peak_resident_is_the_quantised_size
else fail qlora_124m_peak_resident_is_the_quantised_size "peak $rss, states $total"; fi

( ulimit -v 1000000; timeout -s KILL 300 "$BIN" "${run[@]}" >"$tmp/fp32.out" 2>&1 ); rc_fp32=$?
( ulimit -v 1000000; timeout -s KILL 300 "$BIN" "${run[@]}" --quantize nf4 >"$tmp/limited.out" 2>&1 ); rc_q=$?
if [ $rc_fp32 -eq 1 ] && grep -q "error: out of memory allocating" "$tmp/fp32.out"; then
  pass fp32_lora_does_not_fit_1gb_address_space
else fail fp32_lora_does_not_fit_1gb_address_space "exit $rc_fp32: $(tail -2 "$tmp/fp32.out")"; fi
if [ $rc_q -eq 0 ] && grep -q "^step 1/1 | loss" "$tmp/limited.out"; then pass qlora_trains_in_1gb_address_space
else fail qlora_trains_in_1gb_address_space "exit $rc_q: $(tail -2 "$tmp/limited.out")"; fi
