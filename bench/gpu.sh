#!/usr/bin/env bash
# bench/gpu.sh: the GPU benchmark in one call (made for the device tool: one command, at most 10
# minutes, results copied back from $OUT). On a machine with an NVIDIA GPU it
#   1. records the machine (nvidia-smi name, driver, CUDA; nvcc; torch), the date and the commit;
#   2. builds the library and the benchmark programs (bench/build_bench.sh, make -j$(nproc));
#   3. measures the GEMM rate: torch.matmul on random 8192^3 matrices (bf16, fp32, tf32; median)
#      and shardlm's own matmul_forward (cuBLASLt) on bf16 buffers (what training runs), on fp32
#      buffers at the bf16 compute type, and at fp32 (bench/bench_gemm.c);
#   4. for GPT-2 124M and 355M at T=1024, bf16: shardlm (bench_train --device cuda --precision bf16
#      --batch auto, with its per-op profile), PyTorch eager and torch.compile (bench/torch_gpu.py,
#      flash attention through SDPA), each at the largest micro-batch that fits (searched from
#      GPU_MAX_BATCH down by halves); then, for each model, each side again at the largest micro-batch
#      both fit, when that differs (the like-for-like rows; these go first when the budget runs out);
#   5. each model once more at shardlm's micro-batch with SHARDLM_ATTENTION=simt (bf16 attention on
#      the CUDA cores) and with SHARDLM_ATTENTION=tc (the WMMA kernels of attention_tc.cu, against the
#      default mma.sync kernels of attention_mma.cu), and with SHARDLM_ATTENTION_GRID=heads (those
#      kernels' blocks in chunks of heads) and with SHARDLM_ATTENTION_DQ=atomic (their backward's dQ added
#      inside the dK/dV kernel by fp32 atomics; and =ordered, those atomics in key-tile order), for the
#      table comparing the attention kernels
#      and with SHARDLM_ATTENTION=mma (the mma.sync kernels against training's default, cuDNN's fused
#      flash attention), SHARDLM_ATTENTION_DQ=atomic (cuDNN's dQ summed in fp32) and
#      SHARDLM_CUDNN_WORKSPACE_MB=2048 (cuDNN's deterministic backward in one call, not in slices) and,
#      where the machine holds two cuDNN versions, SHARDLM_CUDNN_LIBRARY naming the older (the rest load
#      the newest: scripts/gpu_env.sh's gpu_pick_cudnn)
#      (GPU_SIMT=0 / GPU_WMMA=0 / GPU_MMA=0 / GPU_CUDNN=0 / GPU_ATT_GRID=0 / GPU_ATT_DQ=0: not run);
#   6. each model once more at shardlm's micro-batch with SHARDLM_FUSED_KERNELS=0 (the norm backward
#      and cross-entropy as the earlier separate kernels, the MLP's GELU gradient outside the GEMM
#      epilogue), for the before / after table of the fused kernels (GPU_SPLIT=0: not run), with
#      SHARDLM_CE_ROW_SMEM=0 (the fused classifier reading each row twice, the default's rows in shared
#      memory left out) and =2 (two rows a block, the next one's copy in flight; GPU_CE_SMEM=0: neither
#      run), with SHARDLM_GELU_EPILOGUE=0 (GPT-2's GELU and its gradient as their own kernels after plain
#      GEMMs instead of cuBLASLt's GELU_AUX / DGELU epilogues; GPU_GELU_EPI=0: not run), with
#      SHARDLM_BIAS_GRAD_EPILOGUE=0 (the bias gradients by the column-sum kernels, a second read of
#      each output gradient, instead of the dweight GEMMs' BGRADB epilogue; GPU_BGRAD_EPI=0: not run), and with
#      SHARDLM_GEMM_AUTOTUNE=1 (each GEMM shape's algorithms timed once; GPU_AUTOTUNE=0: not run);
#   7. renders the "GPU" section of bench/RESULTS.md (bench/gpu_render.py) after every model, so a
#      run cut short still leaves its finished rows.
# Every stage has a timeout and the whole run a budget (GPU_BUDGET_S, default 540 s); a stage that
# fails or does not fit the budget is logged, recorded as a "gpu-skip" line and rendered as not
# measured, and the run goes on. Without an importable torch (or one that sees no GPU) the PyTorch
# rows are skipped with that reason and the shardlm rows are still produced.
#
# Outputs (GPU_OUT_DIR, default bench/): gpu_results.jsonl (one JSON line per run, started afresh),
# gpu_bench.log (everything the programs printed, build included), RESULTS.md (its GPU section
# replaced). With $OUT set (the device tool), all of them and gpu_section.md are copied there after
# every stage. Render again elsewhere: bash bench/gpu.sh --render FILE.jsonl [RESULTS.md] (the
# concatenation of two runs' files renders as one, e.g. GPU_MODELS=gpt2 and GPU_MODELS=gpt2-medium
# run in two calls).
#
# Libraries: when the machine lacks OpenBLAS / cJSON / PCRE2 / Open MPI headers or libraries and
# GPU_DEPS_DIR (default build/gpu-deps, made by bench/gpu_deps.sh) holds .deb files, scripts/gpu_env.sh
# unpacks them under /tmp and puts on the library path only the libraries the machine lacks.
#
# Environment: GPU_BUDGET_S=540  GPU_MODELS="gpt2 gpt2-medium"  GPU_SEQ=1024  GPU_MAX_BATCH=64
#   (GPU_SHARDLM_MAX_BATCH / GPU_TORCH_MAX_BATCH: one side's first try)  GPU_GEMM_SIZE=8192
#   GPU_STEPS=6  GPU_WARMUP=2  GPU_TORCH=1 (0: shardlm only)  GPU_COMPILE=1 (0: no torch.compile rows)
#   GPU_VARIANT_MODELS (default GPU_MODELS: the models of the comparison rows of step 5-6)
#   GPU_LIKE=1 (0: no like-for-like rows)  GPU_SIMT=1 (0: no CUDA-core attention rows)
#   GPU_WMMA=1 (0: no WMMA attention rows)  GPU_MMA=1 (0: no mma.sync attention row)
#   GPU_CUDNN=1 (0: no rows of cuDNN with dQ in fp32, with the backward unsliced or on the older libcudnn)
#   GPU_CUDNN_PREV_MODELS (default GPU_VARIANT_MODELS: the models of the older libcudnn's row)
#   GPU_ATT_GRID=1 (0: no attention-grid rows)
#   GPU_ATT_DQ=1 (0: no atomic-dQ attention rows)
#   GPU_SPLIT=1 (0: no separate-kernel rows)  GPU_AUTOTUNE=1 (0: no autotuned-GEMM rows)
#   GPU_CE_SMEM=1 (0: no classifier rows with SHARDLM_CE_ROW_SMEM=0 / 2)
#   GPU_GELU_EPI=1 (0: no row with SHARDLM_GELU_EPILOGUE=0)
#   GPU_BGRAD_EPI=1 (0: no row with SHARDLM_BIAS_GRAD_EPILOGUE=0)  GPU_BUILD=build/gpu  GPU_COMMIT (when git is not there)
#   PYTHON=python3
#   GPU_DEVICE=cuda; GPU_DEVICE=cpu is a dry run of this script's logic on a machine without a GPU (with
#   GPU_MODELS=gpt2-tiny GPU_SEQ=64 GPU_MAX_BATCH=8 GPU_OUT_DIR=/tmp/somewhere: it measures nothing useful)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
if [[ "${1:-}" == --render ]]; then
    exec "$PY" bench/gpu_render.py "${2:?usage: gpu.sh --render FILE.jsonl [RESULTS.md]}" "${3:-bench/RESULTS.md}"
