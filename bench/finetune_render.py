#!/usr/bin/env python3
"""bench/finetune_render.py RESULTS_MD RESULTS_JSONL: the fine-tuning comparison of bench/finetune.sh as a
Markdown section of RESULTS_MD, between <!-- finetune-section:begin --> and <!-- finetune-section:end -->
(appended when the markers are missing; the rest of the file is kept). Standard library only.

Per model and row, every figure is the median over the rounds that ran (each round one fresh process
per row); ratios are shardlm / PyTorch, so a tok/s ratio above 1 means shardlm is faster and a memory
ratio below 1 that shardlm holds less."""
import re
import statistics
import sys

from bench_util import read_jsonl, replace_section

BEGIN, END = "<!-- finetune-section:begin -->", "<!-- finetune-section:end -->"
ROWS = [("shardlm", "full", "shardlm full fine-tune"), ("pytorch", "full", "PyTorch full fine-tune"),
        ("shardlm", "lora", "shardlm LoRA"), ("pytorch", "lora", "PEFT LoRA"),
        ("shardlm", "dora", "shardlm DoRA"), ("pytorch", "dora", "PEFT DoRA"),
        ("shardlm", "qlora", "shardlm QLoRA (NF4 base)"), ("pytorch", "qlora", "PEFT + bitsandbytes QLoRA (NF4 base)")]
TITLES = {"gpt2": "GPT-2 124M (12 layers, C=768, vocab 50257, tied head)",
          "llama": "LLaMA of GPT-2 small's size (hidden 768, 12 layers, intermediate 2048, vocab 32000, untied head)"}


def load(path):
    """The run's header and end lines, the timed runs by (arch, precision, impl, mode), and the profiled
    passes of the LoRA rows by (arch, precision, impl) (the last of each)."""
    meta, end, runs, profiles = {}, {}, {}, {}
    for r in read_jsonl(path):
        if r.get("meta"):
            meta = r
        elif r.get("meta_end"):
            end = r
        elif r.get("profile_of"):
            profiles[(r["arch"], r.get("precision", "fp32"), r["impl"])] = r
        else:
            runs.setdefault((r["arch"], r.get("precision", "fp32"), r["impl"], r["mode"]), []).append(r)
    return meta, end, runs, profiles


# shardlm's profiled ops by category, as torch_finetune.py's PROFILE_CATEGORIES groups PyTorch's: the matrix
# products (the base linears, GPT-2's GELU and its gradient inside matmul_gelu_*, and the adapters'), attention
# and the loss; "other" is the rest of the profiled step (norms, activations, optimizer, time outside ops).
def shardlm_categories(breakdown):
    cat = {"gemm": 0.0, "attention": 0.0, "cross_entropy": 0.0}
    for op, ms in breakdown.items():
        if op.startswith(("matmul", "lora_")):
            cat["gemm"] += ms
        elif op.startswith("attention"):
            cat["attention"] += ms
        elif op.startswith("crossentropy"):
            cat["cross_entropy"] += ms
    return cat


# A profiled pass whose step is this far (as a fraction) from its row's timed median ran at another speed
# of the machine than the rounds did (the CPU's clock or memory, shared with other machines, move; other
# load does not show that): its split is still shown, the ratios between the two passes are not.
PROFILE_DRIFT = 0.25


