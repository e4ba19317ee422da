#!/usr/bin/env bash
# check_checkpoint_in_transformers.sh: end-to-end proof that a checkpoint written by shardlm is a
# Hugging Face model: trains a few steps of a GPT-2 and a LLaMA model with shardlm, has shardlm write
# the prompt's logits (generate --logits-out), then loads the checkpoint with transformers'
# from_pretrained (check_hf_load.py) and compares weights (exactly) and logits (within 1e-4).
# Then the distributed path: 4 ranks at ZeRO stage 3 save a checkpoint, 2 ranks at stage 1 (same
# global batch: micro 2 x accumulation 2, since shuffling fixes the micro-batch) resume
# from it, and `shardlm convert` (zero_to_fp32) consolidates both checkpoints; transformers loads each.
# Needs torch + transformers (pip) and mpirun; not part of `make test`. Run from the repository root
# after `make`.
set -eu
BIN=${SHARDLM_BIN:-build/shardlm}
DATA=${SHARDLM_DATA:-../shared/data}
tmp=$(mktemp -d /tmp/shardlm_hfcheck_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/corpus"
cp "$DATA"/sotu/179*.txt "$tmp/corpus/"
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/data" --tokenizer "$DATA/gpt2" >/dev/null
status=0
for model in gpt2-demo llama-demo; do
  "$BIN" train --model $model --data "$tmp/data" --seq-len 64 --batch-size 4 --steps 5 --save-dir "$tmp/$model" \
    --sample-tokens 0 --eval-interval 0 --log-interval 5 >/dev/null
  "$BIN" generate --model "$tmp/$model" --prompt "The state of the Union is strong" --max-new-tokens 1 \
    --logits-out "$tmp/$model.json" >/dev/null 2>&1
  ids=$(python3 -c "import json; print(','.join(map(str, json.load(open('$tmp/$model.json'))['input_ids'])))")
  if python3 tests/reference/check_hf_load.py "$tmp/$model/step_00000005" --tokens "$ids" --check-weights \
       --expect "$tmp/$model.json" >"$tmp/$model.out" 2>/dev/null; then r=ok; else r=MISMATCH; status=1; fi
  python3 -c "
import json; d = json.load(open('$tmp/$model.out'))
print('$model: transformers', d['model_type'], d['num_parameters'], 'params; weights_match', d['weights_match'],
      '; max |logit diff|', d['max_abs_diff'], '->', '$r')"
done
check() {  # check NAME CHECKPOINT_DIR: shardlm's logits vs transformers' on the consolidated weights
  local name=$1 dir=$2
  "$BIN" generate --model "$dir" --tokenizer "$tmp/data/tokenizer" --prompt "The state of the Union is strong" --max-new-tokens 1 \
    --logits-out "$tmp/$name.json" >/dev/null 2>&1
  ids=$(python3 -c "import json; print(','.join(map(str, json.load(open('$tmp/$name.json'))['input_ids'])))")
  if python3 tests/reference/check_hf_load.py "$dir" --tokens "$ids" --check-weights --expect "$tmp/$name.json" \
       >"$tmp/$name.out" 2>/dev/null; then r=ok; else r=MISMATCH; status=1; fi
  python3 -c "
import json; d = json.load(open('$tmp/$name.out'))
print('$name: transformers', d['model_type'], d['num_parameters'], 'params; weights_match', d['weights_match'],
      '; max |logit diff|', d['max_abs_diff'], '->', '$r')"
}
root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
dist=(train --model gpt2-demo --data "$tmp/data" --seq-len 64 --steps 6 --save-interval 4 --sample-tokens 0
      --eval-interval 0 --log-interval 2 --threads 1 --save-dir "$tmp/zero")
OMP_NUM_THREADS=1 mpirun "${root[@]}" --oversubscribe -np 4 "$BIN" "${dist[@]}" --batch-size 2 --zero-stage 3 --steps 4 \
  >"$tmp/z3.log" 2>&1
OMP_NUM_THREADS=1 mpirun "${root[@]}" --oversubscribe -np 2 "$BIN" "${dist[@]}" --batch-size 2 --grad-accum 2 --zero-stage 1 --resume \
  >"$tmp/z1.log" 2>&1
grep -h "resumed from" "$tmp/z1.log" || { echo "2-rank stage-1 run did not resume"; status=1; }
"$BIN" convert --checkpoint "$tmp/zero/step_00000004" --output "$tmp/zero3_hf" >/dev/null
"$BIN" convert --checkpoint "$tmp/zero" --output "$tmp/zero1_hf" >/dev/null
check "4 ranks ZeRO-3 step 4, converted" "$tmp/zero3_hf"
check "then 2 ranks ZeRO-1 step 6, converted" "$tmp/zero1_hf"
exit $status
