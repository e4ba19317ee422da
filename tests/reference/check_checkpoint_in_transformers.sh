#!/usr/bin/env bash
# check_checkpoint_in_transformers.sh: end-to-end proof that a checkpoint written by shardlm is a
# Hugging Face model: trains a few steps of a GPT-2 and a LLaMA model with shardlm, has shardlm write
# the prompt's logits (generate --logits-out), then loads the checkpoint with transformers'
# from_pretrained (check_hf_load.py) and compares weights (exactly) and logits (within 1e-4).
# Needs torch + transformers (pip); not part of `make test`. Run from the repository root after `make`.
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
exit $status