def render_profile(arch, precision, profiles, fig):
    """Where the LoRA step's time goes on each side, and the ratio that equal matrix-product time allows."""
    s, p = profiles.get((arch, precision, "shardlm")), profiles.get((arch, precision, "pytorch"))
    if not s and not p:
        return []
    out = ["Where the LoRA step's time goes (one profiled pass per side after the rounds, a fresh process each, "
           "ms per step; shardlm: the profiling ops table through `bench_train --lora-r` on the model's config "
           "with random weights and tokens; PEFT: torch.profiler's self CPU time per op):", "",
           "| side | profiled step | matrix products | attention | cross-entropy | everything else |",
           "|---|---|---|---|---|---|"]
    figs = {}
    for side, label in ((s, "shardlm LoRA"), (p, "PEFT LoRA")):
        if not side or side.get("status") != "ok":
            out.append(f"| {label} | {'failed: ' + side.get('error', '?') if side else 'not run'} | | | | |")
            continue
        cat = shardlm_categories(side["breakdown"]) if side["impl"] == "shardlm" else \
            {k: side[k + "_ms"] for k in ("gemm", "attention", "cross_entropy")}
        rest = side["step_ms"] - sum(cat.values())
        figs[side["impl"]] = (side["step_ms"], cat["gemm"])
        out.append(f"| {label} | {side['step_ms']:.1f} | {cat['gemm']:.1f} ({100 * cat['gemm'] / side['step_ms']:.0f}%) "
                   f"| {cat['attention']:.1f} | {cat['cross_entropy']:.1f} | {rest:.1f} |")
    out.append("")
    drifted = []
    for side, impl, label in ((s, "shardlm", "shardlm's"), (p, "pytorch", "PEFT's")):
        timed = fig.get((impl, "lora"))
        if impl in figs and timed and abs(figs[impl][0] / timed["ms_per_step"] - 1) > PROFILE_DRIFT:
            load = side.get("other_load")
            drifted.append(f"{label} profiled pass took {figs[impl][0]:.0f} ms a step against {timed['ms_per_step']:.0f} "
                           f"in its timed rounds (other load during the pass: "
                           f"{'n/a' if load is None else f'{load:.2f} cores'})")
    if len(figs) == 2 and drifted:
        out.append(f"Not compared: {'; '.join(drifted)}. More than {100 * PROFILE_DRIFT:.0f}% apart, the machine ran "
                   f"at another speed during the pass than during the rounds, so each side's split above holds for "
                   f"its own pass, and a ratio between the two passes would not describe the rounds.")
        out.append("")
    elif len(figs) == 2:
        (s_step, s_gemm), (p_step, p_gemm) = figs["shardlm"], figs["pytorch"]
        adapters = sum(ms for op, ms in s["breakdown"].items() if op.startswith("lora_"))
        out.append(
            f"The matrix products are the same work on both sides (every linear's forward and input gradient, the "
            f"frozen base's and the adapters'): shardlm's take {s_gemm:.0f} ms (the adapters' lora_forward / "
            f"lora_backward {adapters:.0f} of them), PyTorch's {p_gemm:.0f} ms. In these profiled steps shardlm ran at "
            f"{ratio(p_step, s_step):.2f}x PEFT's speed; were everything outside its matrix products free, it "
            f"would run at {ratio(p_step, s_gemm):.2f}x (PEFT's step over shardlm's matrix products): the "
            f"most a faster rest of the step can give at this GEMM rate.")
        out.append("")
    return out


def med(rows, key):
    xs = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def gb(x):
    return "n/a" if x is None else f"{x / 1e9:.2f} GB"


def ratio(x, y):
    return None if x is None or y is None or y == 0 else x / y


def unavailable(impl, mode, failed, message=True):
    """Why a row has no figure: train's refusal of a quantised base, or the failure's message."""
    err = failed[-1].get("error", "?") if failed else "not run"
    if impl == "shardlm" and mode == "qlora" and "quantiz" in err.lower():
        return "not available in this build (train refuses --quantize)" + (f": `{err}`" if message else "")
    return (f"failed: `{err}`" if message else "failed (below)") if failed else "not run"


PRECISION_TITLES = {"fp32": "fp32", "bf16": "bf16 (shardlm `--precision bf16`; PyTorch `torch.autocast(\"cpu\", torch.bfloat16)`)"}


def paired(runs, arch, precision, mode):
    """The tok/s ratio of each round's pair (the two sides ran back to back, so a slow drift of the machine
    moves both), as a clause; empty with fewer than two such rounds."""
    side = {impl: {r["round"]: r for r in runs.get((arch, precision, impl, mode), [])
                   if r.get("status") == "ok" and "round" in r} for impl in ("shardlm", "pytorch")}
    rounds = sorted(set(side["shardlm"]) & set(side["pytorch"]))
    if len(rounds) < 2:
        return ""
    rs = [ratio(side["shardlm"][k]["tokens_per_s"], side["pytorch"][k]["tokens_per_s"]) for k in rounds]
    return (f"; round by round {', '.join(f'{x:.2f}' for x in rs)}x (median {statistics.median(rs):.2f}x, "
            f"range {min(rs):.2f}-{max(rs):.2f}x)")


