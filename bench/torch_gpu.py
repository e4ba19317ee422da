#!/usr/bin/env python3
"""torch_gpu.py: the PyTorch side of the GPU benchmark (bench/gpu.sh), shaped like bench_train's JSON.

Model (--arch nano, the default): a minimal nanoGPT-style GPT-2 written here: learned positions, pre-LN
blocks, fused qkv Linear, F.scaled_dot_product_attention(is_causal=True) (on cuda under bf16 only the
FLASH backend is enabled, so a step that cannot use flash attention fails instead of silently taking
another path), tanh GELU, tied lm_head; vocabulary padded to a multiple of 128 as shardlm pads it (50257 -> 50304), the
loss over the first 50257 columns as shardlm computes it; GPT-2 init (N(0, 0.02), residual projections
scaled by 1/sqrt(2L), padded rows zero). --arch hf: transformers' GPT2LMHeadModel from a config
(random init, attn_implementation "sdpa", unpadded vocabulary), same loss.

Precision (--precision bf16, the default): fp32 parameters (the master weights), forward under
torch.autocast(dtype=torch.bfloat16) (bf16 GEMMs and attention, fp32 accumulation, fp32 loss), fp32
gradients and optimizer: the "fp32 master + bf16 compute" that shardlm's --precision bf16 does.
--precision fp32: no autocast.

One step, as bench_train's: forward + cross-entropy + backward + clip_grad_norm_(1.0) + AdamW
(fused=True; lr 1e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on weight matrices only) +
zero_grad(set_to_none=True), on random tokens drawn on the device before the clock starts.
torch.cuda.synchronize() before each step's clock starts; loss.item() at its end waits for the step.
--mode compile wraps the model (forward and loss) in torch.compile (inductor, default mode); the
warmup steps include compilation (warmup_s). Memory: torch.cuda.max_memory_allocated (reset after
the previous try) and max_memory_reserved.

--batch N | N1,N2,... | auto (--max-batch M: M, M/2, ..., 1): tries each in order and keeps the first
that runs a step; an out-of-memory try is freed and reported in "batch_search".
--profile: one more step under torch.profiler; the top device kernels and their time by category.
--gemm: instead of training, the matmul rate on random square matrices (bf16, fp32, tf32), median of
--gemm-repeats products each timed with CUDA events after warmup: the MFU denominator.
--device cpu: the same logic on the CPU (a debugging aid for machines without a GPU; --model
gpt2-tiny), timed with perf_counter.

  python3 bench/torch_gpu.py --model gpt2 --seq 1024 --batch auto --mode compile --steps 10 --warmup 3
  python3 bench/torch_gpu.py --gemm --gemm-size 8192
"""
import argparse
import gc
import json
import math
import sys
import time

PRESETS = {  # name: (n_layer, n_head, n_embd, n_positions, vocab), as src/model/config.c
    "gpt2": (12, 12, 768, 1024, 50257),
    "gpt2-medium": (24, 16, 1024, 1024, 50257),
    "gpt2-demo": (4, 4, 256, 256, 50257),
    "gpt2-tiny": (2, 4, 32, 64, 100),
}


def padded(v, multiple=128):
    return (v + multiple - 1) // multiple * multiple


def build_nano(torch, L, H, C, P, V, Vp):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(Vp, C), nn.Embedding(P, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, Vp, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)
            with torch.no_grad():
                self.wte.weight[V:].zero_()

        def forward(self, idx, targets):
            T = idx.size(1)
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            for block in self.blocks:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits[..., :V].reshape(-1, V).float(), targets.reshape(-1))

    return GPT()


def build_hf(torch, L, H, C, P, V):
    from transformers import GPT2Config, GPT2LMHeadModel
    F = torch.nn.functional
    cfg = GPT2Config(vocab_size=V, n_positions=P, n_embd=C, n_layer=L, n_head=H, n_inner=4 * C,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     layer_norm_epsilon=1e-5, tie_word_embeddings=True, use_cache=False)
    cfg._attn_implementation = "sdpa"

    class HF(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = GPT2LMHeadModel(cfg)

        def forward(self, idx, targets):
            logits = self.m(input_ids=idx).logits
            return F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1))

    return HF()


def is_oom(e):
    return "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"


