#!/usr/bin/env bash
# bench/finetune.sh: fine-tuning speed and memory (issue 13), shardlm against PEFT (+ bitsandbytes) on
# PyTorch, on this CPU, side by side in one run, into bench/finetune_results.jsonl and the fine-tuning
# section of bench/RESULTS.md (between <!-- finetune-section:begin --> and <!-- finetune-section:end -->).
#
# What it does:
#   1. builds build/shardlm (make);
#   2. writes, once, into $FT_WORK: GPT-2 124M and a LLaMA of similar size (hidden 768, 12 layers, 12
#      heads, intermediate 2048, vocab 32000) with random weights, saved by transformers as fp32
#      safetensors, and a shard of uniform random tokens per model (bench/torch_finetune.py make): both
#      sides load the same files and train on the same windows in the same order;
#   3. runs, FT_ROUNDS times, for each model, each row of FT_ROWS (default: shardlm full fine-tune,
#      shardlm LoRA, PEFT LoRA, shardlm QLoRA, PEFT + bitsandbytes QLoRA), each a fresh process of
#      FT_WARMUP untimed + FT_STEPS timed steps at B=FT_BATCH, T=FT_SEQ, FT_THREADS threads. LoRA: r
#      FT_LORA_R, alpha FT_LORA_ALPHA, dropout 0, every linear of the blocks. Step: forward + loss +
#      backward + clip 1.0 + AdamW (lr 1e-4 constant, betas 0.9/0.95, weight decay 0) over the trained
#      parameters. The two sides of each pair run back to back; which side goes first alternates by
#      round. Each run goes through bench/finetune_run.py, which measures peak resident memory and
#      the other load the same way for both (see there);
#      Each row runs at each precision of FT_PRECISIONS: fp32, and bf16 = shardlm `--precision bf16`
#      (bf16 activations and GEMMs where the CPU has bf16 instructions, fp32 master weights) against
#      PyTorch's forward and loss under torch.autocast("cpu", torch.bfloat16) (fp32 parameters and AdamW;
#      bitsandbytes' compute dtype bfloat16 for QLoRA);
#   4. where the LoRA step's time goes (FT_PROFILE=1, the default, when both LoRA rows run): per model and
#      precision, one profiled pass per side after the rounds, each a fresh process outside the timed and
#      memory-measured runs: shardlm's profiling ops table through build/bench_train --lora-r FT_LORA_R (the
#      same adapters on the same shapes, the model's config.json with random weights and tokens) and
#      torch.profiler through torch_finetune.py --profile-steps (PEFT on the same files), so the report
#      can set each side's matrix products (the same work on both sides) against its whole step;
#   5. renders the medians over rounds, the ratios and the targets (bench/finetune_render.py).
# A shardlm row that train refuses is recorded with train's error message and shown as not available;
# nothing is assumed about which rows work (QLoRA bf16 runs since train accepts --precision bf16 with
# --quantize: bitsandbytes' compute dtype bfloat16).
#
#   bash bench/finetune.sh                          # everything (see bench/README.md for how long)
#   FT_ROUNDS=1 FT_WARMUP=1 FT_STEPS=1 FT_MODELS=gpt2 bash bench/finetune.sh   # a short trial
#   FT_ROWS="shardlm-lora pytorch-lora" bash bench/finetune.sh
#   bash bench/finetune.sh --render                 # re-render RESULTS.md from bench/finetune_results.jsonl
#
# Knobs: FT_MODELS ("gpt2 llama"), FT_PRECISIONS ("fp32 bf16"), FT_ROWS (also pytorch-full: PyTorch full
# fine-tuning; shardlm-dora / pytorch-dora: the LoRA rows with DoRA, PEFT's use_dora), FT_ROUNDS (3),
# FT_WARMUP (2), FT_STEPS (5), FT_BATCH (4), FT_SEQ (256), FT_THREADS (2), FT_LORA_R (16),
# FT_LORA_ALPHA (32), FT_WORK (/tmp/shardlm_finetune), PYTHON (an interpreter with torch, transformers,
# peft and bitsandbytes; default python3), BENCH_OUT / BENCH_RESULTS (a trial run that leaves bench/
# alone), FT_PROFILE (1; 0 skips step 4). Tests never run this.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${FT_WORK:-/tmp/shardlm_finetune}
MODELS=${FT_MODELS:-gpt2 llama}
PRECISIONS=${FT_PRECISIONS:-fp32 bf16}
ROWS=${FT_ROWS:-shardlm-full shardlm-lora pytorch-lora shardlm-qlora pytorch-qlora}
ROUNDS=${FT_ROUNDS:-3}
WARMUP=${FT_WARMUP:-2}
STEPS=${FT_STEPS:-5}
B=${FT_BATCH:-4}
T=${FT_SEQ:-256}
THREADS=${FT_THREADS:-2}
LORA_R=${FT_LORA_R:-16}
LORA_ALPHA=${FT_LORA_ALPHA:-32}
OUT_JSONL=${BENCH_OUT:-bench/finetune_results.jsonl}
RESULTS=${BENCH_RESULTS:-bench/RESULTS.md}
PYTHON=${PYTHON:-python3}
PROFILE=${FT_PROFILE:-1}

