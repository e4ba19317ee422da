#!/usr/bin/env python3
"""make_quant_fixtures.py: bitsandbytes' quantised weights for tests/unit/test_quant.c.

Writes tests/fixtures/quant/quant_ref.safetensors. For each case CASE (a weight of an odd shape in
float32, bfloat16 or float16) it holds:
  CASE.input                      the weight, in its dtype
  CASE.nf4.data / .absmax / .deq  quantize_4bit(nf4, blocksize 64): packed codes, scales, and
                                  dequantize_4bit's float32 result
  CASE.nf4dq.*                    the same with compress_statistics=True: .data, .qabsmax (U8),
                                  .nested_absmax, .offset (scalar), .nested_code, .deq
  CASE.fp4.*                      quant_type fp4 (data, absmax, deq)
  CASE.int8.cb / .scb / .deq      Int8Params' quantisation (weight rounded to fp16, then
                                  int8_vectorwise_quant) and int8_vectorwise_dequant
Dequantised values come from bitsandbytes' reference implementation (backends/default, the flat-block
definition CUDA also follows); where the CPU kernel's layout assumption holds (in % 64 == 0) the script
asserts that the CPU kernel gives the same bits. Run from the repository root with the venv that has
bitsandbytes 0.50: python3 tests/reference/make_quant_fixtures.py
"""
import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")   # bitsandbytes wraps its reference code in torch.compile

import torch
import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.backends.default import ops as default_ops
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "quant")
assert bnb.__version__.startswith("0.50"), bnb.__version__

NF4 = F.get_4bit_type("nf4", device="cpu")


def weight(gen, rows, cols, dtype, kind):
    w = torch.randn(rows, cols, generator=gen) * 0.05
    if kind == "scales":        # rows of very different magnitudes, a zero row, a huge outlier
        w = w * torch.logspace(-3, 2, rows).unsqueeze(1)
        w[rows // 2] = 0
        w[0, cols // 3] = 7.5
    if kind == "ties":          # blocks with absmax 1 whose values sit exactly on NF4's midpoints
        mids = (NF4[:-1] + NF4[1:]) / 2
        flat = w.reshape(-1)
        for b in range(flat.numel() // 64):
            flat[b * 64] = 1.0
            flat[b * 64 + 1: b * 64 + 16] = mids
        w = flat.reshape(rows, cols)
    return w.to(dtype)


def dequant_ref(packed, absmax, qtype, shape):
    code = F.get_4bit_type(qtype, device="cpu")
    return default_ops._dequantize_4bit_compute(packed.reshape(-1), absmax, code, 64, shape, torch.float32)


def four_bit(out, name, w, qtype, double):
    packed, st = F.quantize_4bit(w, blocksize=64, compress_statistics=double, quant_type=qtype)
    out[name + ".data"] = packed.reshape(-1).contiguous()
    if double:
        absmax = F.dequantize_blockwise(st.absmax, st.state2) + st.offset
        out[name + ".qabsmax"] = st.absmax.contiguous()
        out[name + ".nested_absmax"] = st.state2.absmax.contiguous()
        out[name + ".nested_code"] = st.state2.code.contiguous()
        out[name + ".offset"] = st.offset.reshape(()).float()
    else:
        absmax = st.absmax
        out[name + ".absmax"] = absmax.contiguous()
    deq = dequant_ref(packed, absmax.float(), qtype, tuple(w.shape))
    api = F.dequantize_4bit(packed, st)   # the public path (CPU kernel where it applies), in w's dtype
    if w.shape[1] % 64 == 0:
        assert torch.equal(api.float(), deq.to(w.dtype).float()), name
    out[name + ".deq"] = deq.float().contiguous()


def int8(out, name, w):
    w16 = w.to(torch.float16)
    cb, scb, _ = F.int8_vectorwise_quant(w16.clone())
    out[name + ".cb"] = cb.contiguous()
    out[name + ".scb"] = scb.contiguous()
    out[name + ".deq"] = F.int8_vectorwise_dequant(cb, scb).float().contiguous()


CASES = [   # name, rows, cols, dtype, kind
    ("r1_f32", 1, 64, torch.float32, "normal"),
    ("r7_bf16", 7, 192, torch.bfloat16, "normal"),
    ("r33_f16", 33, 64, torch.float16, "scales"),
    ("ties_f32", 4, 128, torch.float32, "ties"),
    ("partial_f32", 5, 100, torch.float32, "scales"),     # 500 elements: a short last block
    ("odd_bf16", 3, 21, torch.bfloat16, "normal"),        # 63 elements: odd count, padded nibble
    ("r1023_f32", 1023, 32, torch.float32, "scales"),     # 511.5 blocks: two nested blocks, short last
    ("wide_f16", 130, 128, torch.float16, "normal"),
]


def main():
    gen = torch.Generator().manual_seed(1234)
    out = {}
    for name, rows, cols, dtype, kind in CASES:
        w = weight(gen, rows, cols, dtype, kind)
        out[name + ".input"] = w.contiguous()
        four_bit(out, name + ".nf4", w, "nf4", False)
        four_bit(out, name + ".nf4dq", w, "nf4", True)
        four_bit(out, name + ".fp4", w, "fp4", False)
        int8(out, name + ".int8", w)
    os.makedirs(OUT, exist_ok=True)
    save_file(out, os.path.join(OUT, "quant_ref.safetensors"), metadata={"bitsandbytes": bnb.__version__,
                                                                        "torch": torch.__version__})
    print("wrote", len(out), "tensors")


if __name__ == "__main__":
    main()