def render_model(arch, precision, runs, meta, profiles):
    out = [f"### {TITLES.get(arch, arch)}, {PRECISION_TITLES.get(precision, precision)}", ""]
    # the parameter count of the fp32 model (a 4-bit model's count holds two weights per byte as one)
    n = next((r["params"] for (a, _, i, m), rs in runs.items() if a == arch and i == "pytorch" and m != "qlora"
              for r in rs if r.get("params")), None)
    if n:
        out.append(f"{n:,} parameters.")
        out.append("")
    out.append("| row | trained parameters | ms/step | tok/s | peak RSS (whole run) | peak RSS (training) | "
               "first-step loss | other load (max) | rounds |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    fig = {}
    notes = []
    for impl, mode, label in ROWS:
        rs = runs.get((arch, precision, impl, mode), [])
        ok = [r for r in rs if r.get("status") == "ok"]
        failed = [r for r in rs if r.get("status") != "ok"]
        if not rs:
            continue
        if not ok:
            out.append(f"| {label} | {unavailable(impl, mode, failed, message=False)} | | | | | | | 0 of {len(rs)} |")
            if not (impl == "shardlm" and mode == "qlora"):  # the QLoRA line below quotes that one
                notes.append(f"- {label}: {unavailable(impl, mode, failed)}")
            fig[(impl, mode)] = None
            continue
        f = {k: med(ok, k) for k in ("ms_per_step", "peak_rss_bytes", "train_peak_rss_bytes", "first_loss")}
        f["tokens_per_s"] = 1e3 * ok[0]["B"] * ok[0]["T"] / f["ms_per_step"]  # of the median step time
        fig[(impl, mode)] = f
        loads = [r["other_load"] for r in ok if r.get("other_load") is not None]
        f["disturbed"] = not loads or max(loads) > 0.2
        load = "n/a" if not loads else f"{max(loads):.2f}" + (" *" if max(loads) > 0.2 else "")
        trained = ok[0].get("trainable_params")
        if trained is None and impl == "shardlm":
            trained = trained_from_lines(ok[0])
        out.append(f"| {label} | {'?' if trained is None else f'{trained:,}'} | {f['ms_per_step']:.1f} | "
                   f"{f['tokens_per_s']:.1f} | {gb(f['peak_rss_bytes'])} | {gb(f['train_peak_rss_bytes'])} | "
                   f"{f['first_loss']:.4f} | {load} | {len(ok)}{f' of {len(rs)}' if failed else ''} |")
        if failed:
            notes.append(f"- {label}: {len(failed)} run(s) {unavailable(impl, mode, failed)}")
        if impl == "pytorch" and any(r.get("gradient_checkpointing") for r in ok):
            notes.append(f"- {label}: gradient checkpointing was on")
    out.append("")
    imp = [r["import_rss_bytes"] for (a, pr, i, _), rs in runs.items() if a == arch and pr == precision and i == "pytorch"
           for r in rs if r.get("status") == "ok" and r.get("import_rss_bytes")]
    if imp:
        span = gb(min(imp)) if gb(min(imp)) == gb(max(imp)) else f"{gb(min(imp))} to {gb(max(imp))}"
        notes.insert(0, f"- PyTorch rows: the interpreter with torch, transformers and peft (and bitsandbytes) imported "
                        f"holds {span} resident before any model is loaded; it counts in their peaks.")
    out.extend(notes + ([""] if notes else []))
    out.append("Against the targets:")
    out.append("")
    for mode, label, who, theirs, speed_target, mem_target in (
            ("lora", "LoRA", "PEFT", "PEFT's", 1.5, ("below 1", lambda x: x < 1)),
            ("dora", "DoRA", "PEFT", "PEFT's", None, None),
            ("qlora", "QLoRA", "PEFT + bitsandbytes", "PEFT + bitsandbytes'", None, ("<= 1", lambda x: x <= 1))):
        s, p = fig.get(("shardlm", mode)), fig.get(("pytorch", mode))
        if mem_target is None and ("shardlm", mode) not in fig and ("pytorch", mode) not in fig:
            continue  # a row without a target, not run
        if s and p:
            tr = ratio(s["tokens_per_s"], p["tokens_per_s"])
            mr = ratio(s["peak_rss_bytes"], p["peak_rss_bytes"])
            tmr = ratio(s["train_peak_rss_bytes"], p["train_peak_rss_bytes"])
            verdict = "met" if speed_target and tr >= speed_target else "NOT met"
            if s["disturbed"] or p["disturbed"]:  # speed on a busy machine is no verdict; memory does not move
                verdict = "not judged: a row was disturbed (other load above 0.2)"
            speed = f"shardlm **{tr:.2f}x** {theirs} tok/s" + (
                f" (target >= {speed_target}x: {verdict})" if speed_target else "") + paired(runs, arch, precision, mode)
            target = f"; target {mem_target[0]}: {'met' if mem_target[1](mr) else 'NOT met'}" if mem_target else ""
            out.append(f"- {label}: {speed}; peak RSS **{mr:.2f}x** {theirs} ({gb(s['peak_rss_bytes'])} against "
                       f"{gb(p['peak_rss_bytes'])}{target})"
                       + (f"; while training {tmr:.2f}x" if tmr is not None else "") + ".")
        elif ("shardlm", mode) in fig and fig[("shardlm", mode)] is None:
            rs = runs.get((arch, precision, "shardlm", mode), [])
            out.append(f"- {label}: shardlm's row {unavailable('shardlm', mode, rs)}; no ratio."
                       + (f" {who} {label} ran at "
                          f"{p['tokens_per_s']:.1f} tok/s with a peak RSS of {gb(p['peak_rss_bytes'])}." if p else ""))
        else:
            out.append(f"- {label}: no ratio (a row is missing).")
    s, l = fig.get(("shardlm", "full")), fig.get(("shardlm", "lora"))
    if s and l:
        out.append(f"- shardlm LoRA against shardlm full fine-tuning: {ratio(l['tokens_per_s'], s['tokens_per_s']):.2f}x "
                   f"the tok/s, {ratio(l['peak_rss_bytes'], s['peak_rss_bytes']):.2f}x the peak RSS.")
    s, p = fig.get(("shardlm", "full")), fig.get(("pytorch", "full"))
    if s and p:
        out.append(f"- Full fine-tuning: shardlm {ratio(s['tokens_per_s'], p['tokens_per_s']):.2f}x PyTorch's tok/s, "
                   f"{ratio(s['peak_rss_bytes'], p['peak_rss_bytes']):.2f}x its peak RSS.")
    out.append("")
    out.extend(render_profile(arch, precision, profiles, fig))
    return out


def trained_from_lines(r):
    """shardlm's trained parameter count from train's output: the adapters' (memory line), else the model's."""
    m = re.search(r"adapters (\d+) parameters", r.get("memory_line", ""))
    if not m:
        m = re.search(r"\((?:GPT-2|LLaMA), (\d+) parameters", r.get("model_line", ""))
    return int(m.group(1)) if m else None


def render(meta, end, runs, profiles):
    ok = [r for rs in runs.values() for r in rs if r.get("status") == "ok"]
    py = next((r for r in ok if r["impl"] == "pytorch" and r.get("bitsandbytes")), None) or \
        next((r for r in ok if r["impl"] == "pytorch"), {})
    cpu_line = next((r.get("cpu_line") for r in ok if r.get("cpu_line")), "?")
    out = [BEGIN, "", "## Fine-tuning: shardlm LoRA / QLoRA against PEFT (+ bitsandbytes) (`bench/finetune.sh`)", ""]
    out.append(f"Generated by `bash bench/finetune.sh` from bench/finetune_results.jsonl; do not edit numbers by hand.")
    out.append("")
    out.append(f"- machine: {meta.get('cpu', '?')}, {meta.get('cores', '?')} cores, {meta.get('mem', '?')} memory, "
               f"{meta.get('os', '?')}; shardlm train's `{cpu_line}`")
    out.append(f"- date: {meta.get('date', '?')} to {end.get('date', '?')}; shardlm commit {meta.get('commit', '?')}, "
               f"{meta.get('gcc', '?')}, OpenBLAS {meta.get('openblas_pkg', '?')}")
    vers = ", ".join(f"{k} {py[k]}" for k in ("torch", "transformers", "peft", "bitsandbytes") if py.get(k))
    out.append(f"- PyTorch side: {vers or '?'}; eager, attention `sdpa`; fp32, or bf16: forward and loss under "
               "`torch.autocast(\"cpu\", torch.bfloat16)` with fp32 parameters, gradients and AdamW")
    out.append("- shardlm bf16: `--precision bf16` (DeepSpeed's bf16: fp32 master weights; bf16 activations and oneDNN "
               "bf16 GEMMs where the CPU has bf16 instructions, docs/precision.md)")
    out.append(
        f"- models: both sides load the same fp32 safetensors written by transformers with random weights "
        f"(`torch_finetune.py make`): GPT-2 124M (12 layers, 12 heads, C=768, vocab 50257, tied head) and a LLaMA "
        f"(hidden 768, 12 layers, 12 heads, intermediate 2048, vocab 32000, untied head); both train on the same "
        f"windows of one shard of uniform random tokens, in the same order (the first-step loss, the base model's "
        f"loss on window 0, agrees across rows)")
    out.append(
        f"- B={meta.get('B')}, T={meta.get('T')}, {meta.get('threads')} threads (OMP_NUM_THREADS, `--threads` / "
        f"`torch.set_num_threads`); LoRA r={meta.get('lora_r')}, alpha={meta.get('lora_alpha'):g}, dropout 0, every "
        f"linear of the blocks (GPT-2 `c_attn`, `c_proj`, `c_fc`: `c_proj` is both attn.c_proj and mlp.c_proj; LLaMA "
        f"`q_proj` ... `down_proj`); QLoRA: the same adapters on an NF4 base with double quantisation, compute in "
        f"the row's precision (shardlm `--quantize nf4`; PEFT on `BitsAndBytesConfig(load_in_4bit=True, "
        f"bnb_4bit_quant_type=\"nf4\", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32` or "
        f"`torch.bfloat16)`, device_map cpu)")
    out.append(
        "- a step: forward + cross-entropy over all B*T positions + backward + clip_grad_norm(1.0) + AdamW (lr 1e-4 "
        "constant, betas 0.9/0.95, eps 1e-8, weight decay 0) over the trained parameters; shardlm is `shardlm train` "
        "itself (its step time from the metrics file's elapsed_s, which also covers reading the batch and writing "
        "one metrics line, microseconds); PyTorch times each step from its batch to after `opt.step()`")
    out.append(
        f"- each run is a fresh process: {meta.get('warmup')} untimed + {meta.get('steps')} timed steps; "
        f"{meta.get('rounds')} round(s), the two sides of a pair back to back (which goes first alternates by "
        "round); every figure is the median over rounds (tok/s = B*T / the median ms/step)")
    out.append(
        "- peak RSS, measured outside the process the same way for both (bench/finetune_run.py): **whole run** = "
        "the largest resident set from start to exit (`ru_maxrss` of the child from `wait4`, together with VmHWM "
        "read before it is reset; what `/usr/bin/time -v` reports), loading and quantising included; **training** "
        "= the largest resident set after the first step (the kernel's high-water mark reset through "
        "/proc/PID/clear_refs when the first step's line arrives): the steady state. PyTorch's figures include "
        "the interpreter and the imported libraries (torch alone is a few hundred MB)")
    out.append(
        "- other load: cores' worth of CPU used by anything else during the timed steps (/proc/stat minus the "
        "child's utime + stime), the largest over rounds; above 0.2 (marked *) the row was disturbed")
    out.append("")
    # the benchmark itself keeps about FT_THREADS cores busy, so the load average says little: the rows'
    # other load (everything else, measured during the timed steps) says whether the machine was shared
    others = [r["other_load"] for r in ok if r.get("other_load") is not None]
    worst = max(others) if others else None
    out.append(f"Load average before / after (1, 5, 15 min): {meta.get('load_before', '?')} / "
               f"{end.get('load_after', '?')} (the benchmark's own threads included). " +
               ("No row's other load was measured." if worst is None else
                f"**The machine was shared during this run** (other load up to {worst:.2f} cores): rows marked * "
                "moved with the other jobs; rerun on a quiet machine before reading their ratios." if worst > 0.2 else
                f"The machine was quiet: other load at most {worst:.2f} cores in every timed row."))
    out.append("")
    for arch in meta.get("models", ["gpt2", "llama"]):
        for precision in meta.get("precisions", ["fp32"]):
            if any(k[0] == arch and k[1] == precision for k in runs):
                out.extend(render_model(arch, precision, runs, meta, profiles))
    out.append("Raw JSON lines: bench/finetune_results.jsonl; the runs' output: $FT_WORK/finetune.log.")
    out.append("")
    out.append(END)
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: finetune_render.py RESULTS_MD RESULTS_JSONL")
    section = render(*load(sys.argv[2]))
    replace_section(sys.argv[1], BEGIN, END, section)

if __name__ == "__main__":
    main()
