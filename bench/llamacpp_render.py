#!/usr/bin/env python3
"""bench/llamacpp_render.py RESULTS_MD RESULTS_JSONL...: the llama.cpp comparison of bench/llamacpp.sh (one
JSONL file per run, e.g. one per thread count, each its own subsection) as a Markdown section of RESULTS_MD, between <!-- llamacpp-section:begin --> and <!-- llamacpp-section:end -->
(appended when the markers are missing; the rest of the file is kept). Standard library only.

Every figure is a median over all measured runs of its row (llama-bench's samples and bench_decode's
runs, from every round); ratios are shardlm / llama.cpp, so above 1 means shardlm is faster."""
import statistics
import sys

from bench_util import read_jsonl, replace_section

BEGIN, END = "<!-- llamacpp-section:begin -->", "<!-- llamacpp-section:end -->"
# (shardlm precision, llama.cpp GGUF type) pairs, as the script measures them
PAIRS = [("fp32", "f32"), ("bf16", "f16"), ("bf16", "bf16")]


def load(path):
    meta, end, llama, shard = {}, {}, {}, {}
    for r in read_jsonl(path):
        if r.get("meta"):
            meta = r
        elif r.get("meta_end"):
            end = r
        elif r.get("impl") == "llama.cpp":
            llama.setdefault(r.get("bench_model", "gpt2"), {}).setdefault((r["type"], r["phase"]), []).append(r)
        elif r.get("impl") == "shardlm-decode":
            shard.setdefault(r.get("bench_model", "gpt2"), {}).setdefault(r["precision"], []).append(r)
    return meta, end, llama, shard


# what bench/llamacpp.sh measures under each bench_model name
MODELS = {
    "gpt2": "GPT-2 124M",
    "llama": "a LLaMA of GPT-2 124M's size (hidden 768, 12 layers, 12 heads with 4 KV heads (GQA), "
             "intermediate 2048, RoPE, RMSNorm, SwiGLU, untied head, GPT-2's 50257-token vocabulary; 152M "
             "parameters)",
}


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def llama_rates(rows):
    return [s for r in rows for s in r["samples_ts"]]


def fmt(x, digits=1):
    return "n/a" if x != x else f"{x:.{digits}f}"


