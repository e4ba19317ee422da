#!/usr/bin/env bash
# test_lora.sh: LoRA through `shardlm train` and `shardlm generate` on a small prepared corpus:
#   * flags and the config's "lora" block (PEFT's words) are one setting: the same run, the same bytes;
#   * a checkpoint is a PEFT adapter directory; resume is bit-for-bit (adapters, optimizer state and
#     losses of 12 steps straight == 6 + resume + 6, with accumulation and dropout; bf16 and fp16 too);
#   * the memory line says the base is frozen; generate --adapter uses the adapters; 2 data-parallel
#     ranks follow one (mpirun, when installed); merge gives the adapted model's logits;
#   * DoRA (use_dora) with dropout resumes bit for bit and merges to the adapted model's logits;
#   * QDoRA (DoRA on an NF4 base) trains and samples;
#   * modules_to_save (copies of wte and the norms) resumes bit for bit at ZeRO 0 and 3; copies of wpe and
#     ln_f merge to the adapted model's logits; a tied head's copy trains and samples (merge refuses a tied
#     model's wte or lm_head copy);
#   * bias "all", lora_bias and trainable_token_indices resume bit for bit, save PEFT's names and merge to
#     the adapted model's logits (merge refuses lora_bias where the base layer has no bias); LoRA on the
#     embedding resumes bit for bit, saves PEFT's names, and merge refuses it on a tied model;
#   * bad input (r = 0, an unknown target module, an unknown bias, bias with DoRA, a corrupt or foreign adapter,
#     an AdamW checkpoint resumed with AdamW8bit, resuming adapters as a full model, merging into an
#     existing directory) exits non-zero with a message naming the problem and writes nothing.
# Prints PASS/FAIL lines for tests/run.sh (lib.sh); skips (exit 0) when "$SHARDLM_BIN" is not built.
. "$(dirname "$0")/lib.sh" lora
prepare_tiny_data || { fail prepare_tiny_data "no $DATA/sotu"; exit 0; }
common=(--data "$tmp/data" --seq-len 32 --batch-size 2 --grad-accum 2 --threads 2 --lr 1e-2 --seed 7
        --eval-interval 6 --eval-batches 2 --sample-tokens 0 --log-interval 6)
lora=(--lora-r 4 --lora-alpha 8 --lora-dropout 0.1 --lora-targets c_attn,c_proj,c_fc)

# straight 12 steps (checkpoints at 6 and 12), then 6 + resume + 6
"$BIN" train --model gpt2-tiny "${common[@]}" "${lora[@]}" --steps 12 --save-interval 6 --save-dir "$tmp/straight" \
  >"$tmp/straight.out" 2>&1
rc1=$?
cut_run "$tmp/straight" "$tmp/split" 6
"$BIN" train --model gpt2-tiny "${common[@]}" "${lora[@]}" --steps 12 --save-dir "$tmp/split" --resume >>"$log" 2>&1
rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]; then pass lora_train_and_resume_run; else fail lora_train_and_resume_run "exit $rc1 $rc2"; fi
a="$tmp/straight/step_00000012"; b="$tmp/split/step_00000012"
if cmp -s "$a/adapter_model.safetensors" "$b/adapter_model.safetensors" &&
   cmp -s "$a/optim_00000_of_00001.safetensors" "$b/optim_00000_of_00001.safetensors"; then
  pass lora_resume_is_bit_for_bit
else
  fail lora_resume_is_bit_for_bit "adapter/optimizer files differ between straight and resumed runs"
fi
grep '"loss"' "$tmp/straight/metrics.jsonl" | sed -n '7,12p' | sed 's/,"tokens_per_s".*//' >"$tmp/l1"
grep '"loss"' "$tmp/split/metrics.jsonl" | sed -n '7,12p' | sed 's/,"tokens_per_s".*//' >"$tmp/l2"
if [ -s "$tmp/l1" ] && cmp -s "$tmp/l1" "$tmp/l2"; then pass lora_resumed_losses_identical; else fail lora_resumed_losses_identical; fi
expect lora_checkpoint_is_a_peft_directory test -f "$a/adapter_config.json" -a ! -e "$a/model.safetensors"
expect lora_adapter_config_in_pefts_words python3 -c "
import json; c = json.load(open('$a/adapter_config.json'))
assert c['peft_type'] == 'LORA' and c['r'] == 4 and c['lora_alpha'] == 8 and c['bias'] == 'none'
assert sorted(c['target_modules']) == ['c_attn', 'c_fc', 'c_proj'] and c['fan_in_fan_out'] is True
"
expect lora_memory_line_says_base_frozen grep -q "base frozen .* (no gradients, no optimizer state); adapters" \
  "$tmp/straight.out"
