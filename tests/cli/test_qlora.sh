#!/usr/bin/env bash
# test_qlora.sh: QLoRA through `shardlm train --quantize` and `shardlm generate --quantize --adapter`:
#   * 12 steps straight == 6 + resume + 6 on an NF4 base (adapters, optimizer state, losses: bit for
#     bit), with gradient accumulation and dropout; checkpoints are PEFT adapter directories;
#   * the memory line gives the quantised base's bytes and equals the formula 4P + Q + (4 + 4 + K)A;
#   * int8 bases and the JSON config's BitsAndBytesConfig words train the same way; 2 data-parallel
#     ranks follow one (mpirun, when installed);
#   * generate with a PEFT + bitsandbytes adapter on the quantised base gives PEFT + bitsandbytes'
#     logits (tests/fixtures/qlora, within 1e-5 of the largest);
#   * bad input (no adapters, ZeRO, bf16, a GPU device, NF4 on a partial block, resuming QLoRA adapters
#     on a full-precision base) is refused by name.
# Prints PASS/FAIL lines for tests/run.sh (lib.sh); skips (exit 0) when "$SHARDLM_BIN" is not built.
. "$(dirname "$0")/lib.sh" qlora
prepare_tiny_data || { fail prepare_tiny_data "no $DATA/sotu"; exit 0; }
common=(--data "$tmp/data" --seq-len 32 --batch-size 2 --grad-accum 2 --threads 2 --lr 1e-2 --seed 7
        --eval-interval 6 --eval-batches 2 --sample-tokens 0 --log-interval 6)
qlora=(--quantize nf4 --lora-r 4 --lora-alpha 8 --lora-dropout 0.1 --lora-targets c_attn,c_proj,c_fc)

"$BIN" train --model gpt2-tiny "${common[@]}" "${qlora[@]}" --steps 12 --save-interval 6 --save-dir "$tmp/straight" \
  >"$tmp/straight.out" 2>&1
rc1=$?
cut_run "$tmp/straight" "$tmp/split" 6
"$BIN" train --model gpt2-tiny "${common[@]}" "${qlora[@]}" --steps 12 --save-dir "$tmp/split" --resume >>"$log" 2>&1
rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]; then pass qlora_train_and_resume_run; else fail qlora_train_and_resume_run "exit $rc1 $rc2"; cat "$tmp/straight.out" | tail -5; fi
a="$tmp/straight/step_00000012"; b="$tmp/split/step_00000012"
if cmp -s "$a/adapter_model.safetensors" "$b/adapter_model.safetensors" &&
   cmp -s "$a/optim_00000_of_00001.safetensors" "$b/optim_00000_of_00001.safetensors" &&
   cmp -s <(grep '"loss"' "$tmp/straight/metrics.jsonl" | sed 's/"elapsed_s":[^,}]*//; s/"tokens_per_s":[^,}]*//') \
          <(grep '"loss"' "$tmp/split/metrics.jsonl" | sed 's/"elapsed_s":[^,}]*//; s/"tokens_per_s":[^,}]*//'); then
  pass qlora_resume_is_bit_for_bit
else fail qlora_resume_is_bit_for_bit; fi
expect qlora_checkpoint_is_a_peft_adapter grep -Eq '"peft_type":[[:space:]]*"LORA"' "$a/adapter_config.json"

# the memory line: QLoRA, the quantised bytes, and the formula's sum equal to the total allocated
line=$(grep '^memory per rank (QLoRA' "$tmp/straight.out"); formula=$(grep '^  formula 4P + Q' "$tmp/straight.out")
total=$(sed -n 's/.* = \([0-9]*\) bytes$/\1/p' <<<"$line"); est=$(sed -n 's/.*weights): \([0-9]*\) bytes;.*/\1/p' <<<"$formula")
if grep -q "base frozen nf4 linears" <<<"$line" && [ -n "$total" ] && [ "$total" = "$est" ]; then
  pass qlora_memory_line_matches_formula
else fail qlora_memory_line_matches_formula "'$line' / '$formula'"; fi

# int8 base, and the JSON config's BitsAndBytesConfig words instead of the flag
"$BIN" train --model llama-tiny --data "$tmp/data" --seq-len 32 --batch-size 2 --threads 2 --steps 3 --eval-interval 0 \
  --sample-tokens 4 --quantize int8 --lora-r 4 --lora-targets all-linear --save-dir "$tmp/int8" >"$tmp/int8.out" 2>&1