class Bench:
    def __init__(self, a, torch):
        self.a, self.torch = a, torch
        self.cuda = a.device.startswith("cuda")
        self.dev = torch.device(a.device)
        self.L, self.H, self.C, self.P, self.V = PRESETS[a.model]
        self.Vp = padded(self.V) if a.arch == "nano" else self.V
        self.gen = torch.Generator(device=self.dev).manual_seed(a.seed)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def build(self):
        torch, a = self.torch, self.a
        torch.manual_seed(a.seed)
        if a.arch == "nano":
            model = build_nano(torch, self.L, self.H, self.C, self.P, self.V, self.Vp)
        else:
            model = build_hf(torch, self.L, self.H, self.C, self.P, self.V)
        model = model.to(self.dev).train()
        named = list(model.named_parameters())  # the tied weight appears once
        emb = lambda n: "wte" in n or "wpe" in n
        decay = [p for n, p in named if p.dim() >= 2 and not emb(n)]
        no_decay = [p for n, p in named if not (p.dim() >= 2 and not emb(n))]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
        fwd = torch.compile(model) if a.mode == "compile" else model
        return model, fwd, opt

    def batch(self, B):
        tok = self.torch.randint(0, self.V, (B, self.a.seq + 1), device=self.dev, generator=self.gen)
        return tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    def step(self, model, fwd, opt, x, y):
        torch = self.torch
        if self.a.precision == "bf16":
            with torch.autocast(device_type=self.dev.type, dtype=torch.bfloat16):
                loss = fwd(x, y)
        else:
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    def free(self):
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()
        if self.a.mode == "compile":
            self.torch._dynamo.reset()

    def find_batch(self, candidates):
        """Builds and runs one step at each candidate B until one fits: (B, model, fwd, opt, seconds, tries)."""
        tries = []
        for B in candidates:
            self.free()
            if self.cuda:
                self.torch.cuda.reset_peak_memory_stats()
            t0, failed, state = time.perf_counter(), None, None
            try:
                model, fwd, opt = self.build()
                self.step(model, fwd, opt, *self.batch(B))
                self.sync()
                state = (model, fwd, opt)
            except Exception as e:  # noqa: BLE001 (an OOM can surface wrapped by dynamo / inductor)
                if not is_oom(e):
                    raise
                failed = str(e).splitlines()[0][:200]
            model = fwd = opt = None
            tries.append({"B": B, "fits": int(state is not None)})
            if state is not None:
                print(f"torch_gpu: B={B} fits", file=sys.stderr)
                return (B, *state, time.perf_counter() - t0, tries)
            print(f"torch_gpu: B={B} does not fit: {failed}", file=sys.stderr)
        sys.exit(f"torch_gpu: no micro-batch of {candidates} fits")

    def profile(self, model, fwd, opt, B):
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        x, y = self.batch(B)
        self.sync()
        with profile(activities=acts) as prof:
            self.step(model, fwd, opt, x, y)
            self.sync()
        kernels = {}
        for e in prof.key_averages():
            if self.cuda:
                t = getattr(e, "self_device_time_total", None)
                if t is None:
                    t = getattr(e, "self_cuda_time_total", 0)
                if "cuda" not in str(getattr(e, "device_type", "")).lower():
                    continue
            else:
                t = e.self_cpu_time_total
            if t > 0:
                kernels[e.key] = kernels.get(e.key, 0.0) + t / 1e3
        cats = {}
        for name, ms in kernels.items():
            cats[category(name)] = cats.get(category(name), 0.0) + ms
        top = sorted(kernels.items(), key=lambda kv: -kv[1])[:20]
        return {"profile_total_ms": round(sum(kernels.values()), 3),
                "profile_categories_ms": {k: round(v, 3) for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
                "profile_top_ms": {k[:160]: round(v, 3) for k, v in top}}


def category(name):
    n = name.lower()
    if any(s in n for s in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_", "aten::mm", "aten::addmm",
                            "aten::bmm")):
        return "gemm"
    if any(s in n for s in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if any(s in n for s in ("adam", "multi_tensor", "foreach", "norm_kernel")) and "layer" not in n:
        return "optimizer+clip"
    if any(s in n for s in ("cross_entropy", "log_softmax", "nll_loss", "softmax")):
        return "cross-entropy"
    if "triton" in n:
        return "fused (inductor/triton)"
    return "other"


def gemm_rates(a, torch):
    """Matmul rate on random square matrices: bf16, fp32 (no TF32), tf32."""
    cuda = a.device.startswith("cuda")
    S, R = a.gemm_size, a.gemm_repeats
    out = []
    for label, dtype, tf32 in (("bf16", torch.bfloat16, False), ("fp32", torch.float32, False),
                               ("tf32", torch.float32, True)):
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        elif tf32:
            continue
        g = torch.Generator(device=a.device).manual_seed(a.seed)
        # two operand sets, alternated, so no product reuses the previous one's operands in cache
        mats = [(torch.randn(S, S, device=a.device, dtype=dtype, generator=g),
                 torch.randn(S, S, device=a.device, dtype=dtype, generator=g)) for _ in range(2)]
        c = torch.empty(S, S, device=a.device, dtype=dtype)
        reps = R if label == "bf16" else max(5, R // 5)
        for i in range(5):
            torch.matmul(*mats[i % 2], out=c)
        times = []
        for i in range(reps):
            if cuda:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                torch.matmul(*mats[i % 2], out=c)
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1) / 1e3)
            else:
                t0 = time.perf_counter()
                torch.matmul(*mats[i % 2], out=c)
                times.append(time.perf_counter() - t0)
        times.sort()
        med = times[len(times) // 2] if len(times) % 2 else 0.5 * (times[len(times) // 2 - 1] + times[len(times) // 2])
        fl = 2.0 * S ** 3
        out.append({"impl": "torch-gemm", "dtype": label, "size": S, "repeats": reps, "device": a.device,
                    "ms_median": round(1e3 * med, 4), "ms_min": round(1e3 * times[0], 4),
                    "tflops_median": round(fl / med / 1e12, 3), "tflops_best": round(fl / times[0] / 1e12, 3),
                    "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if cuda else "cpu"})
        del mats, c
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
    return out


def parse_batches(s, max_batch):
    if s == "auto":
        out, b = [], max_batch
        while b >= 1:
            out.append(b)
            b //= 2
        return out
    try:
        out = [int(x) for x in s.split(",")]
    except ValueError:
        sys.exit(f"torch_gpu: --batch expects N, N1,N2,... or auto, got '{s}'")
    if not out or min(out) < 1:
        sys.exit("torch_gpu: --batch values must be at least 1")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt2", choices=sorted(PRESETS))
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", default="auto", help="N, a list N1,N2,... tried in order, or auto")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--mode", default="eager", choices=["eager", "compile"])
    ap.add_argument("--arch", default="nano", choices=["nano", "hf"])
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps after the first (compilation) step")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--gemm", action="store_true", help="measure the matmul rate instead of training")
    ap.add_argument("--gemm-size", type=int, default=8192)
    ap.add_argument("--gemm-repeats", type=int, default=50)
    a = ap.parse_args()

    import torch
    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        sys.exit("torch_gpu: torch sees no CUDA GPU (torch %s, built for CUDA %s)" % (torch.__version__,
                                                                                  torch.version.cuda))
    if a.gemm:
        for r in gemm_rates(a, torch):
            print(json.dumps(r), flush=True)
        return
    if a.seq > PRESETS[a.model][3]:
        sys.exit(f"torch_gpu: --seq {a.seq} exceeds {a.model}'s {PRESETS[a.model][3]} positions")
    if a.steps < 1 or a.warmup < 0:
        sys.exit("torch_gpu: --steps must be at least 1 and --warmup at least 0")
    flash_only = cuda and a.arch == "nano" and a.precision == "bf16"
    if flash_only:
        # flash attention only: a step that cannot use it fails rather than timing another kernel
        # (fp32 has no flash kernel; transformers' GPT-2 may hand SDPA a mask, which flash refuses)
        torch.backends.cuda.enable_flash_sdp(True)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_math_sdp(False)
        if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
            torch.backends.cuda.enable_cudnn_sdp(False)

    bench = Bench(a, torch)
    t_start = time.perf_counter()
    B, model, fwd, opt, first_s, tries = bench.find_batch(parse_batches(a.batch, a.max_batch))
    for _ in range(a.warmup):
        bench.step(model, fwd, opt, *bench.batch(B))
    bench.sync()
    warmup_s = time.perf_counter() - t_start
    times, loss = [], float("nan")
    for _ in range(a.steps):
        x, y = bench.batch(B)
        bench.sync()
        t0 = time.perf_counter()
        loss = bench.step(model, fwd, opt, x, y)
        bench.sync()
        times.append(time.perf_counter() - t0)
    mean = sum(times) / len(times)
    st = sorted(times)
    median = st[len(st) // 2] if len(st) % 2 else 0.5 * (st[len(st) // 2 - 1] + st[len(st) // 2])
    n_params = sum(p.numel() for p in model.parameters())
    out = {
        "impl": "pytorch-" + a.mode, "arch": a.arch, "model": a.model, "B": B, "T": a.seq, "device": a.device,
        "precision": a.precision, "steps": a.steps, "warmup": a.warmup,
        "ms_per_step": round(1e3 * mean, 3), "ms_per_step_min": round(1e3 * st[0], 3),
        "ms_per_step_median": round(1e3 * median, 3), "tokens_per_s": round(B * a.seq / mean, 2),
        "loss": round(loss, 5), "params": n_params, "n_layer": bench.L, "n_head": bench.H, "n_embd": bench.C,
        "vocab_size": bench.V, "padded_vocab_size": bench.Vp, "batch_search": tries,
        "first_step_s": round(first_s, 2), "warmup_s": round(warmup_s, 2), "torch": torch.__version__,
        "sdpa": "flash only" if flash_only else "default backends",
    }
    if cuda:
        out.update({"peak_bytes": torch.cuda.max_memory_allocated(),
                    "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                    "gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda})
    if a.profile:
        out.update(bench.profile(model, fwd, opt, B))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