render() { python3 bench/finetune_render.py "$RESULTS" "$OUT_JSONL"; }
if [ "${1:-}" = "--render" ]; then render; exit 0; fi
log() { echo "[finetune.sh] $*" >&2; }
for v in ROUNDS WARMUP STEPS B T THREADS LORA_R; do
    if ! [[ ${!v} =~ ^[0-9]+$ ]] || (( ${!v} < 1 )); then
        echo "finetune.sh: FT_$v must be an integer >= 1 (the first step's end starts the steady state), got '${!v}'" >&2
        exit 2
    fi
done
for row in $ROWS; do
    case $row in shardlm-full|shardlm-lora|shardlm-dora|shardlm-qlora|pytorch-full|pytorch-lora|pytorch-dora|pytorch-qlora) ;;
        *) echo "finetune.sh: FT_ROWS: unknown row '$row' (expected shardlm-full|lora|dora|qlora, pytorch-full|lora|dora|qlora)" >&2
           exit 2 ;;
    esac
done
for m in $MODELS; do
    case $m in gpt2|llama) ;; *) echo "finetune.sh: FT_MODELS: unknown model '$m' (expected gpt2, llama)" >&2; exit 2 ;; esac
done
for pr in $PRECISIONS; do
    case $pr in fp32|bf16) ;; *) echo "finetune.sh: FT_PRECISIONS: unknown precision '$pr' (expected fp32, bf16)" >&2; exit 2 ;; esac
done
if ! "$PYTHON" -c "import torch, transformers, peft, bitsandbytes, numpy" 2>/dev/null; then
    echo "finetune.sh: $PYTHON cannot import torch, transformers, peft, bitsandbytes and numpy: set PYTHON" >&2
    exit 2
fi

# 1. shardlm (and bench_train for step 4)
make --no-print-directory -j"${MAKE_JOBS:-2}" build/shardlm >/dev/null
if [ "$PROFILE" = 1 ]; then bash bench/build_bench.sh build >/dev/null; fi
# 2. the models and the tokens
mkdir -p "$WORK"
"$PYTHON" bench/torch_finetune.py make --out "$WORK" 2>>"$WORK/make.log"

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD -- src include 2>/dev/null; then commit="$commit+dirty"; fi
python3 - "$commit" "$ROUNDS" "$WARMUP" "$STEPS" "$B" "$T" "$THREADS" "$LORA_R" "$LORA_ALPHA" "$ROWS" "$MODELS" "$PRECISIONS" \
    >"$OUT_JSONL.tmp" <<'PYEOF'
import json, sys
sys.path.insert(0, "bench")
from bench_util import machine_record
a = sys.argv[1:]
print(json.dumps(machine_record(a[0], rounds=int(a[1]), warmup=int(a[2]), steps=int(a[3]), B=int(a[4]), T=int(a[5]),
    threads=int(a[6]), lora_r=int(a[7]), lora_alpha=float(a[8]), rows=a[9].split(), models=a[10].split(),
    precisions=a[11].split())))
PYEOF