# the formula printed equals the bytes counted: 4P + (4 + 4 + K)A
expect lora_memory_matches_formula python3 -c "
import re; t = open('$tmp/straight.out').read()
got = int(re.search(r'total [0-9.]+ MB = (\d+) bytes', t).group(1))
P, A, K, f = re.search(r'formula 4P \+ 4A \+ 4A \+ KA with P=(\d+) A=(\d+) S=\d+ W=0 K=(\d+): (\d+) bytes', t).groups()
assert got == int(f) == 4 * int(P) + (8 + int(K)) * int(A), (got, f)
"

# bf16 (bf16 activation storage where the CPU has it) and fp16 (loss scaling): resume is bit-for-bit too
for prec in bf16 fp16; do
  "$BIN" train --model gpt2-tiny "${common[@]}" "${lora[@]}" --precision $prec --steps 4 --save-interval 2 \
    --save-dir "$tmp/$prec" >"$tmp/$prec.out" 2>&1
  mkdir -p "$tmp/$prec-split" && cp -r "$tmp/$prec/step_00000002" "$tmp/$prec-split/" &&
    echo step_00000002 >"$tmp/$prec-split/latest"
  "$BIN" train --model gpt2-tiny "${common[@]}" "${lora[@]}" --precision $prec --steps 4 --save-dir "$tmp/$prec-split" \
    --resume >>"$log" 2>&1
  expect lora_${prec}_resume_is_bit_for_bit cmp "$tmp/$prec/step_00000004/adapter_model.safetensors" \
    "$tmp/$prec-split/step_00000004/adapter_model.safetensors"
done
expect lora_mixed_precision_memory_line grep -q "mixed precision adds: the adapters' fp32 master weights" "$tmp/fp16.out"

# the same run from a DeepSpeed-style config with a "lora" block gives the same bytes
cat >"$tmp/lora.json" <<JSON
{"lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["c_attn", "c_proj", "c_fc"],
          "bias": "none", "use_rslora": false}}
JSON
"$BIN" train --config "$tmp/lora.json" --model gpt2-tiny "${common[@]}" --grad-clip 1 --lr-schedule cosine --steps 6 \
  --save-dir "$tmp/json" >>"$log" 2>&1
"$BIN" train --model gpt2-tiny "${common[@]}" "${lora[@]}" --steps 6 --save-dir "$tmp/flags" >>"$log" 2>&1
expect lora_config_block_equals_flags cmp "$tmp/json/step_00000006/adapter_model.safetensors" \
  "$tmp/flags/step_00000006/adapter_model.safetensors"

# generate with the adapter (a checkpoint) differs from the base alone, and is deterministic
# (the base: a 1-step run at lr 0 is gpt2-tiny's initial weights as a checkpoint)
"$BIN" train --model gpt2-tiny "${common[@]}" --steps 1 --lr 0 --save-dir "$tmp/base" >>"$log" 2>&1
g1=$("$BIN" generate --model "$tmp/base" --adapter "$a" --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0 2>>"$log")
g0=$("$BIN" generate --model "$tmp/base" --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0 2>>"$log")
if [ -n "$g1" ] && [ "$g1" != "$g0" ]; then pass generate_uses_the_adapter; else fail generate_uses_the_adapter "'$g1' vs '$g0'"; fi
# --dtype bf16 (bf16 weights, the base's copy made once) applies the adapter too: its logits move as
# much as fp32's do, and stay within 2% of the largest fp32 logit
for dt in fp32 bf16; do
  "$BIN" generate --model "$tmp/base" --adapter "$a" --prompt-ids 1,2,3 --max-new-tokens 1 --dtype $dt \
    --logits-out "$tmp/la_$dt.json" >>"$log" 2>&1
  "$BIN" generate --model "$tmp/base" --prompt-ids 1,2,3 --max-new-tokens 1 --dtype $dt \
    --logits-out "$tmp/lb_$dt.json" >>"$log" 2>&1
done
expect generate_bf16_uses_the_adapter python3 -c "
import json
def flat(p):
    out = []
    def walk(v):
        if isinstance(v, dict): v = v.get('logits', [])
        if isinstance(v, list): [walk(x) for x in v]
        else: out.append(v)
    walk(json.load(open(p))); return out