fi

BUDGET=${GPU_BUDGET_S:-540}
OUT_DIR=${GPU_OUT_DIR:-bench}
JSONL=$OUT_DIR/gpu_results.jsonl
LOG=$OUT_DIR/gpu_bench.log
RESULTS=$OUT_DIR/RESULTS.md
BUILD=${GPU_BUILD:-build/gpu}
SEQ=${GPU_SEQ:-1024}
MAXB=${GPU_MAX_BATCH:-64}
DEV=${GPU_DEVICE:-cuda}
STEPS=${GPU_STEPS:-6}
WARMUP=${GPU_WARMUP:-2}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR"
: > "$JSONL"
: > "$LOG"
[[ -f "$RESULTS" ]] || cp bench/RESULTS.md "$RESULTS" 2>/dev/null || : > "$RESULTS"

say() { echo "gpu.sh [$(printf '%3d' "$SECONDS")s] $*" | tee -a "$LOG"; }
left() { echo $((BUDGET - SECONDS)); }
skip() {  # skip STAGE WHY: a not-measured line for the renderer
    say "SKIPPED $1: $2"
    "$PY" -c 'import json,sys; print(json.dumps({"impl": "gpu-skip", "stage": sys.argv[1], "why": sys.argv[2]}))' \
        "$1" "$2" >> "$JSONL"
}
publish() {  # render, then copy everything to $OUT
    "$PY" bench/gpu_render.py "$JSONL" "$RESULTS" --section "$OUT_DIR/gpu_section.md" >> "$LOG" 2>&1 ||
        echo "gpu.sh: rendering failed (see $LOG)" >&2
    if [[ -n "${OUT:-}" ]]; then
        cp "$JSONL" "$LOG" "$RESULTS" "$OUT/" 2>/dev/null
        cp "$OUT_DIR/gpu_section.md" "$OUT/" 2>/dev/null
    fi
    return 0
}

