#!/usr/bin/env python3
"""ncu_sass_mix.py SOURCE.csv [TOP]: where a kernel's instructions and stalls go, by SASS opcode.

SOURCE.csv is Nsight Compute's source page of one profiled kernel (`ncu --import R.ncu-rep --csv --page
source --print-source sass`, as tests/gpu/probe_attention.sh writes it): one row per SASS instruction with
its executed count, its warp-stall samples and the samples by stall reason. Prints, for the TOP (default
25) opcodes by executed instructions (HMMA kept with its shape, other opcodes without their modifiers):
the share of the kernel's instructions, the share of its stall samples, and the three commonest stall
reasons among that opcode's samples. Read it as: an opcode with a larger share of samples than of
instructions is where warps wait.
"""
import collections
import csv
import re
import sys

OPCODE = re.compile(r"(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)")


def opcode(source):
    m = OPCODE.match(source.strip())
    op = m.group(1) if m else source.strip()
    return op if op.startswith("HMMA") else op.split(".")[0]


def number(text):
    try:
        return float(text.replace(",", "")) if text else 0.0
    except ValueError:
        return 0.0


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__.splitlines()[0])
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    with open(sys.argv[1], newline="") as f:
        rows = list(csv.reader(f))
    head = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if head is None:
        sys.exit("%s: no 'Address' header row: not an ncu source page (--page source --csv)" % sys.argv[1])
    hdr = rows[head]
    col = {h: i for i, h in enumerate(hdr)}
    for need in ("Source", "Instructions Executed", "Warp Stall Sampling (All Samples)"):
        if need not in col:
            sys.exit("%s: no column %r" % (sys.argv[1], need))
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    inst, samples = collections.Counter(), collections.Counter()
    reasons = collections.defaultdict(collections.Counter)
    for r in rows[head + 1:]:
        if len(r) < len(hdr):
            continue
        op = opcode(r[col["Source"]])
        inst[op] += number(r[col["Instructions Executed"]])
        samples[op] += number(r[col["Warp Stall Sampling (All Samples)"]])
        for s in stalls:
            reasons[op][s[len("stall_"):]] += number(r[col[s]])
    n_inst, n_samples = sum(inst.values()) or 1.0, sum(samples.values()) or 1.0
    print("%s: %.0f warp instructions, %.0f stall samples" % (sys.argv[1], n_inst, n_samples))
    print("%-22s %7s %9s  %s" % ("opcode", "% inst", "% samples", "top stall reasons (% of its samples)"))
    for op, n in inst.most_common(top):
        why = ", ".join("%s %.0f%%" % (k, 100.0 * v / samples[op]) for k, v in reasons[op].most_common(3) if v) \
            if samples[op] else ""
        print("%-22s %6.1f%% %8.1f%%  %s" % (op, 100.0 * n / n_inst, 100.0 * samples[op] / n_samples, why))


if __name__ == "__main__":
    main()
