#!/usr/bin/env bash
# bench/gemm_libs.sh: which fp32 GEMM library trains faster on this CPU, OpenBLAS or oneDNN's sgemm
# (the two that src/ops/cpu/gemm.c can run, SHARDLM_GEMM=openblas|onednn), measured where it matters:
# whole fp32 training steps of build/bench_train, the two libraries interleaved round by round (which one
# goes first alternates), each run a fresh process of GL_WARMUP untimed + GL_STEPS timed steps and then
# GL_PROFILE profiled steps whose per-shape GEMM rates (the profiling ops table's matmul shapes) show
# where the difference comes from. Writes one JSON line per run to bench/gemm_libs_results.jsonl and the
# section between <!-- gemm-libs-section:begin --> and <!-- gemm-libs-section:end --> of bench/RESULTS.md
# (bench/gemm_libs_render.py).
#
# Configurations: GPT-2 124M full training, GPT-2 124M LoRA (r 16 on every linear, base frozen: forward
# and input-gradient GEMMs only) and the LLaMA of bench/finetune.sh (hidden 768, 12 layers, 12 heads,
# intermediate 2048, vocab 32000; random weights from its config.json) with LoRA r 16, each at B=4,
# T=256, GL_THREADS threads.
#
#   bash bench/gemm_libs.sh              # ~10 minutes on 2 cores
#   bash bench/gemm_libs.sh --render     # re-render RESULTS.md from bench/gemm_libs_results.jsonl
#
# Knobs: GL_ROUNDS (3), GL_WARMUP (1), GL_STEPS (4), GL_PROFILE (1), GL_THREADS (2), GL_ONLY (a subset of
# "gpt2-full gpt2-lora llama-lora"), BENCH_OUT / BENCH_RESULTS (a trial run that leaves bench/ alone).
# Tests never run this.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_JSONL=${BENCH_OUT:-bench/gemm_libs_results.jsonl}
RESULTS=${BENCH_RESULTS:-bench/RESULTS.md}
render() { python3 bench/gemm_libs_render.py "$RESULTS" "$OUT_JSONL"; }
if [ "${1:-}" = "--render" ]; then render; exit 0; fi
ROUNDS=${GL_ROUNDS:-3}
WARMUP=${GL_WARMUP:-1}
STEPS=${GL_STEPS:-4}
PROFILE=${GL_PROFILE:-1}
THREADS=${GL_THREADS:-2}
CONFIGS=${GL_ONLY:-gpt2-full gpt2-lora llama-lora}
for v in ROUNDS STEPS PROFILE THREADS; do
    if ! [[ ${!v} =~ ^[0-9]+$ ]] || (( ${!v} < 1 )); then
        echo "gemm_libs.sh: GL_$v must be an integer >= 1, got '${!v}'" >&2
        exit 2
    fi
done
if ! [[ $WARMUP =~ ^[0-9]+$ ]]; then echo "gemm_libs.sh: GL_WARMUP must be an integer >= 0, got '$WARMUP'" >&2; exit 2; fi
for c in $CONFIGS; do
    case $c in gpt2-full|gpt2-lora|llama-lora) ;;
        *) echo "gemm_libs.sh: GL_ONLY: unknown configuration '$c' (expected gpt2-full, gpt2-lora, llama-lora)" >&2; exit 2 ;;
    esac
done

bash bench/build_bench.sh build >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the LLaMA of bench/finetune.sh, as Hugging Face's config.json
cat >"$work/llama.json" <<'EOF'
{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 768, "num_hidden_layers": 12,
 "num_attention_heads": 12, "num_key_value_heads": 12, "intermediate_size": 2048, "vocab_size": 32000,
 "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
 "tie_word_embeddings": false, "torch_dtype": "float32"}
EOF

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD -- src include 2>/dev/null; then commit="$commit+dirty"; fi
python3 - "$commit" "$ROUNDS" "$WARMUP" "$STEPS" "$THREADS" >"$OUT_JSONL.tmp" <<'PYEOF'
import json, sys
sys.path.insert(0, "bench")
from bench_util import machine_record
a = sys.argv[1:]
print(json.dumps(machine_record(a[0], rounds=int(a[1]), warmup=int(a[2]), steps=int(a[3]), threads=int(a[4]))))
PYEOF

for r in $(seq 1 "$ROUNDS"); do
    if (( r % 2 )); then libs="openblas onednn"; else libs="onednn openblas"; fi
    for c in $CONFIGS; do
        case $c in
            gpt2-full) model=gpt2; extra=() ;;
            gpt2-lora) model=gpt2; extra=(--lora-r 16) ;;
            llama-lora) model=$work/llama.json; extra=(--lora-r 16) ;;
        esac
        for lib in $libs; do
            echo "[gemm_libs.sh] round $r $c $lib" >&2
            line=$(SHARDLM_GEMM=$lib OMP_NUM_THREADS=$THREADS build/bench_train --model "$model" --batch 4 --seq 256 \
                   --threads "$THREADS" --warmup "$WARMUP" --steps "$STEPS" --profile-steps "$PROFILE" "${extra[@]}" \
                   2>>"$work/bench.log" | tail -1)
            python3 -c 'import json, sys
d = json.loads(sys.argv[1])
keep = ("ms_per_step", "ms_per_step_median", "ms_per_step_min", "tokens_per_s", "gemm", "other_load",
        "profiled_ms_per_step", "breakdown", "matmul_shapes")
print(json.dumps(dict({"config": sys.argv[2], "lib": sys.argv[3], "round": int(sys.argv[4])},
                      **{k: d[k] for k in keep if k in d})))' "$line" "$c" "$lib" "$r" >>"$OUT_JSONL.tmp"
        done
    done
done
mv "$OUT_JSONL.tmp" "$OUT_JSONL"
render