# 3. measure
run_row() {  # row model round precision
    local impl=${1%%-*} mode=${1#*-} m=$2 r=$3 pr=$4 targets cmd
    if [ "$m" = gpt2 ]; then targets=c_attn,c_proj,c_fc; else targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj; fi
    if [ "$impl" = shardlm ]; then
        cmd=(env OMP_NUM_THREADS="$THREADS" SHARDLM_TERMINAL=0 build/shardlm train --model "$WORK/$m"
             --data "$WORK/data-$m" --batch-size "$B" --seq-len "$T" --steps $((WARMUP + STEPS)) --threads "$THREADS"
             --lr 1e-4 --lr-schedule constant --weight-decay 0 --grad-clip 1.0 --no-shuffle --no-save
             --eval-interval 0 --sample-tokens 0 --log-interval 1 --seed 1234 --metrics "$WORK/metrics.jsonl" --precision "$pr")
        if [ "$mode" != full ]; then
            cmd+=(--lora-r "$LORA_R" --lora-alpha "$LORA_ALPHA" --lora-dropout 0 --lora-targets "$targets")
        fi
        if [ "$mode" = qlora ]; then cmd+=(--quantize nf4); fi
        if [ "$mode" = dora ]; then cmd+=(--lora-dora); fi
    else
        cmd=(env OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS" "$PYTHON" bench/torch_finetune.py train
             --model "$WORK/$m" --data "$WORK/data-$m/train_000000.bin" --mode "$mode" --batch "$B" --seq "$T"
             --threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP" --lora-r "$LORA_R" --lora-alpha "$LORA_ALPHA" --precision "$pr")
    fi
    python3 bench/finetune_run.py --impl "$impl" --mode "$mode" --arch "$m" --warmup "$WARMUP" --steps "$STEPS" \
        --batch "$B" --seq "$T" --threads "$THREADS" --round "$r" --precision "$pr" --metrics "$WORK/metrics.jsonl" \
        --log "$WORK/finetune.log" -- "${cmd[@]}" | tee -a "$OUT_JSONL.tmp" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
what = ("%8.1f ms/step %7.1f tok/s" % (r["ms_per_step"], r["tokens_per_s"]) if r["status"] == "ok"
        else "failed: " + r.get("error", "?"))
peak = r.get("peak_rss_bytes") or 0
print("[finetune.sh]   %-8s %-5s %-4s %s, peak RSS %.2f GB, other load %s, load %s" % (r["impl"], r["mode"], r["precision"], what,
      peak / 1e9, r.get("other_load", "?"), r["load_after"]), file=sys.stderr)'
}
# the rows as pairs of one mode, so each pair runs back to back; shardlm first in odd rounds
for r in $(seq 1 "$ROUNDS"); do
    for m in $MODELS; do
      for pr in $PRECISIONS; do
        log "round $r/$ROUNDS, $m $pr: load $(cut -d' ' -f1-3 /proc/loadavg)"
        for mode in full lora dora qlora; do
            pair=()
            for impl in shardlm pytorch; do
                if [[ " $ROWS " == *" $impl-$mode "* ]]; then pair+=("$impl-$mode"); fi
            done
            if (( r % 2 == 0 )) && [ "${#pair[@]}" -eq 2 ]; then pair=("${pair[1]}" "${pair[0]}"); fi
            for row in "${pair[@]}"; do run_row "$row" "$m" "$r" "$pr"; done
        done
      done
    done
done
# 4. where the LoRA step's time goes: one profiled pass per side, model and precision (outside the rounds)
profile_record() {  # impl model precision line: the JSON line of a profiled pass (bench_train's, or
                   # torch_finetune.py's "profile") as a profile_of record, or a failed one
    python3 - "$@" >>"$OUT_JSONL.tmp" <<'PYEOF'
import json, sys
impl, arch, precision, line = sys.argv[1:5]
rec = {"profile_of": "lora", "impl": impl, "arch": arch, "precision": precision}
try:
    r = json.loads(line)
    prof = r["profile"] if impl == "pytorch" else {
        "step_ms": r["profiled_ms_per_step"], "breakdown": r["breakdown"], "steps": r["profile_steps"]}
    rec.update(status="ok", **prof, other_load=r.get("other_load"))
except (ValueError, KeyError):
    rec.update(status="failed", error=f"{impl}'s profiled pass printed no profile (see finetune.log)")
print(json.dumps(rec))
PYEOF
}
profile_pair() {  # model precision
    local m=$1 pr=$2 out
    log "profile, $m $pr: load $(cut -d' ' -f1-3 /proc/loadavg)"
    out=$(env OMP_NUM_THREADS="$THREADS" build/bench_train --model "$WORK/$m" --batch "$B" --seq "$T" \
          --threads "$THREADS" --steps 1 --warmup "$WARMUP" --profile-steps 2 --lora-r "$LORA_R" --precision "$pr" \
          2>>"$WORK/finetune.log" | tail -1) || out=""
    profile_record shardlm "$m" "$pr" "$out"
    out=$(env OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS" "$PYTHON" bench/torch_finetune.py train \
          --model "$WORK/$m" --data "$WORK/data-$m/train_000000.bin" --mode lora --batch "$B" --seq "$T" \
          --threads "$THREADS" --steps 1 --warmup "$WARMUP" --profile-steps 2 --lora-r "$LORA_R" \
          --lora-alpha "$LORA_ALPHA" --precision "$pr" 2>>"$WORK/finetune.log" | tail -1) || out=""
    profile_record pytorch "$m" "$pr" "$out"
}
if [ "$PROFILE" = 1 ] && [[ " $ROWS " == *" shardlm-lora "* ]] && [[ " $ROWS " == *" pytorch-lora "* ]]; then
    for m in $MODELS; do
        for pr in $PRECISIONS; do profile_pair "$m" "$pr"; done
    done
fi

printf '{"meta_end":1,"load_after":"%s","date":"%s"}\n' "$(cut -d' ' -f1-3 /proc/loadavg)" \
    "$(date '+%Y-%m-%d %H:%M:%S %Z')" >>"$OUT_JSONL.tmp"
mv "$OUT_JSONL.tmp" "$OUT_JSONL"
render
log "wrote $OUT_JSONL and the fine-tuning section of $RESULTS (run log: $WORK/finetune.log)"