def render_model(model, meta, llama, shard):
    out = [f"#### {MODELS.get(model, model)}", ""]
    out.append("| shardlm | llama.cpp | prefill tok/s shardlm | llama.cpp | ratio | decode tok/s shardlm | "
               "llama.cpp | ratio | weight reads GB/s shardlm / llama.cpp | machine read GB/s |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for prec, gtype in PAIRS:
        s_rows = shard.get(prec, [])
        s_pre = med([run[0] for r in s_rows for run in r["runs"]])
        s_dec = med([run[1] for r in s_rows for run in r["runs"]])
        l_pre = med(llama_rates(llama.get((gtype, "prefill"), [])))
        l_dec_rows = llama.get((gtype, "decode"), [])
        l_dec = med(llama_rates(l_dec_rows))
        s_bytes = s_rows[0]["weight_bytes"] if s_rows else float("nan")
        # the GGUF's bytes less the embedding tables a token reads one row of (bench_decode's count; stored
        # at the file's type, f32 4 bytes, f16 / bf16 2); files from before that count keep every byte
        unread = s_rows[0].get("unread_params", 0) if s_rows else 0
        l_bytes = l_dec_rows[0]["model_size"] - unread * (4 if gtype == "f32" else 2) if l_dec_rows else float("nan")
        bw = med([r["machine_read_gb_s"] for r in s_rows])
        out.append(
            f"| {prec} ({s_rows[0]['ops'] if s_rows else '?'}) | {gtype} | {fmt(s_pre)} | {fmt(l_pre)} | "
            f"{fmt(s_pre / l_pre, 2)} | {fmt(s_dec, 2)} | {fmt(l_dec, 2)} | {fmt(s_dec / l_dec, 2)} | "
            f"{fmt(s_bytes * s_dec / 1e9)} / {fmt(l_bytes * l_dec / 1e9)} | {fmt(bw)} |")
    out.append("")
    out.append(
        "Weight reads: the bytes of every weight a decoded token reads, once (shardlm: its parameters at 4 or 2 "
        "bytes; llama.cpp: the GGUF's tensor bytes, norms and biases in f32; both without the embedding tables "
        "a token takes one row of: GPT-2's wpe, and wte where the head is untied), times decode tok/s. Machine "
        "read GB/s: bench_decode's sum over a 1 GiB buffer with the same threads, best of 5, measured in the "
        "same run.")
    out.append("")
    out.append(f"Where shardlm's decode time goes ({meta.get('threads', '?')} thread(s); ms per decoded token, "
               "profiled run of the first round):")
    out.append("")
    names = []
    for prec in ("fp32", "bf16"):
        for r in shard.get(prec, []):
            for k in r.get("decode_breakdown_ms", {}):
                if k not in names:
                    names.append(k)
    out.append("| op | " + " | ".join(p for p in ("fp32", "bf16") if shard.get(p)) + " |")
    out.append("|---|" + "---|" * sum(1 for p in ("fp32", "bf16") if shard.get(p)))
    for k in names + ["(outside ops)"]:
        cells = []
        for prec in ("fp32", "bf16"):
            rows = [r for r in shard.get(prec, []) if "decode_breakdown_ms" in r]
            if not shard.get(prec):
                continue
            key = "decode_other_ms"
            vals = [r[key] if k == "(outside ops)" else r["decode_breakdown_ms"].get(k, 0.0) for r in rows]
            cells.append(fmt(med(vals), 2))
        out.append(f"| {k} | " + " | ".join(cells) + " |")
    out.append("")
    out.append(
        "matmul_forward and matmul_gelu_forward at one row are the GEMV of src/ops/cpu/gemv.c (fp32: "
        "vectorised C; bf16: vdpbf16ps); the lm head (50304 x 768) is one of the matmul_forward calls. "
        "LLaMA's linears (fused qkv, fused gate/up, down, the head) are all matmul_forward. "
        "The per-shape tables of the profiled runs are in $LLAMA_WORK/bench_decode.log.")
    out.append("")
    return out


def render(meta, end, llama, shard):
    out = [f"### {meta.get('threads', '?')} thread(s)", ""]
    out.append(
        f"Machine: {meta.get('cpu', '?')}, {meta.get('cores', '?')} cores; {meta.get('date', '?')}; shardlm "
        f"{meta.get('commit', '?')}; llama.cpp from the {meta.get('llama_cpp', '?')} sdist (llama-bench, CPU "
        f"only, GGML_NATIVE). Each model saved by shardlm in Hugging Face format (one training step), "
        f"converted by llama.cpp's convert_hf_to_gguf.py. {meta.get('threads', '?')} threads, prompt {meta.get('prompt', '?')} tokens, "
        f"{meta.get('gen', '?')} decoded tokens after it (llama-bench `-p {meta.get('prompt')} -n 0` for "
        f"prefill, `-p 0 -n {meta.get('gen')} -d {meta.get('prompt')}` for decode at the same depth); "
        f"{meta.get('rounds', '?')} rounds, each side back to back in every round; medians of every run.")
    # the kernel's transparent huge page mode bench_decode saw (older result files lack it)
    thp = next((r["thp"] for rows in shard.values() for rs in rows.values() for r in rs if r.get("thp")), None)
    if thp:
        out[-1] += (f" Transparent huge pages: `{thp}` (shardlm's weights are on huge pages unless it is "
                    "`never`; llama.cpp maps the GGUF file).")
    out.append("")
    # the 1-minute averages, which include the benchmark's own threads: above them (+ 0.5) something
    # else was running
    ones = [float(s.split()[0]) for s in (meta.get("load_before", ""), end.get("load_after", "")) if s.split()]
    shared = any(x > float(meta.get("threads", 1)) + 0.5 for x in ones)
    out.append(
        f"Load average before / after (1, 5, 15 min): {meta.get('load_before', '?')} / "
        f"{end.get('load_after', '?')} on {meta.get('cores', '?')} cores. " +
        ("**The machine was shared** with other jobs during this run: figures moved by 2x or more from run "
         "to run, for both programs alike (both wait for every thread at each op's barrier, which an "
         "oversubscribed machine punishes); the ratios, measured interleaved, are the figures to read."
         if shared else "The machine was quiet: the 1-minute load stayed within the benchmark's own "
         "threads + 0.5."))
    out.append("")
    for model in shard:
        out += render_model(model, meta, llama.get(model, {}), shard[model])
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: llamacpp_render.py RESULTS_MD RESULTS_JSONL...")
    parts = [render(*load(p)) for p in sys.argv[2:]]
    section = "\n".join([BEGIN, "", "## Generation at batch 1: shardlm against llama.cpp (`bench/llamacpp.sh`)", ""]
                        + parts + [END]) + "\n"
    replace_section(sys.argv[1], BEGIN, END, section)

if __name__ == "__main__":
    main()
