#!/usr/bin/env bash
# check_hf5_roundtrip.sh: for every fixture of tests/fixtures/hf5 (transformers 5 models with non-default
# config values, each RoPE type, Qwen2, Mistral, 4.x-layout configs): shardlm trains it a few steps on
# random tokens, `shardlm convert` writes the result, and transformers loads that directory; then
#   - every config value transformers reads back equals the fixture's (rope_parameters, head_dim, eps, ...),
#   - every tensor in the file equals the loaded model's (check_hf_load.py --check-weights),
#   - transformers' logits on the trained weights equal shardlm's (generate --logits-out, 1e-4).
# Needs torch + transformers 5 (PYTHON, default python3) and a built build/shardlm; not part of
# `make test`. Run from the repository root:  PYTHON=/path/to/venv/bin/python bash tests/reference/check_hf5_roundtrip.sh
# FIXTURES=DIR takes the fixtures from DIR/*/ (config.json, model.safetensors, expected.json with input_ids).
# With a transformers 4.x on PYTHONPATH, set CONFIG_CHECK=0: 4.x misreads the fixtures' own 5.x-only
# configs, so only the weights and logits of shardlm's files (written in both layouts) are compared.
set -eu
BIN=${SHARDLM_BIN:-build/shardlm}
PY=${PYTHON:-python3}
tmp=$(mktemp -d /tmp/shardlm_hf5rt_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
status=0
for fx in "${FIXTURES:-tests/fixtures/hf5}"/*/; do
  name=$(basename "$fx")
  vocab=$("$PY" -c "import json; print(json.load(open('$fx/config.json'))['vocab_size'])")
  # random tokens in [0, vocab) as llm.c shards (uint16, magic 20240520, version 1)
  "$PY" - "$tmp/data-$name" "$vocab" <<'EOF'
import os, struct, sys, random
out, vocab = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
rng = random.Random(5)
for split, n in (("train", 4096), ("val", 512)):
    toks = [rng.randrange(vocab) for _ in range(n)]
    header = struct.pack("<256i", 20240520, 1, n, *([0] * 253))
    with open(f"{out}/{split}_000000.bin", "wb") as f:
        f.write(header + struct.pack(f"<{n}H", *toks))
EOF
  if ! "$BIN" train --model "$fx" --data "$tmp/data-$name" --seq-len 16 --batch-size 2 --steps 3 --lr 1e-3 \
       --save-dir "$tmp/run-$name" --sample-tokens 0 --eval-interval 0 --log-interval 3 >"$tmp/$name.train" 2>&1; then
    echo "$name: shardlm train FAILED"; tail -3 "$tmp/$name.train"; status=1; continue
  fi
  "$BIN" convert --checkpoint "$tmp/run-$name" --output "$tmp/hf-$name" >/dev/null
  ids=$("$PY" -c "import json; print(','.join(map(str, json.load(open('$fx/expected.json'))['input_ids'])))")
  "$BIN" generate --model "$tmp/hf-$name" --prompt-ids "$ids" --max-new-tokens 1 --temperature 0 \
    --logits-out "$tmp/$name.logits.json" >/dev/null 2>&1
  if "$PY" tests/reference/check_hf_load.py "$tmp/hf-$name" --tokens "$ids" --check-weights \
       --expect "$tmp/$name.logits.json" >"$tmp/$name.out" 2>"$tmp/$name.err"; then r=ok; else r=MISMATCH; status=1; fi
  # the config values transformers reads from shardlm's file against the fixture's
  cfg="config not compared"
  if [ "${CONFIG_CHECK:-1}" = 1 ] && ! cfg=$("$PY" - "$fx" "$tmp/hf-$name" <<'EOF'
import os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
from transformers import AutoConfig
a, b = AutoConfig.from_pretrained(sys.argv[1]), AutoConfig.from_pretrained(sys.argv[2])
keys = ["model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
        "rope_parameters", "sliding_window", "use_sliding_window", "pad_token_id", "hidden_act"]
def value(cfg, k):  # a 4.x file's legacy rope "type" key is the same setting as rope_type
    v = getattr(cfg, k, None)
    return {x: y for x, y in v.items() if x != "type"} if k == "rope_parameters" and isinstance(v, dict) else v
diff = [f"{k}: {value(a, k)!r} vs {value(b, k)!r}" for k in keys if value(a, k) != value(b, k)]
print("config same" if not diff else "config DIFFERS: " + "; ".join(diff))
sys.exit(1 if diff else 0)
EOF
  ); then status=1; fi
  OUT="$tmp/$name.out" NAME="$name" CFG="$cfg" R="$r" "$PY" -c "
import json, os; d = json.load(open(os.environ['OUT']))
print(os.environ['NAME'] + ': weights_match', d['weights_match'], '; max |logit diff| %.2e;' % d['max_abs_diff'],
      os.environ['CFG'], '->', os.environ['R'])"
done
exit $status
