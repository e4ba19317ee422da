#!/usr/bin/env bash
# test_qlora.sh: QLoRA through `shardlm train --quantize` and `shardlm generate --quantize --adapter`:
#   * 12 steps straight == 6 + resume + 6 on an NF4 base (adapters, optimizer state, losses: bit for
#     bit), with gradient accumulation and dropout; checkpoints are PEFT adapter directories;
#   * the memory line gives the quantised base's bytes and equals the formula 4P + Q + (4 + 4 + K)A;
#   * int8 bases and the JSON config's BitsAndBytesConfig words train the same way; 2 data-parallel
#     ranks follow one (mpirun, when installed);
#   * generate with a PEFT + bitsandbytes adapter on the quantised base gives PEFT + bitsandbytes'
#     logits (tests/fixtures/qlora, within 1e-5 of the largest); with --dtype bf16 within 2e-2 of fp32's;
#   * --precision bf16 (bnb_4bit_compute_dtype bfloat16): 4 steps == 2 + resume + 2 bit for bit, the
#     memory line equals the formula, config words equal flags, the emulation runs where the CPU has no
#     bf16 instructions (simulated with SHARDLM_CPU_BF16=0) and follows the oneDNN run within 1e-2;
#   * bad input (no adapters, fp16, compute dtype bfloat16 without bf16 training, a GPU device, NF4
#     on a partial block, resuming QLoRA adapters on a full-precision base) is refused by name.
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
memory_line_matches() {  # memory_line_matches NAME RUN-OUTPUT
  local line formula total est
  line=$(grep '^memory per rank (QLoRA' "$2"); formula=$(grep '^  formula 4P + Q' "$2")
  total=$(sed -n 's/.* = \([0-9]*\) bytes$/\1/p' <<<"$line"); est=$(sed -n 's/.*weights): \([0-9]*\) bytes;.*/\1/p' <<<"$formula")
  if grep -q "base frozen nf4 linears" <<<"$line" && [ -n "$total" ] && [ "$total" = "$est" ]; then pass "$1"
  else fail "$1" "'$line' / '$formula'"; fi
}
memory_line_matches qlora_memory_line_matches_formula "$tmp/straight.out"

# bf16 (bnb_4bit_compute_dtype bfloat16): bf16 storage, the quantised linears on bf16 tiles; 4 steps straight
# equal 2 + resume + 2 bit for bit; the config's "bfloat16" with bf16 enabled gives the flags' bytes; on a
# CPU without bf16 instructions (simulated) the emulation runs, with its notice, to the same losses within
# bf16 rounding (1e-2 relative)
b16=(--precision bf16 --steps 4 --save-interval 2 --eval-interval 2 --log-interval 1)
"$BIN" train --model gpt2-tiny "${common[@]}" "${qlora[@]}" "${b16[@]}" --save-dir "$tmp/b16" >"$tmp/b16.out" 2>&1
rc1=$?
cut_run "$tmp/b16" "$tmp/b16split" 2
"$BIN" train --model gpt2-tiny "${common[@]}" "${qlora[@]}" "${b16[@]}" --save-dir "$tmp/b16split" --resume >>"$log" 2>&1
rc2=$?
a="$tmp/b16/step_00000004"; b="$tmp/b16split/step_00000004"
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q 'ops cpu-bf16' "$tmp/b16.out" &&
   cmp -s "$a/adapter_model.safetensors" "$b/adapter_model.safetensors" &&
   cmp -s "$a/optim_00000_of_00001.safetensors" "$b/optim_00000_of_00001.safetensors" &&
   cmp -s <(grep '"loss"' "$tmp/b16/metrics.jsonl" | sed 's/"elapsed_s":[^,}]*//; s/"tokens_per_s":[^,}]*//') \
          <(grep '"loss"' "$tmp/b16split/metrics.jsonl" | sed 's/"elapsed_s":[^,}]*//; s/"tokens_per_s":[^,}]*//'); then
  pass qlora_bf16_resume_is_bit_for_bit
