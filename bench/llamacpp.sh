#!/usr/bin/env bash
# bench/llamacpp.sh: generation speed at batch 1, shardlm against llama.cpp on this CPU, side by side
# in one run, into bench/llamacpp_results.jsonl and the llama.cpp section of bench/RESULTS.md.
#
# What it does (each step skipped when its output is already in $LLAMA_WORK, so a rerun only measures):
#   1. builds shardlm's benchmarks (bench/build_bench.sh);
#   2. downloads the llama-cpp-python sdist from PyPI (`pip download --no-binary :all: --no-deps`),
#      which vendors llama.cpp, and builds its llama-bench with cmake, CPU only (GGML_NATIVE);
#   3. makes the models ($MODELS: gpt2, GPT-2 124M; llama, a LLaMA of its size with GQA) that shardlm
#      saves: one training step on a few State of the Union addresses (`shardlm prepare`, `train --steps
#      1`), `shardlm convert` to a Hugging Face directory, plus the GPT-2 tokenizer files (speed does not
#      depend on the weights' values);
#   4. converts each with llama.cpp's convert_hf_to_gguf.py to f32, f16 and bf16 GGUF, in a temporary venv
#      over $PYTHON (an interpreter with torch, numpy and transformers; default python3), which sees $PYTHON's packages and gets the sdist's gguf-py; what
#      is still missing is pip-installed into that venv;
#   5. measures, BENCH_ROUNDS times, each side back to back: llama-bench pp$PROMPT (prefill) and
#      tg$GEN at depth $PROMPT (decode after a $PROMPT-token prompt, as shardlm's decode runs), then
#      shardlm's bench_decode (prefill $PROMPT tokens, decode $GEN, --repeats $SHARDLM_REPS; the first
#      round also profiles the decode steps) on the model's Hugging Face directory at the same precision:
#      f32 against shardlm fp32, f16 and bf16 against shardlm bf16, for every model of $MODELS.
#      Threads: $THREADS for both; llama-bench -r $LLAMA_REPS.
#   6. writes bench/llamacpp_results_t$THREADS.jsonl and renders the medians and the ratios of every
#      such file (bench/llamacpp_render.py), one subsection per thread count, into RESULTS.md between
#      <!-- llamacpp-section:begin --> and <!-- llamacpp-section:end -->.
#
#   bash bench/llamacpp.sh                      # everything (first run: ~15 min on 2 cores, most of it
#                                               # building llama.cpp)
#   BENCH_ROUNDS=5 THREADS=1 bash bench/llamacpp.sh
#   MODELS=llama BENCH_ROUNDS=1 THREADS=1 BENCH_OUT=/tmp/t.jsonl BENCH_RESULTS=/tmp/R.md bash bench/llamacpp.sh
#   bash bench/llamacpp.sh --render             # re-render RESULTS.md from bench/llamacpp_results_t*.jsonl
#
# Tests never run this; it needs the network (PyPI) the first time, and a Python with torch.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=${LLAMA_WORK:-/tmp/shardlm_llamacpp}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-128}
GEN=${GEN:-64}
ROUNDS=${BENCH_ROUNDS:-3}
LLAMA_REPS=${LLAMA_REPS:-2}      # llama-bench -r: measured repetitions per call (after its warmup)
SHARDLM_REPS=${SHARDLM_REPS:-2}  # bench_decode --repeats: measured runs per call (after its warmup)
OUT_JSONL=${BENCH_OUT:-bench/llamacpp_results_t$THREADS.jsonl}
RESULTS=${BENCH_RESULTS:-bench/RESULTS.md}
PYTHON=${PYTHON:-python3}
MODELS=${MODELS:-gpt2 llama}     # which of the models below to measure

# every thread count measured so far (one JSONL each), or just this run's with BENCH_OUT
render() {
    if [ -n "${BENCH_OUT:-}" ]; then python3 bench/llamacpp_render.py "$RESULTS" "$OUT_JSONL"
    else python3 bench/llamacpp_render.py "$RESULTS" bench/llamacpp_results_t*.jsonl; fi
}
if [ "${1:-}" = "--render" ]; then render; exit 0; fi

mkdir -p "$WORK"
log() { echo "[llamacpp.sh] $*" >&2; }

# 1. shardlm
bash bench/build_bench.sh build

# 2. llama.cpp from the llama-cpp-python sdist
if [ ! -x "$WORK/build/bin/llama-bench" ]; then
    if ! ls "$WORK"/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
        log "downloading the llama-cpp-python sdist"
        "$PYTHON" -m pip download --no-binary :all: --no-deps llama-cpp-python -d "$WORK" >&2
    fi
    tar xzf "$WORK"/llama_cpp_python-*.tar.gz -C "$WORK"
    SRC=$(ls -d "$WORK"/llama_cpp_python-*/vendor/llama.cpp | head -1)
    log "building llama-bench from $SRC (CPU only)"
    cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >&2
    cmake --build "$WORK/build" --target llama-bench -j"${MAKE_JOBS:-2}" >&2
fi
SRC=$(ls -d "$WORK"/llama_cpp_python-*/vendor/llama.cpp | head -1)
LLAMA_VERSION=$(basename "$(dirname "$(dirname "$SRC")")")

