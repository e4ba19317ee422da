#!/usr/bin/env python3
"""Reference values for AdamW8bit over LoRA adapters: bitsandbytes' AdamW8bit on PEFT's adapters.

For the committed LoRA cases below (tests/fixtures/lora/<case>: adapters PEFT saved, and the batch in
expected.safetensors, both written by make_lora_fixtures.py) this loads the base model with
transformers and the adapters with PeftModel.from_pretrained (trainable), then runs 10 steps of
bitsandbytes.optim.AdamW8bit (bitsandbytes 0.50, its CPU kernels) on the adapters alone: lr 1e-2,
betas 0.9/0.95, eps 1e-8, weight decay 0.1 on every adapter tensor, min_8bit_size 256 (so the
adapters of 256 elements or more get blockwise 8-bit state and the smaller ones 32-bit state), the
same batch every step. It writes tests/fixtures/lora/<case>/adam8.safetensors:
  adamw8bit_losses   (10,) float32: the loss before each step
  final.<PEFT name>  every adapter tensor after the 10 steps (float32)
Run: python3 tests/reference/make_lora_adam8_fixtures.py   (torch, transformers, peft, bitsandbytes,
safetensors)
"""
import os
import sys

import bitsandbytes as bnb
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from make_lora_fixtures import loss_of  # the loss PEFT's fixtures were made with (this directory)

HERE = os.path.dirname(os.path.abspath(__file__))
BASES = os.path.join(HERE, "..", "fixtures", "model")
LORA = os.path.join(HERE, "..", "fixtures", "lora")
CASES = {"gpt2-tiny-all": "gpt2-tiny", "llama-tiny-qvud": "llama-tiny"}
STEPS = 10
OPTIM = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, min_8bit_size=256)


def run(case, base):
    model = AutoModelForCausalLM.from_pretrained(os.path.join(BASES, base), attn_implementation="eager")
    model.eval()
    case_dir = os.path.join(LORA, case)
    peft_model = PeftModel.from_pretrained(model, case_dir, is_trainable=True)
    expected = load_file(os.path.join(case_dir, "expected.safetensors"))
    inputs = expected["input_ids"].long()
    targets = expected["targets"].long()
    targets[targets < 0] = -100
    V = model.config.vocab_size
    trainable = [(n, p) for n, p in peft_model.named_parameters() if p.requires_grad]
    opt = bnb.optim.AdamW8bit([p for _, p in trainable], **OPTIM)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        _, loss = loss_of(peft_model, inputs, targets, V)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out = {"adamw8bit_losses": torch.tensor(losses, dtype=torch.float32)}
    n8 = 0
    for name, p in trainable:
        out["final." + name.replace(".default", "")] = p.detach().float().contiguous()
        n8 += p.numel() if p.numel() >= OPTIM["min_8bit_size"] else 0
    save_file(out, os.path.join(case_dir, "adam8.safetensors"))
    print(f"{case}: {len(trainable)} adapter tensors ({n8} elements with 8-bit state), "
          f"loss {losses[0]:.6f} .. {losses[-1]:.6f}")


if __name__ == "__main__":
    for case, base in CASES.items():
        run(case, base)
    sys.exit(0)