a32, b32, a16, b16 = (flat('$tmp/' + n + '.json') for n in ('la_fp32', 'lb_fp32', 'la_bf16', 'lb_bf16'))
d = lambda x, y: max(abs(u - v) for u, v in zip(x, y))
top = max(abs(v) for v in a32)
assert a32 and len(a32) == len(a16) and d(a32, b32) > 1e-3, 'the adapter changes nothing in fp32'
assert d(a16, b16) > 0.5 * d(a32, b32), 'bf16 ignores the adapter'
assert d(a16, a32) < 0.02 * top, 'bf16 with the adapter is far from fp32'
"
# continuing from an adapter directory (--adapter) starts where that run ended
"$BIN" train --model "$tmp/base" --adapter "$a" "${common[@]}" --steps 2 --lr 1e-4 --save-dir "$tmp/cont" >>"$log" 2>&1
expect train_continues_from_an_adapter test -f "$tmp/cont/step_00000002/adapter_model.safetensors"
# the sample after a LoRA run decodes with the trained adapters, also when the run trained in bf16 (the
# sample then decodes on an fp32 host copy of the model, which gets the adapters too): at lr 0 the
# adapters stay $a's, so the bf16 run's sample is the fp32 run's, and not the base's alone
sample_of() { awk '/^sample \(/ { getline; getline; print; exit }' "$1"; }
for prec in fp32 bf16 base; do
  with=(--adapter "$a" --precision "$prec"); [ $prec = base ] && with=()
  "$BIN" train --model "$tmp/base" "${with[@]}" --data "$tmp/data" --seq-len 32 --batch-size 2 --threads 2 --seed 7 \
    --steps 1 --lr 0 --eval-interval 0 --sample-tokens 16 --no-save >"$tmp/sample_$prec.out" 2>&1 ||
    echo "  (exit $? for $prec; $tmp/sample_$prec.out)" >>"$log"
done
s32=$(sample_of "$tmp/sample_fp32.out"); s16=$(sample_of "$tmp/sample_bf16.out"); s0=$(sample_of "$tmp/sample_base.out")
if [ -n "$s32" ] && [ "$s16" = "$s32" ] && [ "$s0" != "$s32" ]; then pass lora_bf16_run_samples_with_its_adapters
else fail lora_bf16_run_samples_with_its_adapters "fp32 '$s32', bf16 '$s16', base '$s0'"; fi

# merge: a full model in the base's dtype whose logits (no adapter) are the adapted model's
# merged_equals_adapted NAME ADAPTER OUT [PYTHON-CHECK] (merge's output in OUT.out, readable as `said`)
merged_equals_adapted() {
  "$BIN" merge --model "$tmp/base" --adapter "$2" --output "$3" >"$3.out" 2>&1
  "$BIN" generate --model "$tmp/base" --adapter "$2" --prompt-ids 1,2,3 --max-new-tokens 1 --temperature 0 \
    --logits-out "$3.adapted.json" >>"$log" 2>&1
  "$BIN" generate --model "$3" --tokenizer "$tmp/data/tokenizer" --prompt-ids 1,2,3 --max-new-tokens 1 \
    --temperature 0 --logits-out "$3.merged.json" >>"$log" 2>&1
  expect "$1" python3 -c "
import json
a = json.load(open('$3.adapted.json'))['logits']; m = json.load(open('$3.merged.json'))['logits']
worst = max(abs(x - y) for ra, rm in zip(a, m) for x, y in zip(ra, rm))
top = max(abs(x) for r in a for x in r)
assert len(a) == len(m) == 3 and worst <= 1e-5 * top, (worst, top)
said = open('$3.out').read()
${4:-}
"
}
merged_equals_adapted merged_model_equals_the_adapted_one "$a" "$tmp/merged"

# split_resume NAME DIR TRAIN-ARGS...: 4 steps straight into DIR (output in DIR.out, checkpoints at 2 and
# 4), then 2 + resume + 2 in DIR-split; NAME passes when both runs' step-4 adapters are the same bytes
split_resume() {
  local name=$1 dir=$2; shift 2
  "$BIN" train "$@" --steps 4 --save-interval 2 --save-dir "$dir" >"$dir.out" 2>&1
  mkdir -p "$dir-split" && cp -r "$dir/step_00000002" "$dir-split/" && echo step_00000002 >"$dir-split/latest"
  "$BIN" train "$@" --steps 4 --save-dir "$dir-split" --resume >>"$log" 2>&1
  expect "$name" cmp "$dir/step_00000004/adapter_model.safetensors" "$dir-split/step_00000004/adapter_model.safetensors"
}

# PEFT's rank_pattern / alpha_pattern / exclude_modules in the config's "lora" block: per-module ranks in
# the memory line, a warning for a key that matches nothing, the patterns back in adapter_config.json,
# resume bit for bit, and merge equal to the adapted model
cat >"$tmp/pattern.json" <<'JSON'
{"lora": {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn", "c_proj", "c_fc"],
          "rank_pattern": {"c_attn": 2, "h\\.1\\.mlp\\.c_proj": 6, "no_such_module": 3},
          "alpha_pattern": {"c_fc": 3}, "exclude_modules": ["transformer.h.0.mlp.c_proj"]}}
JSON
split_resume lora_patterns_resume_is_bit_for_bit "$tmp/pat" --config "$tmp/pattern.json" --model gpt2-tiny \
  "${common[@]}"
expect lora_patterns_memory_line_gives_ranks grep -q "LoRA r=2..6, 7 adapters" "$tmp/pat.out"
expect lora_unmatched_rank_pattern_key_warns grep -q "rank_pattern key 'no_such_module' matches no adapted module" \
  "$tmp/pat.out"