# 3. the models, saved by shardlm in Hugging Face format after one training step on a few State of the
#    Union addresses (speed does not depend on the weights' values), with the GPT-2 tokenizer files:
#    gpt2: GPT-2 124M (the preset); llama: a LLaMA of its size, written as a config.json here (hidden
#    768, 12 layers, 12 heads sharing 4 KV heads, intermediate 2048, untied head, GPT-2's vocabulary, so
#    convert_hf_to_gguf.py takes its tokenizer as GPT-2's BPE: tokenizer_config.json names the class)
if [ ! -f "$WORK/data/tokenizer/vocab.json" ]; then
    rm -rf "$WORK/data" "$WORK/texts"
    mkdir -p "$WORK/texts"
    cp ../shared/data/sotu/179*.txt "$WORK/texts/"
    build/shardlm prepare --input "$WORK/texts" --output "$WORK/data" >&2
fi
cat >"$WORK/llama-config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 50257, "hidden_size": 768,
 "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 4,
 "max_position_embeddings": 1024, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "hidden_act": "silu",
 "tie_word_embeddings": false, "bos_token_id": 50256, "eos_token_id": 50256}
JSON
model_spec() { if [ "$1" = llama ]; then echo "$WORK/llama-config.json"; else echo "$1"; fi; }
for m in $MODELS; do
    HF="$WORK/$m-hf"
    [ -f "$HF/model.safetensors" ] && continue
    rm -rf "$WORK/$m-ckpt" "$HF"
    OMP_NUM_THREADS=$THREADS build/shardlm train --model "$(model_spec "$m")" --data "$WORK/data" --steps 1 \
        --batch-size 1 --seq-len 64 --eval-interval 0 --save-dir "$WORK/$m-ckpt" >&2
    build/shardlm convert --checkpoint "$WORK/$m-ckpt" --output "$HF" >&2
    cp "$WORK/data/tokenizer/vocab.json" "$WORK/data/tokenizer/merges.txt" "$HF/"
    if [ "$m" = llama ]; then
        echo '{"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}' \
            >"$HF/tokenizer_config.json"
    fi
done

# 4. GGUF files through convert_hf_to_gguf.py in a temporary venv
VENV="$WORK/venv"
for m in $MODELS; do
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -m venv --system-site-packages "$VENV"
        # $PYTHON may itself be a venv, whose packages a nested venv does not see: a .pth file adds them
        "$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' \
            >"$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')/shardlm_base.pth"
    fi
    "$VENV/bin/python" -c "import gguf" 2>/dev/null || "$VENV/bin/python" -m pip install -q --no-deps "$SRC/gguf-py" >&2
    for pkg in numpy torch transformers sentencepiece safetensors; do
        "$VENV/bin/python" -c "import $pkg" 2>/dev/null || "$VENV/bin/python" -m pip install -q "$pkg" >&2
    done
    for t in f32 f16 bf16; do
        [ -f "$WORK/$m-$t.gguf" ] && continue
        "$VENV/bin/python" "$SRC/convert_hf_to_gguf.py" "$WORK/$m-hf" --outtype "$t" --outfile "$WORK/$m-$t.gguf" >&2
    done
done

# 5. measure, each side back to back, BENCH_ROUNDS rounds
date_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
printf '{"meta":1,"date":"%s","cpu":"%s","cores":%s,"threads":%s,"prompt":%s,"gen":%s,"rounds":%s,"commit":"%s","llama_cpp":"%s","load_before":"%s"}\n' \
    "$date_utc" "$cpu" "$(nproc)" "$THREADS" "$PROMPT" "$GEN" "$ROUNDS" "$commit" "$LLAMA_VERSION" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" >"$OUT_JSONL.tmp"
run_llama() {  # model type round
    local tag="\"impl\":\"llama.cpp\",\"bench_model\":\"$1\",\"type\":\"$2\",\"round\":$3"
    "$WORK/build/bin/llama-bench" -m "$WORK/$1-$2.gguf" -p "$PROMPT" -n 0 -t "$THREADS" -r "$LLAMA_REPS" -o jsonl \
        2>>"$WORK/llama-bench.log" | sed "s/^{/{$tag,\"phase\":\"prefill\",/" >>"$OUT_JSONL.tmp"
    "$WORK/build/bin/llama-bench" -m "$WORK/$1-$2.gguf" -p 0 -n "$GEN" -d "$PROMPT" -t "$THREADS" -r "$LLAMA_REPS" \
        -o jsonl 2>>"$WORK/llama-bench.log" | sed "s/^{/{$tag,\"phase\":\"decode\",/" >>"$OUT_JSONL.tmp"
    log "llama.cpp $1 $2 round $3: load $(cut -d' ' -f1 /proc/loadavg)"
}
run_shardlm() {  # model precision round
    OMP_NUM_THREADS=$THREADS build/bench_decode --model "$WORK/$1-hf" --prompt "$PROMPT" --tokens "$GEN" \
        --threads "$THREADS" --precision "$2" --repeats "$SHARDLM_REPS" --profile "$([ "$3" = 1 ] && echo 1 || echo 0)" \
        2>>"$WORK/bench_decode.log" | sed "s/^{/{\"bench_model\":\"$1\",\"round\":$3,/" >>"$OUT_JSONL.tmp"
    log "shardlm $1 $2 round $3: load $(cut -d' ' -f1 /proc/loadavg)"
}
for r in $(seq 1 "$ROUNDS"); do
    for m in $MODELS; do
        run_llama "$m" f32 "$r"
        run_shardlm "$m" fp32 "$r"
        run_llama "$m" f16 "$r"
        run_llama "$m" bf16 "$r"
        run_shardlm "$m" bf16 "$r"
    done
done
printf '{"meta_end":1,"load_after":"%s"}\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT_JSONL.tmp"
mv "$OUT_JSONL.tmp" "$OUT_JSONL"
render
log "wrote $OUT_JSONL and the llama.cpp section of $RESULTS"
