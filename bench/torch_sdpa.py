#!/usr/bin/env python3
"""torch_sdpa.py: causal attention alone, forward and backward, through PyTorch's SDPA backends on the GPU.

What the attention of a training step costs at its shapes when done by flash-attention 2 (PyTorch's
FLASH backend), cuDNN's fused attention (CUDNN) and the memory-efficient kernels (EFFICIENT): the
ceiling shardlm's own kernels (attention_mma.cu) and its cuDNN path (attention_cudnn.cu) are read
against. bench_train's profile gives shardlm's attention ms per step; divide by the layers to compare
with one call here.

Each case: bf16 Q, K, V with requires_grad, in one of three layouts: "bhsd" (each a contiguous (B, H, T,
D) tensor), "bshd" (each a contiguous (B, T, H, D) tensor seen as (B, H, T, D), dO too: the token
stride H*D, as shardlm's output and its gradient; cuDNN writes the gradients in the same strides, so
nothing is copied) and "qkv" (views into one (B, T, 3, H, D) buffer: the layout GPT-2's fused qkv
projection leaves, shardlm's, with strides (T*3C, D, 3C, 1); its backward also gathers the three
gradients into the buffer's); GQA shapes (H_kv < H) take enable_gqa. Forward:
F.scaled_dot_product_attention(q, k, v, is_causal=True) under one backend; backward: out.backward(dO)
on a forward run again (its time = forward + backward - forward). Each time is the median of --iters
calls timed with CUDA events after --warmup calls. TFLOP/s by flash-attention's count: forward 4*B*H*T*T*D
/ 2 (causal), backward 2.5x that. A backend that cannot run a case (unsupported shape, not built)
gives a line with its error instead of times.

One JSON line per (shape, layout, backend) on stdout:
  python3 bench/torch_sdpa.py --shape gpt2:64:12:12:1024:64 --shape gpt2-medium:16:16:16:1024:64
(name:B:H:H_kv:T:D). --device cpu runs the logic on the CPU (a dry run: math backend, tiny shapes).
"""
import argparse
import json
import statistics
import sys
import time


def parse_shape(s):
    parts = s.split(":")
    if len(parts) != 6:
        raise argparse.ArgumentTypeError(f"--shape {s!r}: expected name:B:H:H_kv:T:D")
    name, *nums = parts
    try:
        b, h, hkv, t, d = (int(x) for x in nums)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {s!r}: B, H, H_kv, T and D must be integers") from None
    if min(b, h, hkv, t, d) < 1 or h % hkv:
        raise argparse.ArgumentTypeError(f"--shape {s!r}: sizes must be >= 1 and H a multiple of H_kv")
    return {"name": name, "B": b, "H": h, "H_kv": hkv, "T": t, "D": d}


def make_inputs(torch, shape, layout, device):
    B, H, Hkv, T, D = (shape[k] for k in ("B", "H", "H_kv", "T", "D"))
    g = torch.Generator(device=device).manual_seed(0)
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    if layout == "qkv":  # one (B, T, H + 2 H_kv, D) buffer, as a fused projection leaves it
        buf = torch.randn(B, T, H + 2 * Hkv, D, generator=g, device=device, dtype=dt).requires_grad_()
        q = buf[:, :, :H].transpose(1, 2)
        k = buf[:, :, H:H + Hkv].transpose(1, 2)
        v = buf[:, :, H + Hkv:].transpose(1, 2)
        leaves = [buf]
    elif layout == "bshd":  # (B, T, H, D) memory seen as (B, H, T, D)
        leaves = [torch.randn(B, T, h, D, generator=g, device=device, dtype=dt).requires_grad_() for h in (H, Hkv, Hkv)]
        q, k, v = (x.transpose(1, 2) for x in leaves)
        dout = torch.randn(B, T, H, D, generator=g, device=device, dtype=dt).transpose(1, 2)
        return q, k, v, dout, leaves
    else:
        q = torch.randn(B, H, T, D, generator=g, device=device, dtype=dt).requires_grad_()
        k = torch.randn(B, Hkv, T, D, generator=g, device=device, dtype=dt).requires_grad_()
        v = torch.randn(B, Hkv, T, D, generator=g, device=device, dtype=dt).requires_grad_()
        leaves = [q, k, v]
    dout = torch.randn(B, H, T, D, generator=g, device=device, dtype=dt)
    return q, k, v, dout, leaves


def timer(torch, device):
    if device == "cuda":
        def run(fn):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b)
    else:
        def run(fn):
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
    return run


def measure(torch, F, shape, layout, backend, args):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v, dout, leaves = make_inputs(torch, shape, layout, args.device)
    gqa = {"enable_gqa": True} if shape["H_kv"] != shape["H"] else {}
    run = timer(torch, args.device)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)

    def fwd_train():  # what training's forward does: keeps what the backward needs
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)

    def fwd_bwd():
        for x in leaves:
            x.grad = None
        fwd_train().backward(dout)

    with sdpa_kernel([getattr(SDPBackend, backend)]):
        for _ in range(args.warmup):
            fwd_bwd()
        f = [run(fwd_train) for _ in range(args.iters)]
        fb = [run(fwd_bwd) for _ in range(args.iters)]
        inf = [run(fwd) for _ in range(args.iters)]
    B, H, T, D = shape["B"], shape["H"], shape["T"], shape["D"]
    flops = 4 * B * H * T * T * D / 2
    fwd_ms = statistics.median(f)
    bwd_ms = max(statistics.median(fb) - fwd_ms, 1e-9)
    return {"fwd_ms": round(fwd_ms, 4), "bwd_ms": round(bwd_ms, 4), "fwd_bwd_ms": round(fwd_ms + bwd_ms, 4),
            "fwd_inference_ms": round(statistics.median(inf), 4),
            "fwd_tflops": round(flops / fwd_ms / 1e9, 1), "bwd_tflops": round(2.5 * flops / bwd_ms / 1e9, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=parse_shape, action="append", required=True, help="name:B:H:H_kv:T:D")
    ap.add_argument("--backends", default="FLASH_ATTENTION,CUDNN_ATTENTION,EFFICIENT_ATTENTION")
    ap.add_argument("--layouts", default="qkv,bhsd,bshd")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_sdpa.py: torch sees no CUDA GPU", file=sys.stderr)
        return 1
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.device == "cpu":
        backends = ["MATH"]
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version() if args.device == "cuda" else None,
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    for shape in args.shape:
        for layout in args.layouts.split(","):
            for backend in backends:
                row = dict(kind="sdpa", **shape, layout=layout, backend=backend, **meta)
                try:
                    row.update(measure(torch, F, shape, layout, backend, args))
                except Exception as e:  # a backend that cannot take the case: say why, go on
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                if args.device == "cuda":
                    torch.cuda.empty_cache()
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