expect lora_patterns_written_back python3 -c "
import json; c = json.load(open('$tmp/pat/step_00000004/adapter_config.json'))
assert list(c['rank_pattern'].items()) == [('c_attn', 2), (r'h\.1\.mlp\.c_proj', 6), ('no_such_module', 3)], c
assert c['alpha_pattern'] == {'c_fc': 3} and c['exclude_modules'] == ['transformer.h.0.mlp.c_proj'], c
"
merged_equals_adapted lora_patterns_merge_equals_adapted "$tmp/pat/step_00000004" "$tmp/pat-merged" \
  "assert 'r=2..6, scale 0.75..4' in said, said"

# DoRA (use_dora) with dropout: resume bit for bit, merge equal to the adapted model (generate's
# decoding reuses the weight norms), the magnitudes saved under PEFT's name
cat >"$tmp/dora.json" <<'JSON'
{"lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "use_dora": true, "target_modules": "all-linear"}}
JSON
split_resume lora_dora_resume_is_bit_for_bit "$tmp/dora" --config "$tmp/dora.json" --model gpt2-tiny "${common[@]}"
expect lora_dora_saves_pefts_magnitudes python3 -c "
import json, struct
f = open('$tmp/dora/step_00000004/adapter_model.safetensors', 'rb'); n = struct.unpack('<Q', f.read(8))[0]
h = json.loads(f.read(n))
m = h['base_model.model.transformer.h.0.mlp.c_fc.lora_magnitude_vector']
assert len(m['shape']) == 1 and json.load(open('$tmp/dora/step_00000004/adapter_config.json'))['use_dora'] is True, m
"
merged_equals_adapted lora_dora_merge_equals_adapted "$tmp/dora/step_00000004" "$tmp/dora-merged"
# QDoRA: DoRA over an NF4 base (norms of the dequantised rows), with its sample after training
"$BIN" train --config "$tmp/dora.json" --model gpt2-tiny "${common[@]}" --quantize nf4 --steps 2 --sample-tokens 4 \
  --save-dir "$tmp/qdora" >"$tmp/qdora.out" 2>&1
expect lora_qdora_trains_and_samples bash -c "test -f '$tmp/qdora/step_00000002/adapter_model.safetensors' &&
  grep -q '^sample (' '$tmp/qdora.out' && grep -q 'QLoRA' '$tmp/qdora.out'"
"$BIN" train --model gpt2-tiny "${common[@]}" --lora-r 4 --lora-alpha 8 --lora-dropout 0.1 --lora-dora \
  --lora-targets all-linear --steps 2 --save-dir "$tmp/dora-flag" >>"$log" 2>&1
expect lora_dora_flag_equals_config cmp "$tmp/dora/step_00000002/adapter_model.safetensors" \
  "$tmp/dora-flag/step_00000002/adapter_model.safetensors"

# modules_to_save: whole copies of wte and every norm of ln_1 trained next to the adapters, with dropout and
# accumulation: resume bit for bit (ZeRO 3 too), the copies in PEFT's names in the checkpoint (wte
# without the vocabulary's padding rows), merge equal to the adapted model, flag == config; a copy of a
# tied model's lm_head trains and samples, and merge refuses it by name
cat >"$tmp/save.json" <<'JSON'
{"lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["c_attn"],
          "modules_to_save": ["wte", "ln_1"]}}
JSON
for z in 0 3; do
  split_resume lora_modules_to_save_resume_is_bit_for_bit_zero$z "$tmp/save$z" --config "$tmp/save.json" \
    --model gpt2-tiny "${common[@]}" --zero-stage $z
done
# without accumulation ZeRO 3 keeps stage 0's bits (with it, stages 2-3 add the micro-steps in another order)
for z in 0 3; do
  "$BIN" train --config "$tmp/save.json" --model gpt2-tiny "${common[@]}" --grad-accum 1 --zero-stage $z --steps 2 \
    --save-dir "$tmp/save$z-noacc" >>"$log" 2>&1
done
expect lora_modules_to_save_zero3_equals_stage0 cmp "$tmp/save0-noacc/step_00000002/adapter_model.safetensors" \
  "$tmp/save3-noacc/step_00000002/adapter_model.safetensors"
expect lora_modules_to_save_in_pefts_names python3 -c "
import json, struct
def header(path):
    f = open(path, 'rb'); return json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
h = header('$tmp/save0/step_00000004/adapter_model.safetensors')
b = header('$tmp/base/step_00000001/model.safetensors')
c = json.load(open('$tmp/save0/step_00000004/adapter_config.json'))
assert h['base_model.model.transformer.wte.weight']['shape'] == b['transformer.wte.weight']['shape'], (h, b)
assert 'base_model.model.transformer.h.1.ln_1.bias' in h and c['modules_to_save'] == ['wte', 'ln_1'], (list(h), c)
"
# copies of wpe and ln_f merge into the model (a tied model's wte or lm_head copy cannot: below)
"$BIN" train --model gpt2-tiny "${common[@]}" --lora-r 4 --lora-targets c_attn --lora-modules-to-save wpe,ln_f \
  --steps 2 --save-dir "$tmp/save-pos" >>"$log" 2>&1