else fail qlora_bf16_resume_is_bit_for_bit "exit $rc1 $rc2: $(grep -m1 error "$tmp/b16.out")"; fi
memory_line_matches qlora_bf16_memory_line_matches_formula "$tmp/b16.out"
expect qlora_bf16_saves_compute_dtype grep -q '"bnb_4bit_compute_dtype":[[:space:]]*"bfloat16"' "$a/trainer_state.json"
cat >"$tmp/q16on.json" <<'JSON'
{"quantization_config": {"load_in_4bit": true, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true,
                         "bnb_4bit_compute_dtype": "bfloat16"},
 "bf16": {"enabled": true},
 "lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["c_attn", "c_proj", "c_fc"]}}
JSON
"$BIN" train --config "$tmp/q16on.json" --model gpt2-tiny "${common[@]}" --steps 4 --save-interval 2 --eval-interval 2 \
  --log-interval 1 --save-dir "$tmp/b16json" >>"$log" 2>&1
expect qlora_bf16_config_words_equal_flags cmp "$tmp/b16json/step_00000004/adapter_model.safetensors" \
  "$a/adapter_model.safetensors"
SHARDLM_CPU_BF16=0 "$BIN" train --model gpt2-tiny "${common[@]}" "${qlora[@]}" "${b16[@]}" --save-dir "$tmp/b16emu" \
  >"$tmp/b16emu.out" 2>&1
grep '"loss"' "$tmp/b16/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' >"$tmp/l16"
grep '"loss"' "$tmp/b16emu/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' >"$tmp/l16emu"
expect qlora_bf16_without_bf16_instructions_runs_the_emulation bash -c "
  grep -q 'running the bf16-storage emulation instead' '$tmp/b16emu.out' && grep -q 'ops cpu-bf16+quant' '$tmp/b16emu.out' &&
  [ \$(wc -l <'$tmp/l16') -eq 4 ] && paste '$tmp/l16' '$tmp/l16emu' |
  awk '{ d = \$1 - \$2; if (d < 0) d = -d; if (d > 1e-2 * \$1) bad = 1 } END { exit bad }'"

# int8 base, and the JSON config's BitsAndBytesConfig words instead of the flag
"$BIN" train --model llama-tiny --data "$tmp/data" --seq-len 32 --batch-size 2 --threads 2 --steps 3 --eval-interval 0 \
  --sample-tokens 4 --quantize int8 --lora-r 4 --lora-targets all-linear --save-dir "$tmp/int8" >"$tmp/int8.out" 2>&1
expect qlora_int8_base_trains grep -q "base frozen int8 linears" "$tmp/int8.out"
for q in int8 fp4; do   # the other bases take the same bf16 path
  "$BIN" train --model llama-tiny --data "$tmp/data" --seq-len 32 --batch-size 2 --threads 2 --steps 2 --eval-interval 0 \
    --sample-tokens 0 --quantize $q --precision bf16 --lora-r 4 --lora-targets all-linear --save-dir "$tmp/$q-bf16" \
    >"$tmp/$q-bf16.out" 2>&1
  expect "qlora_${q}_base_trains_in_bf16" bash -c "grep -q 'base frozen $q linears' '$tmp/$q-bf16.out' &&
    grep -q 'ops cpu-bf16.*+quant' '$tmp/$q-bf16.out' && [ \$(grep -c '\"loss\"' '$tmp/$q-bf16/metrics.jsonl') -eq 2 ]"
done
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

# generate --dtype bf16 on the quantised base (bf16 tiles) with the adapter: within 2e-2 of the largest fp32
# logit, as bf16 generation with an adapter on a full-precision base (docs/finetune.md)
"$BIN" generate --model tests/fixtures/quant/llama_fp32 --quantize nf4 --adapter "$FQ" --prompt-ids "$ids" \
  --max-new-tokens 1 --temperature 0 --dtype bf16 --logits-out "$tmp/logits16.json" >>"$log" 2>&1
expect qlora_generate_bf16_tracks_fp32 python3 - "$tmp/logits.json" "$tmp/logits16.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["logits"] for p in sys.argv[1:3])
worst = max(abs(x - y) for r, s in zip(a, b) for x, y in zip(r, s)) / max(abs(x) for r in a for x in r)
print("bf16 against fp32 logits", worst)
assert len(a) == len(b) and worst < 2e-2, worst
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
bad qlora_with_fp16_refused '--precision fp16 with a quantised (nf4) base is not supported' \
  "${base[@]}" --lora-r 4 --precision fp16
printf '{"quantization_config": {"load_in_4bit": true, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "bfloat16"}}\n' \
  >"$tmp/q16.json"
bad qlora_bf16_compute_without_bf16_refused 'bnb_4bit_compute_dtype "bfloat16" with a quantised (nf4) base computes in bf16: it needs --precision bf16' \
  train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --steps 1 --lora-r 4 --config "$tmp/q16.json"
bad qlora_on_gpu_refused '--device cuda with a quantised (nf4) base is not supported' \
  "${base[@]}" --lora-r 4 --device cuda
printf '{"n_embd": 36, "n_layer": 1, "n_head": 4, "vocab_size": 512, "n_positions": 64, "model_type": "gpt2"}\n' \
  >"$tmp/odd.json"
bad qlora_partial_block_refused 'not a multiple of the block size 64' \
  train --model "$tmp/odd.json" --data "$tmp/data" --seq-len 32 --steps 1 --quantize nf4 --lora-r 4
bad qlora_resumed_on_another_base_refused 'checkpoint was trained on a nf4 (blocks of 64, double-quantised scales) base, this run'"'"'s base is full-precision' \
  train --model gpt2-tiny "${common[@]}" --lora-r 4 --lora-alpha 8 --lora-dropout 0.1 --lora-targets c_attn,c_proj,c_fc \
  --steps 13 --resume "$tmp/straight"
