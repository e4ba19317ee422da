#!/usr/bin/env python3
"""check_quant_in_transformers.py OURS THEIRS: by hand, with the venv that has transformers + bitsandbytes.

OURS is a directory `shardlm quantize` wrote, THEIRS the one transformers + bitsandbytes wrote for the
same model (e.g. tests/fixtures/quant/llama_nf4). Checks that both hold the same tensor names with equal
bytes, and that transformers loads OURS with the same logits as THEIRS (training-mode forward: bitsandbytes'
dequantise-then-float32 path). Exit status 0 when all agree.
  build/shardlm quantize --model tests/fixtures/quant/llama_fp32 --quantize nf4 --output /tmp/q
  python3 tests/reference/check_quant_in_transformers.py /tmp/q tests/fixtures/quant/llama_nf4
"""
import os
import sys

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def raw(t):
    return t.contiguous().view(-1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def main(ours, theirs):
    a = load_file(os.path.join(ours, "model.safetensors"))
    b = load_file(os.path.join(theirs, "model.safetensors"))
    ok = set(a) == set(b)
    if not ok:
        print("names differ:", sorted(set(a) ^ set(b))[:10])
    diff = [k for k in set(a) & set(b) if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape
            or not torch.equal(raw(a[k]), raw(b[k]))]
    print(f"{len(set(a) & set(b))} tensors compared, {len(diff)} differ", diff[:5])
    ids = torch.tensor([[1, 5, 9, 20, 33, 70, 127, 0, 64]])
    logits = []
    for d in (ours, theirs):
        m = AutoModelForCausalLM.from_pretrained(d, device_map="cpu").train()
        with torch.no_grad():
            logits.append(m(ids).logits)
    gap = (logits[0] - logits[1]).abs().max().item()
    print(f"transformers logits, ours vs theirs: max |difference| {gap:.3g}")
    return 0 if ok and not diff and gap == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