expect qlora_int8_base_trains grep -q "base frozen int8 linears" "$tmp/int8.out"
cat >"$tmp/q.json" <<'JSON'
{"quantization_config": {"load_in_4bit": true, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true,
                         "bnb_4bit_compute_dtype": "float32"},
 "lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["c_attn", "c_proj", "c_fc"]}}
JSON
"$BIN" train --config "$tmp/q.json" --model gpt2-tiny "${common[@]}" --steps 12 --save-dir "$tmp/json" >>"$log" 2>&1
expect qlora_config_words_equal_flags cmp "$tmp/json/step_00000012/adapter_model.safetensors" \
  "$tmp/straight/step_00000012/adapter_model.safetensors"

if command -v mpirun >/dev/null; then
  root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
  ddp=(train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --steps 6 --seed 3 --lr 1e-2 --no-shuffle --threads 1
       --eval-interval 0 --sample-tokens 0 --log-interval 3 --quantize nf4 --lora-r 4 --lora-targets all-linear)
  "$BIN" "${ddp[@]}" --batch-size 4 --save-dir "$tmp/w1" >>"$log" 2>&1
  timeout 300 mpirun "${root[@]}" --oversubscribe -np 2 "$BIN" "${ddp[@]}" --batch-size 2 --save-dir "$tmp/w2" >>"$log" 2>&1
  grep '"loss"' "$tmp/w1/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' >"$tmp/dl1"
  grep '"loss"' "$tmp/w2/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' >"$tmp/dl2"
  expect qlora_ddp_two_ranks_follow_one bash -c "[ \$(wc -l <'$tmp/dl1') -eq 6 ] && paste '$tmp/dl1' '$tmp/dl2' |
    awk '{ d = \$1 - \$2; if (d < 0) d = -d; if (d > 2e-4 * \$1) bad = 1 } END { exit bad }'"
fi

# generate: PEFT + bitsandbytes' adapter on the NF4 base (quantised on load) gives its logits
FQ=tests/fixtures/qlora/llama-nf4-dq
ids=$(python3 - "$FQ/expected.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
a, b = h["input_ids"]["data_offsets"]; T = h["input_ids"]["shape"][1]
print(",".join(str(int(v)) for v in struct.unpack("<%df" % T, raw[8 + n + a:8 + n + a + 4 * T])))
PY
)
"$BIN" generate --model tests/fixtures/quant/llama_fp32 --quantize nf4 --adapter "$FQ" --prompt-ids "$ids" \
  --max-new-tokens 1 --temperature 0 --logits-out "$tmp/logits.json" >>"$log" 2>&1
expect qlora_generate_matches_peft_bnb_logits python3 - "$FQ/expected.safetensors" "$tmp/logits.json" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
mine = json.load(open(sys.argv[2]))["logits"]
T, V = len(mine), len(mine[0])
for key in ("logits", "bnb.logits"):
    a, _ = h[key]["data_offsets"]
    want = struct.unpack("<%df" % (T * V), raw[8 + n + a:8 + n + a + 4 * T * V])   # row 0 of the batch
    worst = max(abs(mine[t][v] - want[t * V + v]) for t in range(T) for v in range(V)) / max(map(abs, want))
    print(key, "relative error", worst)
    assert worst < 1e-5, (key, worst)
PY

# bad input: refused by name, nothing written
bad() {  # bad NAME EXPECTED-MESSAGE ARGS...
  local name=$1 msg=$2; shift 2
  "$BIN" "$@" --save-dir "$tmp/out-$name" >"$tmp/$name.out" 2>&1; local rc=$?
  if [ $rc -ne 0 ] && grep -qF -- "$msg" "$tmp/$name.out" && [ ! -e "$tmp/out-$name" ]; then pass "$name"
  else fail "$name" "exit $rc: $(head -3 "$tmp/$name.out")"; fi
}
base=(train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --steps 1 --quantize nf4)
bad qlora_without_adapters_refused 'are frozen: they train only under LoRA adapters' "${base[@]}"
bad qlora_with_zero_refused 'zero_optimization.stage 2 with a quantised (nf4) base is not supported' \
  "${base[@]}" --lora-r 4 --zero-stage 2
bad qlora_with_bf16_refused '--precision bf16 with a quantised (nf4) base is not supported' \
  "${base[@]}" --lora-r 4 --precision bf16
bad qlora_on_gpu_refused '--device cuda with a quantised (nf4) base is not supported' \
  "${base[@]}" --lora-r 4 --device cuda
printf '{"n_embd": 36, "n_layer": 1, "n_head": 4, "vocab_size": 512, "n_positions": 64, "model_type": "gpt2"}\n' \
  >"$tmp/odd.json"
bad qlora_partial_block_refused 'not a multiple of the block size 64' \
  train --model "$tmp/odd.json" --data "$tmp/data" --seq-len 32 --steps 1 --quantize nf4 --lora-r 4
bad qlora_resumed_on_another_base_refused 'checkpoint was trained on a nf4 (blocks of 64, double-quantised scales) base, this run'"'"'s base is full-precision' \
  train --model gpt2-tiny "${common[@]}" --lora-r 4 --lora-alpha 8 --lora-dropout 0.1 --lora-targets c_attn,c_proj,c_fc \
  --steps 13 --resume "$tmp/straight"
