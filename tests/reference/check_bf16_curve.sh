#!/usr/bin/env bash
# tests/reference/check_bf16_curve.sh [STEPS]: shows that --precision bf16 on the CPU trains like fp32.
# Trains gpt2-demo on ../shared/data/sotu (tokenised into a temporary directory) for STEPS steps
# (default 300) from the same seed twice, --precision fp32 and --precision bf16 (the table the CPU
# gets: cpu-bf16-onednn where it has bf16 instructions, else the emulation; the first lines of the
# bf16 log say which), one thread each, both at once, and compares the logged losses:
#   * the mean loss of every 50-step window within 1% (relative) of fp32's;
#   * the final validation loss within 1% of fp32's.
# Per-step losses are printed as a summary (median and 95th percentile of the relative difference) but
# not checked: two runs that round differently take different paths, and a single step's loss can
# differ a lot where one run spikes and the other does not. Exits 0 when both checks hold, 1 when one
# fails, 2 on a usage or build error. Runs by hand (not in `make test`): about 10 minutes on 2 cores.
set -euo pipefail
steps=${1:-300}
case $steps in ''|*[!0-9]*) echo "usage: $0 [STEPS]   (a positive step count, default 300)" >&2; exit 2;; esac
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
data=$root/../shared/data/sotu
[ -d "$data" ] || { echo "$0: $data not found (the shared corpus beside the repository)" >&2; exit 2; }
make -C "$root" -j2 build/shardlm >/dev/null || { echo "$0: build failed" >&2; exit 2; }
bin=$root/build/shardlm
tmp=$(mktemp -d /tmp/shardlm_bf16_curve_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$bin" prepare --input "$data" --output "$tmp/data" >"$tmp/prepare.log" 2>&1 ||
  { echo "$0: prepare failed: $(tail -n 3 "$tmp/prepare.log")" >&2; exit 2; }
for p in fp32 bf16; do
  "$bin" train --model gpt2-demo --data "$tmp/data" --steps "$steps" --precision "$p" --threads 1 --no-save \
    --metrics "$tmp/$p.jsonl" >"$tmp/$p.log" 2>&1 &
done
wait || true
for p in fp32 bf16; do
  grep -q '"val_loss"' "$tmp/$p.jsonl" 2>/dev/null || { echo "$0: the $p run failed: $(tail -n 3 "$tmp/$p.log")" >&2; exit 2; }
done
grep -m1 "^cpu: " "$tmp/bf16.log" | sed 's/^/bf16 run: /' || true
grep -m1 "^warning: " "$tmp/bf16.log" | sed 's/^/bf16 run: /' || true
python3 - "$tmp/fp32.jsonl" "$tmp/bf16.jsonl" <<'PYEOF'
import json, statistics, sys
def read(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    loss = {r["step"]: r["loss"] for r in rows if "loss" in r}
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    return loss, val[-1]
(a, va), (b, vb) = read(sys.argv[1]), read(sys.argv[2])
steps = sorted(set(a) & set(b))
rel = sorted(abs(b[s] - a[s]) / a[s] for s in steps)
print(f"per-step |bf16 - fp32| / fp32 over {len(steps)} steps: median {rel[len(rel) // 2]:.4f}, "
      f"95th percentile {rel[int(0.95 * (len(rel) - 1))]:.4f}, max {rel[-1]:.4f}")
ok = True
for lo in range(1, steps[-1] + 1, 50):
    win = [s for s in steps if lo <= s < lo + 50]
    ma, mb = statistics.mean(a[s] for s in win), statistics.mean(b[s] for s in win)
    d = (mb - ma) / ma
    good = abs(d) <= 0.01
    ok &= good
    print(f"steps {lo:4d}-{win[-1]:4d}: mean loss fp32 {ma:.4f} bf16 {mb:.4f} ({100 * d:+.2f}%){'' if good else '  > 1%'}")
d = (vb - va) / va
ok &= abs(d) <= 0.01
print(f"final validation loss: fp32 {va:.4f} bf16 {vb:.4f} ({100 * d:+.2f}%){'' if abs(d) <= 0.01 else '  > 1%'}")
print("bf16 tracks fp32" if ok else "bf16 does NOT track fp32")
sys.exit(0 if ok else 1)
PYEOF