# busy_median FILE COLUMN: the median of COLUMN of run_json's nvidia-smi samples (memory, SM clock,
# power, utilisation) over those at >= 90% utilisation, or null
busy_median() {
    awk -F', *' -v c="$2" '$4 + 0 >= 90 && $c ~ /^[0-9.]+$/ { print $c }' "$1" 2>/dev/null | sort -n |
        awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "null" }'
}

# run_json TAG LIMIT_S [ENV=V ...] COMMAND...: runs COMMAND under a timeout of min(LIMIT_S, what the
# budget leaves less 20 s), sampling the GPU (nvidia-smi, every 200 ms: used memory, SM clock, power,
# utilisation) meanwhile; every JSON line it prints goes to $JSONL with "tag", "wall_s", "smi_peak_mib"
# and "smi_sm_mhz" / "smi_power_w" (medians over the samples at >= 90% utilisation: the clock and power
# the card ran the steps at, which a power-limited card lowers as its kernels get busier) added. LAST
# holds the last line.
run_json() {
    local tag=$1 limit=$2; shift 2
    local room=$(($(left) - 20))
    (( room < limit )) && limit=$room
    LAST=""
    if (( limit < 15 )); then skip "$tag" "out of time budget ($(left) s left of $BUDGET)"; return 1; fi
    say "run $tag (limit ${limit}s): $*"
    local smi=/tmp/gpu_sh_smi.$$ out=/tmp/gpu_sh_out.$$ t0=$SECONDS rc smi_pid=""
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=memory.used,clocks.sm,power.draw,utilization.gpu --format=csv,noheader,nounits \
            -lms 200 > "$smi" 2>/dev/null &
        smi_pid=$!
    fi
    timeout --kill-after=10 "$limit" env "$@" > "$out" 2>> "$LOG"
    rc=$?
    [[ -n "$smi_pid" ]] && kill "$smi_pid" 2>/dev/null && wait "$smi_pid" 2>/dev/null
    local peak mhz watts wall=$((SECONDS - t0))
    peak=$(cut -d, -f1 "$smi" 2>/dev/null | tr -d ' ' | sort -n | tail -1)
    [[ "$peak" =~ ^[0-9]+$ ]] || peak=null
    mhz=$(busy_median "$smi" 2) watts=$(busy_median "$smi" 3)
    cat "$out" >> "$LOG"
    if (( rc != 0 )) || ! grep -q '^{' "$out"; then
        local why="exit status $rc"
        (( rc == 124 || rc == 137 )) && why="timed out after ${limit}s"
        skip "$tag" "$why (see gpu_bench.log)"
        rm -f "$smi" "$out"
        return 1
    fi
    local line
    while IFS= read -r line; do
        [[ "$line" == \{* ]] || continue
        LAST="${line%\}}, \"tag\": \"$tag\", \"wall_s\": $wall, \"smi_peak_mib\": $peak, \"smi_sm_mhz\": $mhz, \"smi_power_w\": $watts}"
        echo "$LAST" >> "$JSONL"
    done < "$out"
    rm -f "$smi" "$out"
    say "  done in ${wall}s"
    return 0
}
field() { "$PY" -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

# ---------------------------------------------------------------- 1. the machine
say "GPU benchmark: budget ${BUDGET}s, models ${GPU_MODELS:-gpt2 gpt2-medium}, T=$SEQ, bf16"
if [[ "$DEV" != cpu ]] && ! nvidia-smi >> "$LOG" 2>&1; then
    say "no GPU: nvidia-smi failed; nothing to measure"
    skip all "no GPU (nvidia-smi failed)"
    publish
    exit 1
fi
# the source measured: GPU_COMMIT, else git's commit ("+dirty" when src/, include/ or bench/ differ from it)
if [[ -n "${GPU_COMMIT:-}" ]]; then COMMIT=$GPU_COMMIT
elif COMMIT=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD -- src include bench 2>/dev/null || COMMIT="$COMMIT+dirty"
else COMMIT=unknown; fi
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[[ -x "$CUDA_HOME/bin/nvcc" ]] || { n=$(command -v nvcc) && CUDA_HOME=$(dirname "$(dirname "$n")"); }
# PyTorch: importable, and seeing the GPU? TORCH_WHY: its version, or why not
TORCH_OK=0
TORCH_PROBE='import sys, torch
assert sys.argv[1] == "cpu" or torch.cuda.is_available(), "torch %s sees no CUDA GPU" % torch.__version__
print(torch.__version__)'
if [[ "${GPU_TORCH:-1}" != 1 ]]; then
    TORCH_WHY="GPU_TORCH=0"
elif TORCH_WHY=$("$PY" -c "$TORCH_PROBE" "$DEV" 2>/tmp/gpu_sh_torch.$$); then
    TORCH_OK=1
    TORCH_WHY=$(echo "$TORCH_WHY" | tail -1)
else
    TORCH_WHY="torch not usable: $(tail -1 /tmp/gpu_sh_torch.$$)"
fi
rm -f /tmp/gpu_sh_torch.$$
(( TORCH_OK )) || skip pytorch "PyTorch rows: $TORCH_WHY"
"$PY" - "$COMMIT" "$BUDGET" "$TORCH_OK" "$TORCH_WHY" "$CUDA_HOME" >> "$JSONL" <<'PYEOF'
import json, os, subprocess, sys, time
def sh(c):
    try: return subprocess.run(c, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception: return "?"
q = sh("nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit "
       "--format=csv,noheader").split("\n")[0]
f = [x.strip() for x in q.split(",")] + ["?"] * 5
print(json.dumps({"impl": "gpu-meta", "gpu": f[0], "driver": f[1], "memory_total": f[2], "max_sm_clock": f[3],
    "power_limit": f[4], "cuda_driver": sh("nvidia-smi | sed -n 's/.*CUDA Version: *\\([0-9.]*\\).*/\\1/p' | head -1"),
    "nvcc": sh(sys.argv[5] + "/bin/nvcc --version | sed -n 's/.*release \\([0-9.]*\\).*/\\1/p'"),
    "torch": sys.argv[4] if sys.argv[3] == "1" else None, "torch_missing": None if sys.argv[3] == "1" else sys.argv[4],
    "cpu": sh("lscpu | sed -n 's/^Model name:[ \\t]*//p' | head -1"), "cores": os.cpu_count(),
    "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": sys.argv[1], "budget_s": int(sys.argv[2])}))
PYEOF

# ---------------------------------------------------------------- 2. libraries and build
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh
gpu_env_setup "$LOG"
say "$GPU_ENV_MSG"
SHARDLM_OK=0
build_limit=$(($(left) - 60))
(( build_limit > 300 )) && build_limit=300
(( build_limit < 30 )) && build_limit=30
say "building $BUILD (make -j$(nproc), CUDA_HOME=$CUDA_HOME)"
if timeout "$build_limit" env CU_B="$BUILD" MAKE_JOBS="$(nproc)" \
        bash bench/build_bench.sh "$BUILD" >> "$LOG" 2>&1; then
    if [[ "$DEV" == cpu ]] || ar t "$BUILD/libshardlm.a" | grep -q '\.cu\.o$'; then
        SHARDLM_OK=1
        say "built in ${SECONDS}s"
    else
        skip shardlm "built without the CUDA backend (no nvcc under $CUDA_HOME)"
    fi
else
    tail -30 "$LOG"
    skip shardlm "build failed (see gpu_bench.log)"
fi
publish

# ---------------------------------------------------------------- 3. GEMM rates
if (( TORCH_OK )); then
    run_json gemm-torch 120 "$PY" bench/torch_gpu.py --device "$DEV" --gemm --gemm-size "${GPU_GEMM_SIZE:-8192}" \
        --gemm-repeats 50
else
    skip gemm-torch "$TORCH_WHY"
fi
if (( SHARDLM_OK )); then
    run_json gemm-shardlm-bf16 60 "$BUILD/bench_gemm" --device "$DEV" --precision bf16 --size "${GPU_GEMM_SIZE:-8192}" \
        --repeats 30
    run_json gemm-shardlm-bf16-fp32-buffers 60 "$BUILD/bench_gemm" --device "$DEV" --precision bf16 --storage fp32 \
        --size "${GPU_GEMM_SIZE:-8192}" --repeats 30
    run_json gemm-shardlm-fp32 60 "$BUILD/bench_gemm" --device "$DEV" --precision fp32 --size "${GPU_GEMM_SIZE:-8192}" \
        --repeats 10
fi
publish

# ---------------------------------------------------------------- 4. the models
shardlm_run() {  # shardlm_run TAG LIMIT BATCH(auto|N)
    run_json "$1" "$2" "$BUILD/bench_train" --model "$model" --device "$DEV" --precision bf16 --seq "$SEQ" \
        --batch "$3" --max-batch "${GPU_SHARDLM_MAX_BATCH:-$MAXB}" --steps "$STEPS" --warmup "$WARMUP" \
        --profile-steps 1 --report
}
torch_run() {  # torch_run TAG LIMIT MODE BATCHES [--profile]
    local tag=$1 limit=$2 mode=$3 batches=$4; shift 4
    run_json "$tag" "$limit" "$PY" bench/torch_gpu.py --device "$DEV" --model "$model" --seq "$SEQ" --mode "$mode" \
        --batch "$batches" --max-batch "${GPU_TORCH_MAX_BATCH:-$MAXB}" --steps "$STEPS" --warmup "$WARMUP" "$@"
}
halves() { if (( $1 > 1 )); then echo "$1,$(($1 / 2))"; else echo 1; fi; }   # "B,B/2": a fallback if B no longer fits
# First every model at the largest micro-batch each side fits, then (budget permitting) the
# like-for-like rows, so a tight budget loses the extra rows rather than a model.
declare -A BS BT
for model in ${GPU_MODELS:-gpt2 gpt2-medium}; do
    say "== $model T=$SEQ bf16: largest micro-batch on each side"
    if (( SHARDLM_OK )) && shardlm_run "shardlm:$model:max" 240 auto; then BS[$model]=$(field "$LAST" B); fi
    if (( TORCH_OK )); then
        if torch_run "eager:$model:max" 150 eager auto --profile; then BT[$model]=$(field "$LAST" B); fi
        if [[ "${GPU_COMPILE:-1}" == 1 && -n "${BT[$model]:-}" ]]; then
            torch_run "compile:$model:max" 240 compile "$(halves "${BT[$model]}")" --profile
        fi
    fi
    publish
done
for model in ${GPU_MODELS:-gpt2 gpt2-medium}; do
    bs=${BS[$model]:-} bt=${BT[$model]:-}
    [[ "${GPU_LIKE:-1}" == 1 && -n "$bs" && -n "$bt" && "$bs" != "$bt" ]] || continue
    bl=$((bs < bt ? bs : bt))
    say "== $model: like-for-like micro-batch $bl (shardlm fits $bs, PyTorch $bt)"
    if (( bs > bl )); then shardlm_run "shardlm:$model:like" 180 "$bl"; fi
    if (( bt > bl )); then
        torch_run "eager:$model:like" 120 eager "$bl"
        [[ "${GPU_COMPILE:-1}" == 1 ]] && torch_run "compile:$model:like" 200 compile "$bl"
    fi
    publish
done
# variant_rows FLAG TAG SETTINGS WHAT [MODELS]: each model (MODELS, else GPU_VARIANT_MODELS) again at
# shardlm's micro-batch with the environment settings SETTINGS (NAME=VALUE, several separated by
# spaces), tagged TAG:model, for the comparison tables; FLAG=0 leaves them out
variant_rows() {
    local flag=$1 tag=$2 settings=$3 what=$4 models=${5:-} model bs kv
    for model in ${models:-${GPU_VARIANT_MODELS:-${GPU_MODELS:-gpt2 gpt2-medium}}}; do
        bs=${BS[$model]:-}
        [[ "${!flag:-1}" == 1 && -n "$bs" ]] || continue
        say "== $model: $what ($settings), micro-batch $bs"
        (for kv in $settings; do export "${kv?}"; done; shardlm_run "$tag:$model" 180 "$bs")
        publish
    done
}
# the attention: training's default (SHARDLM_ATTENTION=auto) is cuDNN's fused flash attention since
# 2026-11-28 (H200: 112.4 against 127.7 ms a GPT-2 124M step); the mma.sync kernels beside it, then
# cuDNN with dQ summed in fp32, bf16 attention on the CUDA-core kernels and on the WMMA ones. The
# mma.sync kernels' own modes name SHARDLM_ATTENTION=mma
variant_rows GPU_MMA shardlm-mma SHARDLM_ATTENTION=mma "attention on the mma.sync kernels"
variant_rows GPU_CUDNN shardlm-cudnnsum "SHARDLM_ATTENTION=cudnn SHARDLM_ATTENTION_DQ=atomic" \
    "cuDNN's fused attention, dQ summed in fp32 in any order"
# the deterministic backward in one call instead of slices of sequences (B = 64: 4 calls of 16 under
# the default 512 MiB cap; 2048 MiB takes the batch whole, its dS workspace 1.5 GiB for GPT-2 124M)
variant_rows GPU_CUDNN shardlm-cudnnws "SHARDLM_ATTENTION=cudnn SHARDLM_CUDNN_WORKSPACE_MB=2048" \
    "cuDNN's fused attention, the deterministic backward unsliced"
# cuDNN's version: the rows above load the machine's newest libcudnn (scripts/gpu_env.sh's gpu_pick_cudnn:
# GPU_CUDNN_LIBS, newest first) unless SHARDLM_CUDNN_LIBRARY named one; the newest other beside them (the H200 of 2026-11-28: the toolkit's 9.14
# ran GPT-2's attention backward at 1.56 ms a layer, PyTorch's 9.19 at 1.02)
prev=""   # the newest of GPU_CUDNN_LIBS that is not the library the rows above load
for lib in ${GPU_CUDNN_LIBS:-}; do
    [[ "$(readlink -f "${lib#*=}")" != "$(readlink -f "${SHARDLM_CUDNN_LIBRARY:-/nonexistent}")" ]] && { prev=$lib; break; }
done
if [[ -n "$prev" ]]; then
    variant_rows GPU_CUDNN shardlm-cudnnprev "SHARDLM_ATTENTION=cudnn SHARDLM_CUDNN_LIBRARY=${prev#*=}" \
        "cuDNN's fused attention on the machine's other libcudnn ${prev%%=*}" "${GPU_CUDNN_PREV_MODELS:-}"
fi
variant_rows GPU_SIMT shardlm-simt SHARDLM_ATTENTION=simt "attention on the CUDA cores"
variant_rows GPU_WMMA shardlm-wmma SHARDLM_ATTENTION=tc "attention on WMMA tensor-core tiles"
variant_rows GPU_ATT_GRID shardlm-attgrid "SHARDLM_ATTENTION=mma SHARDLM_ATTENTION_GRID=heads" "mma.sync attention blocks in chunks of heads"
variant_rows GPU_ATT_DQ shardlm-attdq "SHARDLM_ATTENTION=mma SHARDLM_ATTENTION_DQ=atomic" "mma.sync attention backward with dQ by atomics"
variant_rows GPU_ATT_DQ shardlm-attboth "SHARDLM_ATTENTION=mma SHARDLM_ATTENTION_GRID=heads SHARDLM_ATTENTION_DQ=atomic" \
    "mma.sync attention in chunks of heads, dQ by atomics"
variant_rows GPU_ATT_DQ shardlm-attorder "SHARDLM_ATTENTION=mma SHARDLM_ATTENTION_DQ=ordered" \
    "mma.sync attention backward with dQ by atomics in key-tile order"
# the fused kernels: the norm backward, the cross-entropy and the MLP's GELU gradient as separate
# kernels, for the before / after table
variant_rows GPU_SPLIT shardlm-split SHARDLM_FUSED_KERNELS=0 "separate norm-backward, cross-entropy and GELU-gradient kernels"
variant_rows GPU_CE_SMEM shardlm-cetwice SHARDLM_CE_ROW_SMEM=0 "the classifier reading each row twice"
variant_rows GPU_CE_SMEM shardlm-cetwo SHARDLM_CE_ROW_SMEM=2 "the classifier with two rows a block in shared memory"
# GPT-2's c_fc forward at 56% of the GEMM rate with the GELU_AUX epilogue (2026-11-28): the same GEMMs
# plain, the GELU and its gradient as their own kernels
variant_rows GPU_GELU_EPI shardlm-nogeluepi SHARDLM_GELU_EPILOGUE=0 "the GELU outside the cuBLASLt epilogues"
# the bias gradients: the dweight GEMMs' BGRADB epilogue (the default, written 2026-11-28) against the
# column-sum kernels that read each output gradient again (10.9 GB a GPT-2 124M B=64 step)
variant_rows GPU_BGRAD_EPI shardlm-nobgradepi SHARDLM_BIAS_GRAD_EPILOGUE=0 "bias gradients by the column-sum kernels"
# the GEMMs: each shape's cuBLASLt algorithms timed once against the heuristic's first
variant_rows GPU_AUTOTUNE shardlm-autotune SHARDLM_GEMM_AUTOTUNE=1 "GEMM algorithms timed per shape"
say "finished in ${SECONDS}s"
publish
tail -40 "$OUT_DIR/gpu_section.md" 2>/dev/null
exit 0
