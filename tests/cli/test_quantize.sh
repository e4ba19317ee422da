#!/usr/bin/env bash
# test_quantize.sh: `shardlm quantize` and `shardlm generate` on bitsandbytes 4-bit / 8-bit models
# (tests/fixtures/quant, from tests/reference/make_quant_model_fixtures.py): the directory we write
# generates what transformers' own file generates, quantising on load agrees with both, and bad flags
# or a damaged source give a clear error with nothing written.
. "$(dirname "$0")/lib.sh" quantize
FX=tests/fixtures/quant
gen() { "$BIN" generate --model "$@" --prompt-ids 1,5,9,20,33 --max-new-tokens 12 --temperature 0 2>"$tmp/gen.err"; }

if "$BIN" quantize --model $FX/llama_fp32 --quantize nf4 --output "$tmp/nf4" >"$tmp/q.out" 2>&1 &&
   grep -q "linears as nf4 (blocks of 64, double-quantised scales)" "$tmp/q.out" &&
   [ -f "$tmp/nf4/model.safetensors" ] && grep -Eq '"bnb_4bit_use_double_quant":[[:space:]]*true' "$tmp/nf4/config.json"; then
  pass quantize_writes_a_bitsandbytes_directory
else fail quantize_writes_a_bitsandbytes_directory "$(cat "$tmp/q.out")"; fi

ours=$(gen "$tmp/nf4"); theirs=$(gen $FX/llama_nf4); onload=$(gen $FX/llama_fp32 --quantize nf4)
if [ -n "$ours" ] && [ "$ours" = "$theirs" ] && [ "$ours" = "$onload" ] && grep -q "quantised linears: nf4" "$tmp/gen.err"; then
  pass generate_reads_our_and_transformers_nf4_files_alike
else fail generate_reads_our_and_transformers_nf4_files_alike "ours '$ours' transformers' '$theirs' on load '$onload'"; fi

"$BIN" quantize --model $FX/llama_fp32 --quantize int8 --output "$tmp/int8" >/dev/null 2>&1
ours=$(gen "$tmp/int8"); theirs=$(gen $FX/llama_int8)
if [ -n "$ours" ] && [ "$ours" = "$theirs" ]; then pass int8_directory_generates_as_transformers_file
else fail int8_directory_generates_as_transformers_file "ours '$ours' transformers' '$theirs'"; fi

# bad input: each exits non-zero with the message, and the output directory never appears
bad() {  # name, expected message, args...
  local name=$1 msg=$2; shift 2
  "$BIN" "$@" >"$tmp/$name.out" 2>&1; local rc=$?
  if [ $rc -ne 0 ] && grep -qF -- "$msg" "$tmp/$name.out" && [ ! -e "$tmp/out-$name" ]; then pass "$name"
  else fail "$name" "exit $rc: $(head -3 "$tmp/$name.out")"; fi
}
bad unknown_quant_type_refused '--quantize: unknown quantisation type "nf3" (expected nf4, fp4, int8 or none)' \
  quantize --model $FX/llama_fp32 --quantize nf3 --output "$tmp/out-unknown_quant_type_refused"
bad generate_unknown_quant_type_refused 'unknown quantisation type "q4"' generate --model $FX/llama_fp32 --quantize q4
bad requantising_refused 'is already quantised as nf4: --quantize int8 cannot change that' \
  quantize --model $FX/llama_nf4 --quantize int8 --output "$tmp/out-requantising_refused"
mkdir -p "$tmp/damaged" && cp $FX/llama_nf4/config.json "$tmp/damaged/" &&
  head -c 20000 $FX/llama_nf4/model.safetensors >"$tmp/damaged/model.safetensors"
bad damaged_source_refused "$tmp/damaged/model.safetensors" \
  quantize --model "$tmp/damaged" --quantize nf4 --output "$tmp/out-damaged_source_refused"
sed 's/"bnb_4bit_quant_type": "nf4"/"bnb_4bit_quant_type": "nf5"/' $FX/llama_nf4/config.json >"$tmp/damaged/config.json"
cp $FX/llama_nf4/model.safetensors "$tmp/damaged/"
bad unknown_quant_type_in_config_refused 'quantization_config: bnb_4bit_quant_type "nf5" is unknown' \
  generate --model "$tmp/damaged" --prompt-ids 1
bad training_a_quantised_base_refused 'nf4 base weights (--quantize / quantization_config) are frozen: they train only under LoRA' \
  train --model $FX/llama_nf4 --data "$tmp/no-data" --seq-len 16 --batch-size 1 --steps 1 \
  --save-dir "$tmp/out-training_a_quantised_base_refused"
echo '{"quantization_config": {"load_in_4bit": true, "bnb_4bit_quant_type": "nf4"}}' >"$tmp/qlora.json"
bad train_on_a_quantised_base_needs_lora 'nf4 base weights (--quantize / quantization_config) are frozen' \
  train --config "$tmp/qlora.json" --save-dir "$tmp/out-train_on_a_quantised_base_needs_lora"
echo '{"quantization_config": {"load_in_4bit": true, "load_in_8bit": true}}' >"$tmp/both.json"
bad train_config_with_4_and_8_bits_refused 'quantization_config: load_in_4bit and load_in_8bit are both true' \
  train --config "$tmp/both.json" --save-dir "$tmp/out-train_config_with_4_and_8_bits_refused"
