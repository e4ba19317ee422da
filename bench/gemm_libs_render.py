"""gemm_libs_render.py RESULTS_MD RESULTS_JSONL: renders bench/gemm_libs.sh's runs (OpenBLAS against
oneDNN's sgemm in whole fp32 training steps) as the Markdown section of RESULTS_MD between
<!-- gemm-libs-section:begin --> and <!-- gemm-libs-section:end -->."""
import statistics
import sys

from bench_util import read_jsonl, replace_section

BEGIN, END = "<!-- gemm-libs-section:begin -->", "<!-- gemm-libs-section:end -->"
LIBS = ("openblas", "onednn")
CONFIG_NAMES = {"gpt2-full": "GPT-2 124M, full training", "gpt2-lora": "GPT-2 124M, LoRA r 16",
                "llama-lora": "LLaMA (768, 12 layers, 2048, vocab 32000), LoRA r 16"}


def main():
    rows = read_jsonl(sys.argv[2])
    meta = next((r for r in rows if r.get("meta")), {})
    runs = [r for r in rows if not r.get("meta")]
    configs = [c for c in CONFIG_NAMES if any(r["config"] == c for r in runs)]
    out = [BEGIN, "", "## CPU GEMM library: OpenBLAS against oneDNN's sgemm in fp32 training (`bench/gemm_libs.sh`)", "",
           f"{meta.get('date', '?')}, commit {meta.get('commit', '?')}; {meta.get('cpu', '?')}, {meta.get('cores', '?')} "
           f"cores, {meta.get('os', '?')}; Debian's OpenBLAS {meta.get('openblas_pkg', '?')} and oneDNN "
           f"{meta.get('onednn_pkg', '?')}. `build/bench_train`, B=4, T=256, {meta.get('threads', '?')} threads, "
           f"{meta.get('rounds', '?')} rounds with the two libraries interleaved (`SHARDLM_GEMM=openblas|onednn`), each run "
           f"{meta.get('warmup', '?')} warmup + {meta.get('steps', '?')} timed steps; ms/step is the median over the rounds "
           "of each run's median step. Library names as the runs reported them:", ""]
    for lib in LIBS:
        name = next((r.get("gemm") for r in runs if r["lib"] == lib and r.get("gemm")), "?")
        out.append(f"- `{lib}`: {name}")
    out += ["", "| configuration | OpenBLAS ms/step | oneDNN ms/step | oneDNN speed-up | rounds | other load (max) |",
            "|---|---|---|---|---|---|"]
    for c in configs:
        med = {}
        for lib in LIBS:
            v = [r["ms_per_step_median"] for r in runs if r["config"] == c and r["lib"] == lib]
            med[lib] = statistics.median(v) if v else None
        load = max((r.get("other_load", 0) for r in runs if r["config"] == c), default=0)
        n = sum(1 for r in runs if r["config"] == c and r["lib"] == LIBS[0])
        ratio = f"**{med['openblas'] / med['onednn']:.3f}x**" if med["openblas"] and med["onednn"] else "n/a"
        fmt = lambda x: f"{x:.1f}" if x else "n/a"
        out.append(f"| {CONFIG_NAMES[c]} | {fmt(med['openblas'])} | {fmt(med['onednn'])} | {ratio} | {n} | {load:.2f} |")
    out += ["", "GEMM rate by shape in the profiled steps (GFLOP/s, median over the rounds; N rows, IC inputs, OC "
            "outputs of the linear layer; forward = `inp @ W^T`, backward = `dout @ W` plus `dout^T @ inp` where "
            "the weight is trained):", ""]
    for c in configs:
        shapes = []
        for r in runs:
            if r["config"] == c:
                for s in r.get("matmul_shapes", []):
                    if s["shape"] not in shapes: shapes.append(s["shape"])
        if not shapes: continue
        out += [f"{CONFIG_NAMES[c]}:", "", "| GEMM | calls/step | OpenBLAS GFLOP/s | oneDNN GFLOP/s | oneDNN/OpenBLAS |",
                "|---|---|---|---|---|"]
        for sh in shapes:
            seen = [(r["lib"], s) for r in runs if r["config"] == c for s in r.get("matmul_shapes", [])
                    if s["shape"] == sh]
            calls = max(s["calls"] for _, s in seen)
            rate = {lib: statistics.median([s["gflops"] for l, s in seen if l == lib]) if any(l == lib for l, _ in seen)
                    else None for lib in LIBS}
            q = f"{rate['onednn'] / rate['openblas']:.2f}" if rate["openblas"] and rate["onednn"] else "n/a"
            out.append(f"| {sh} | {calls:g} | {rate['openblas'] or 0:.1f} | {rate['onednn'] or 0:.1f} | {q} |")
        out.append("")
    out.append(END)
    replace_section(sys.argv[1], BEGIN, END, "\n".join(out) + "\n")


if __name__ == "__main__":
    main()
