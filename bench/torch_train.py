#!/usr/bin/env python3
"""torch_train.py: the PyTorch side of `make bench`. Same configuration as bench/bench_train.c:
transformers GPT2LMHeadModel with the preset's shape (n_layer, n_head, n_embd, n_positions,
vocab 50257, tied embeddings, dropout 0), fp32, torch.set_num_threads(N), AdamW (lr 1e-4,
betas 0.9/0.95, eps 1e-8, weight decay 0.1 on weight matrices only: norms, biases and embeddings
undecayed, as shardlm does; foreach default), clip_grad_norm_(1.0), random token batches; times W warmup + S steps
(zero_grad + forward + cross-entropy + backward + clip + optimizer step) and prints one JSON line
shaped like bench_train's. Attention is "sdpa" (torch's fused scaled_dot_product_attention) by
default; --attn eager selects the explicit softmax(QK^T)V path. --compile wraps the model in
torch.compile (inductor) and counts compilation in the warmup steps only. --precision bf16 runs
forward and loss under torch.autocast("cpu", dtype=torch.bfloat16) (fp32 parameters and optimizer,
bf16 GEMMs through oneDNN where the CPU has bf16 instructions): what a PyTorch user runs for bf16.

  python3 bench/torch_train.py --model gpt2 --batch 4 --seq 256 --threads 2 --steps 3 --warmup 1
"""
import argparse
import json
import os
import sys
import time

from bench_util import machine_busy_seconds, step_times_ms

PRESETS = {  # name: (n_layer, n_head, n_embd, n_positions), as src/model/config.c
    "gpt2": (12, 12, 768, 1024),
    "gpt2-medium": (24, 16, 1024, 1024),
    "gpt2-demo": (4, 4, 256, 256),
    "gpt2-tiny": (2, 4, 32, 64),
}
VOCAB = 50257


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2-demo", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--profile", action="store_true", help="also print torch.profiler's top ops to stderr")
    a = ap.parse_args()

    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    L, H, C, P = PRESETS[a.model]
    if a.seq > P:
        sys.exit(f"torch_train: --seq {a.seq} exceeds {a.model}'s {P} positions")
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=P, n_embd=C, n_layer=L, n_head=H, n_inner=4 * C,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     layer_norm_epsilon=1e-5, tie_word_embeddings=True, use_cache=False)
    cfg._attn_implementation = a.attn
    model = GPT2LMHeadModel(cfg).float().train()
    attn_used = getattr(model.config, "_attn_implementation", a.attn)
    n_params = sum(p.numel() for p in model.parameters())

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "wte" not in n and "wpe" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "wte" not in n and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)

    fwd = torch.compile(model) if a.compile else model
    g = torch.Generator().manual_seed(a.seed)

    def batch():
        tok = torch.randint(0, VOCAB, (a.batch, a.seq + 1), generator=g)
        return tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    import contextlib
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.precision == "bf16" else contextlib.nullcontext

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with autocast():
            logits = fwd(input_ids=x).logits
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    t_compile = time.perf_counter()
    for _ in range(a.warmup):
        step(*batch())
    t_compile = time.perf_counter() - t_compile
    times, loss = [], float("nan")
    busy0, own0, wall0 = machine_busy_seconds(), time.process_time(), time.perf_counter()
    for _ in range(a.steps):
        x, y = batch()
        t0 = time.perf_counter()
        loss = step(x, y)
        times.append(time.perf_counter() - t0)
    wall, own = time.perf_counter() - wall0, time.process_time() - own0
    busy1 = machine_busy_seconds()
    # cores' worth of CPU that other processes (or the hypervisor: steal) used during the timed steps
    other_load = max(0.0, (busy1 - busy0 - own) / wall) if busy0 is not None and busy1 is not None else -1
    mean = sum(times) / len(times)
    out = {
        "impl": "pytorch" + ("-compile" if a.compile else ""), "model": a.model, "B": a.batch, "T": a.seq,
        "threads": a.threads, "steps": a.steps, "warmup": a.warmup, "attn": attn_used, "precision": a.precision,
        **step_times_ms(times), "tokens_per_s": round(a.batch * a.seq / mean, 2),
        "loss": round(loss, 5), "params": n_params, "warmup_s": round(t_compile, 2),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "other_load": round(other_load, 2), "own_cpu_util": round(own / wall, 2),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
    }
    if a.profile:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(*batch())
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)
        top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]
        out["profile_top_ms"] = {e.key: round(e.self_cpu_time_total / 1e3, 3) for e in top}
        mm = sum(e.self_cpu_time_total for e in prof.key_averages()
                 if e.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul"))
        tot = sum(e.self_cpu_time_total for e in prof.key_averages())
        out["gemm_fraction"] = round(mm / tot, 4) if tot else None
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