merged_equals_adapted lora_modules_to_save_merge_equals_adapted "$tmp/save-pos/step_00000002" "$tmp/save-merged"
"$BIN" train --model gpt2-tiny "${common[@]}" --lora-r 4 --lora-alpha 8 --lora-dropout 0.1 --lora-targets c_attn \
  --lora-modules-to-save wte,ln_1 --steps 2 --save-dir "$tmp/save-flag" >>"$log" 2>&1
expect lora_modules_to_save_flag_equals_config cmp "$tmp/save0/step_00000002/adapter_model.safetensors" \
  "$tmp/save-flag/step_00000002/adapter_model.safetensors"
"$BIN" train --model gpt2-tiny "${common[@]}" --lora-r 4 --lora-modules-to-save lm_head --steps 2 --sample-tokens 4 \
  --save-dir "$tmp/save-head" >"$tmp/save-head.out" 2>&1
expect lora_tied_head_copy_trains_and_samples bash -c "grep -q '^sample (' '$tmp/save-head.out' &&
  test -f '$tmp/save-head/step_00000002/adapter_model.safetensors'"

# PEFT's bias "all" (every bias trained, the norms' too): resume bit for bit, the biases in PEFT's names
# (an adapted linear's as "base_layer.bias"), merge equal to the adapted model, flag == config
cat >"$tmp/bias.json" <<'JSON'
{"lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["c_attn"], "bias": "all"}}
JSON
split_resume lora_bias_all_resume_is_bit_for_bit "$tmp/bias" --config "$tmp/bias.json" --model gpt2-tiny "${common[@]}"
expect lora_bias_all_in_pefts_names python3 -c "
import json, struct
f = open('$tmp/bias/step_00000004/adapter_model.safetensors', 'rb')
h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
names = [k for k in h if k != '__metadata__']
assert 'base_model.model.transformer.h.0.attn.c_attn.base_layer.bias' in names, names
assert 'base_model.model.transformer.h.1.mlp.c_fc.bias' in names and 'base_model.model.transformer.ln_f.bias' in names
assert json.load(open('$tmp/bias/step_00000004/adapter_config.json'))['bias'] == 'all'
"
merged_equals_adapted lora_bias_all_merge_equals_adapted "$tmp/bias/step_00000004" "$tmp/bias-merged"
"$BIN" train --model gpt2-tiny "${common[@]}" --lora-r 4 --lora-alpha 8 --lora-dropout 0.1 --lora-targets c_attn \
  --lora-bias all --steps 2 --save-dir "$tmp/bias-flag" >>"$log" 2>&1
expect lora_bias_flag_equals_config cmp "$tmp/bias/step_00000002/adapter_model.safetensors" \
  "$tmp/bias-flag/step_00000002/adapter_model.safetensors"

# trainable_token_indices: rows of the (tied) embedding trained whole: resume bit for bit, PEFT's name and
# shape, merge equal to the adapted model (the rows go into the one matrix lookup and head read), flag ==
# config
cat >"$tmp/tokens.json" <<'JSON'
{"lora": {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"], "trainable_token_indices": [5, 300, 17]}}
JSON
split_resume lora_tokens_resume_is_bit_for_bit "$tmp/tok" --config "$tmp/tokens.json" --model gpt2-tiny "${common[@]}"
expect lora_tokens_in_pefts_names python3 -c "
import json, struct
f = open('$tmp/tok/step_00000004/adapter_model.safetensors', 'rb')
h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
assert h['base_model.model.transformer.wte.token_adapter.trainable_tokens_delta']['shape'][0] == 3, h
assert json.load(open('$tmp/tok/step_00000004/adapter_config.json'))['trainable_token_indices'] == [5, 300, 17]
"
merged_equals_adapted lora_tokens_merge_equals_adapted "$tmp/tok/step_00000004" "$tmp/tok-merged"
"$BIN" train --model gpt2-tiny "${common[@]}" --lora-r 4 --lora-alpha 8 --lora-targets c_attn \
  --lora-trainable-tokens 5,300,17 --steps 2 --save-dir "$tmp/tok-flag" >>"$log" 2>&1
expect lora_tokens_flag_equals_config cmp "$tmp/tok/step_00000002/adapter_model.safetensors" \
  "$tmp/tok-flag/step_00000002/adapter_model.safetensors"

# PEFT's lora_bias (--lora-b-bias): a trained bias on every lora_B, with dropout and accumulation: resume bit
# for bit, PEFT's names, merge equal to the adapted model (into GPT-2's base biases), flag == config; merge
# refuses PEFT's own lora_bias adapter for LLaMA (no base bias to merge it into) by name, writing nothing
cat >"$tmp/lorab.json" <<'JSON'
{"lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["c_attn", "c_fc"], "lora_bias": true}}
JSON
split_resume lora_b_bias_resume_is_bit_for_bit "$tmp/lorab" --config "$tmp/lorab.json" --model gpt2-tiny "${common[@]}"
expect lora_b_bias_in_pefts_names python3 -c "
import json, struct
f = open('$tmp/lorab/step_00000004/adapter_model.safetensors', 'rb')
h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
b = h['base_model.model.transformer.h.1.mlp.c_fc.lora_B.bias']
assert b['shape'] == [128] and len([k for k in h if k.endswith('lora_B.bias')]) == 4, h.keys()
assert json.load(open('$tmp/lorab/step_00000004/adapter_config.json'))['lora_bias'] is True
"
merged_equals_adapted lora_b_bias_merge_equals_adapted "$tmp/lorab/step_00000004" "$tmp/lorab-merged"
"$BIN" train --model gpt2-tiny "${common[@]}" --lora-r 4 --lora-alpha 8 --lora-dropout 0.1 --lora-targets c_attn,c_fc \
  --lora-b-bias --steps 2 --save-dir "$tmp/lorab-flag" >>"$log" 2>&1
expect lora_b_bias_flag_equals_config cmp "$tmp/lorab/step_00000002/adapter_model.safetensors" \
  "$tmp/lorab-flag/step_00000002/adapter_model.safetensors"
fixtures=$(cd "$(dirname "$0")/../fixtures" && pwd)
"$BIN" merge --model "$fixtures/model/llama-tiny" --adapter "$fixtures/lora/llama-tiny-lora-bias" \
  --output "$tmp/lorab-llama-merged" >"$tmp/lorab-llama.out" 2>&1
rc=$?
expect lora_b_bias_merge_without_base_bias_is_refused bash -c "[ $rc -ne 0 ] && [ ! -e '$tmp/lorab-llama-merged' ] &&
  grep -q 'model.layers.0.self_attn.q_proj has lora_bias, but its base layer has no bias' '$tmp/lorab-llama.out'"

# LoRA on the embedding (target "wte" / "embed_tokens", PEFT's lora.Embedding): resume bit for bit, PEFT's
# names and shapes, flag == config; merge refuses a tied model's (GPT-2's), and LLaMA's PEFT-made one
# merges to the adapted model's logits (the test's merged_equals_adapted reads a GPT-2 base: compared here)
cat >"$tmp/embed.json" <<'JSON'
{"lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["wte", "c_attn"]}}
JSON
split_resume lora_embedding_resume_is_bit_for_bit "$tmp/emb" --config "$tmp/embed.json" --model gpt2-tiny "${common[@]}"
split_resume lora_embedding_resume_is_bit_for_bit_zero3 "$tmp/emb3" --config "$tmp/embed.json" --model gpt2-tiny \
  "${common[@]}" --zero-stage 3
expect lora_embedding_in_pefts_names python3 -c "
import json, struct
f = open('$tmp/emb/step_00000004/adapter_model.safetensors', 'rb')
h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
a, b = h['base_model.model.transformer.wte.lora_embedding_A'], h['base_model.model.transformer.wte.lora_embedding_B']
assert a['shape'] == [4, 512] and b['shape'] == [32, 4], (a, b)
"
"$BIN" train --model gpt2-tiny "${common[@]}" --lora-r 4 --lora-alpha 8 --lora-dropout 0.1 --lora-targets wte,c_attn \
  --steps 2 --save-dir "$tmp/emb-flag" >>"$log" 2>&1
expect lora_embedding_flag_equals_config cmp "$tmp/emb/step_00000002/adapter_model.safetensors" \
  "$tmp/emb-flag/step_00000002/adapter_model.safetensors"
"$BIN" merge --model "$tmp/base" --adapter "$tmp/emb/step_00000004" --output "$tmp/emb-merged" >"$tmp/emb-merge.out" 2>&1
rc=$?
expect lora_embedding_merge_of_tied_model_is_refused bash -c "[ $rc -ne 0 ] && [ ! -e '$tmp/emb-merged' ] &&
  grep -q 'adapter on transformer.wte cannot be merged on a model whose lm_head is that matrix' '$tmp/emb-merge.out'"
"$BIN" merge --model "$fixtures/model/llama-tiny" --adapter "$fixtures/lora/llama-tiny-embed" \
  --output "$tmp/emb-llama-merged" >"$tmp/emb-llama.out" 2>&1
for m in adapted merged; do
  with=(--model "$fixtures/model/llama-tiny" --adapter "$fixtures/lora/llama-tiny-embed")
  [ $m = merged ] && with=(--model "$tmp/emb-llama-merged")
  "$BIN" generate "${with[@]}" --prompt-ids 1,2,3,9 --max-new-tokens 1 --temperature 0 \
    --logits-out "$tmp/emb-llama.$m.json" >>"$log" 2>&1
done
expect lora_embedding_merge_equals_adapted python3 -c "
import json
a = json.load(open('$tmp/emb-llama.adapted.json'))['logits']; m = json.load(open('$tmp/emb-llama.merged.json'))['logits']
worst = max(abs(x - y) for ra, rm in zip(a, m) for x, y in zip(ra, rm)); top = max(abs(x) for r in a for x in r)
assert len(a) == len(m) == 4 and worst <= 1e-5 * top, (worst, top)
assert 'merged 5 adapters (r=4, scale 1..2)' in open('$tmp/emb-llama.out').read()
"

# an adapter on LLaMA's untied LM head (target "lm_head"): resume bit for bit
split_resume lora_head_resume_is_bit_for_bit "$tmp/head" --model llama-tiny "${common[@]}" --lora-r 4 \
  --lora-targets q_proj,lm_head --lora-dropout 0.1

# --lora-init (init_lora_weights): false starts B random, so the first loss is not the base's (which
# true and gaussian keep: B zero); the mode goes into adapter_config.json
for init in true gaussian false; do
  "$BIN" train --model gpt2-tiny "${common[@]}" --lora-r 4 --lora-init $init --steps 1 --lr 0 --save-dir "$tmp/init-$init" \
    >>"$log" 2>&1
done
expect lora_init_modes_written_and_used python3 -c "
import json
first = lambda m: [json.loads(l)['loss'] for l in open('$tmp/init-' + m + '/metrics.jsonl') if '\"loss\"' in l][0]
mode = lambda m: json.load(open('$tmp/init-' + m + '/step_00000001/adapter_config.json'))['init_lora_weights']
assert (mode('true'), mode('gaussian'), mode('false')) == (True, 'gaussian', False)
assert first('true') == first('gaussian') != first('false'), (first('true'), first('gaussian'), first('false'))
"

# data parallelism: 2 ranks x batch 2 follow 1 rank x batch 4 (fp32 reduction order aside), and their
# checkpoint resumes on 1 rank
if command -v mpirun >/dev/null; then
  root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
  ddp=(train --model gpt2-tiny --data "$tmp/data" --seq-len 32 --steps 8 --seed 3 --lr 1e-2 --no-shuffle --threads 1
       --eval-interval 0 --sample-tokens 0 --log-interval 4 --lora-r 4 --lora-targets all-linear)
  "$BIN" "${ddp[@]}" --batch-size 4 --save-dir "$tmp/w1" >>"$log" 2>&1
  timeout 300 mpirun "${root[@]}" --oversubscribe -np 2 "$BIN" "${ddp[@]}" --batch-size 2 --save-dir "$tmp/w2" >>"$log" 2>&1
  grep '"loss"' "$tmp/w1/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' >"$tmp/dl1"
  grep '"loss"' "$tmp/w2/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' >"$tmp/dl2"
  expect lora_ddp_matches_one_rank bash -c "[ \$(wc -l <'$tmp/dl1') -eq 8 ] && paste '$tmp/dl1' '$tmp/dl2' |
    awk '{ d = \$1 - \$2; if (d < 0) d = -d; if (d > 2e-4 * \$1) bad = 1 } END { exit bad }'"
  "$BIN" "${ddp[@]}" --batch-size 4 --steps 10 --save-dir "$tmp/w2" --resume >>"$log" 2>&1
  expect lora_ddp_checkpoint_resumes_on_one_rank test -f "$tmp/w2/step_00000010/adapter_model.safetensors"
fi

# --- bad input: clear message, non-zero exit, nothing written --------------------------------------
bad() {  # bad NAME EXPECTED-MESSAGE-REGEX ARGS...   (each writes into $tmp/x, which must stay absent)
  local name=$1 re=$2; shift 2
  rm -rf "$tmp/x"
  "$BIN" "$@" >"$tmp/bad.out" 2>&1; local rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -Eq -- "$re" "$tmp/bad.out" && [ ! -e "$tmp/x" ]; then pass "$name"
  else fail "$name" "exit $rc"; tail -3 "$tmp/bad.out"; ls "$tmp/x" 2>/dev/null | head -3; fi
}
run=(train --model gpt2-tiny "${common[@]}" --steps 2 --save-dir "$tmp/x")
bad lora_rank_zero_is_refused "flag --lora-r expects an integer >= 1, got '0'" "${run[@]}" --lora-r 0
echo '{"lora": {"r": 0}}' >"$tmp/r0.json"
bad lora_rank_zero_in_config_is_refused "lora.*\"r\"" "${run[@]}" --config "$tmp/r0.json"
bad unknown_target_module_is_named "target module 'q_proj' matches no linear of this gpt2 model" "${run[@]}" \
  --lora-targets q_proj
echo '{"lora": {"r": 4, "bias": "some"}}' >"$tmp/badbias.json"
bad lora_bias_is_refused "\"bias\" is \"some\"; expected \"none\", \"all\" or \"lora_only\"" "${run[@]}" \
  --config "$tmp/badbias.json"
bad lora_token_past_the_vocabulary_is_refused "trainable_token_indices: token 512 is past the vocabulary" "${run[@]}" \
  --lora-r 4 --lora-trainable-tokens 3,512
bad lora_bias_with_dora_is_refused "\"bias\" \"all\" with use_dora" "${run[@]}" --lora-dora --lora-bias all
bad lora_init_pissa_is_refused "init_lora_weights\" 'pissa'" "${run[@]}" --lora-init pissa
if [ "$(grep -c "init_lora_weights\" 'pissa'" "$tmp/bad.out")" = 1 ]; then pass lora_word_flag_error_printed_once
else fail lora_word_flag_error_printed_once "$(grep -c 'pissa' "$tmp/bad.out") lines"; fi
echo '{"lora": {"r": 4, "target_modules": []}}' >"$tmp/notargets.json"
bad lora_empty_target_list_is_refused "\"target_modules\" is an empty list" "${run[@]}" --config "$tmp/notargets.json"
bad lora_b_bias_with_dora_is_refused "lora_bias with use_dora: PEFT does not support" "${run[@]}" --lora-dora --lora-b-bias
bad lora_embedding_with_dora_is_refused "DoRA \(use_dora\) on the embedding \(transformer.wte\) is not computed" \
  "${run[@]}" --lora-dora --lora-targets wte,c_attn
bad lora_embedding_with_trained_tokens_is_refused "trainable_token_indices with a LoRA adapter on transformer.wte" \
  "${run[@]}" --lora-targets wte --lora-trainable-tokens 3,4
bad lora_modules_to_save_linear_is_refused \
  "modules_to_save 'c_fc' picks transformer.h.0.mlp.c_fc, a linear of a block" \
  "${run[@]}" --lora-r 4 --lora-modules-to-save c_fc
bad lora_tied_embedding_copy_merge_is_refused \
  "merge: the adapter trains a copy of transformer.wte.weight on a model whose head" \
  merge --model "$tmp/base" --adapter "$tmp/save0/step_00000004" --output "$tmp/x"
bad lora_tied_head_copy_merge_is_refused "merge: the adapter trains a copy of lm_head.weight on a model whose head" \
  merge --model "$tmp/base" --adapter "$tmp/save-head/step_00000002" --output "$tmp/x"
bad lora_adamw_checkpoint_resumed_with_adamw8bit_is_refused \
  "checkpoint optimizer \"AdamW\" differs from this run's \"AdamW8bit\"" \
  train --model gpt2-tiny "${common[@]}" "${lora[@]}" --optimizer adamw8bit --steps 14 --save-dir "$tmp/straight" --resume
cp -r "$a" "$tmp/corrupt"
printf 'garbage' | dd of="$tmp/corrupt/adapter_model.safetensors" bs=1 seek=0 conv=notrunc 2>/dev/null
bad corrupt_adapter_is_named "corrupt/adapter_model.safetensors" "${run[@]}" --adapter "$tmp/corrupt"
"$BIN" train --model llama-tiny "${common[@]}" --steps 1 --lora-r 4 --lora-targets q_proj --save-dir "$tmp/llama" \
  >>"$log" 2>&1
# an adapter for another base: LLaMA-tiny's q_proj adapters on llama-demo (another width)
bad foreign_adapter_shapes_are_named "has shape \[4, 32\], this base model needs" train --model llama-demo "${common[@]}" \
  --steps 2 --save-dir "$tmp/x" --adapter "$tmp/llama/step_00000001"
bad foreign_adapter_targets_are_named "matches no linear of this gpt2 model" "${run[@]}" --adapter "$tmp/llama/step_00000001"
bad adapter_resumed_as_full_model_is_refused "holds LoRA adapters, this run trains the whole model" \
  train --model gpt2-tiny "${common[@]}" --steps 14 --save-dir "$tmp/straight" --resume
bad merge_into_an_existing_directory_is_refused "exists already" merge --model "$tmp/base" --adapter "$a" \
  --output "$tmp/merged"
bad merge_with_corrupt_adapter_writes_nothing "corrupt/adapter_model.safetensors" merge --model "$tmp/base" \
  --adapter "$tmp/corrupt" --output "$tmp/x"
bad merge_with_foreign_adapter_writes_nothing "matches no linear of this gpt2 model" merge --model "$tmp/base" \
  --adapter "$tmp/llama/step_00000001" --output "$tmp/x"
bad adapter_named_as_a_model_is_explained "holds a LoRA adapter \(adapter_config.json\), not a model" generate \
  --model "$a" --prompt-ids 1,2
bad generate_with_corrupt_adapter_is_named "adapter_model.safetensors" generate --model "$tmp/base" \
  --adapter "$tmp/corrupt" --prompt-ids 1,2
exit 0
