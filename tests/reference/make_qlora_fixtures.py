#!/usr/bin/env python3
"""Reference values for the QLoRA tests (tests/unit/test_qlora.c), from PEFT's get_peft_model over a
transformers model loaded with BitsAndBytesConfig(load_in_4bit=True, ...) on the CPU.

The bases are the quantisation tests' tiny LLaMA and GPT-2 (tests/fixtures/quant/{llama,gpt2}_fp32,
every linear 64 wide or more: bitsandbytes 0.50's AVX-512 CPU dequantisation is wrong for narrower
rows, docs/quantization.md). For each case this writes, under tests/fixtures/qlora/<case>/:
  adapter_config.json + adapter_model.safetensors   the adapters, saved by PeftModel.save_pretrained
                                                    (A and B drawn N(0, 0.1^2), so B is nonzero)
  expected.safetensors
    input_ids, targets (float32)
    logits, loss, grad.<PEFT name>   from the same maths in float64: the fp32 model whose quantised
                                     linears' weights are replaced by bitsandbytes' own dequantised
                                     values (bnb.functional.dequantize_4bit of the loaded Linear4bit),
                                     then .double() and the same adapters: what QLoRA computes, without
                                     torch's fp32 rounding, so a test measures shardlm's error
    bnb.logits, bnb.loss, bnb.grad.<PEFT name>   PEFT + bitsandbytes itself in float32 (training mode:
                                     bitsandbytes' CPU path dequantises then multiplies in float32)
    adamw_losses                     10 AdamW steps (lr 1e-2, betas 0.9/0.95, eps 1e-8, weight decay 0.1)
                                     of PEFT + bitsandbytes on the adapters, float32
The script checks that bnb.* and the float64 values agree (the bound it prints) before writing.

bf16 compute (the cases of BF16_CASES), into tests/fixtures/qlora/<case>/expected_bf16.safetensors: the
same adapters and batch (read back from the case's committed files), the model loaded with
bnb_4bit_compute_dtype=torch.bfloat16 and run as bench/torch_finetune.py runs --precision bf16:
forward and loss under torch.autocast("cpu", torch.bfloat16), fp32 adapters, gradients and AdamW:
    logits, loss, grad.<PEFT name>, adamw_losses   PEFT + bitsandbytes in bf16 (logits as float32)
Run: python3 tests/reference/make_qlora_fixtures.py [--bf16] [CASE ...]   (torch, transformers, peft, bitsandbytes
0.50; --bf16 writes only the bf16 files, from the committed adapters)
"""
import os
import sys

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import bitsandbytes as bnb  # noqa: E402
import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

from make_lora_fixtures import adamw_losses, loss_of, random_adapters_and_batch, saved_name  # noqa: E402  (same AdamW settings and loss)

HERE = os.path.dirname(os.path.abspath(__file__))
BASES = os.path.join(HERE, "..", "fixtures", "quant")
OUT = os.path.join(HERE, "..", "fixtures", "qlora")
B, T = 2, 16
assert bnb.__version__.startswith("0.50"), bnb.__version__

CASES = {
    "gpt2-nf4-dq": ("gpt2_fp32", True, dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"])),
    "gpt2-nf4": ("gpt2_fp32", False, dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"])),
    "llama-nf4-dq": ("llama_fp32", True, dict(r=4, lora_alpha=6, target_modules="all-linear")),
    "llama-nf4": ("llama_fp32", False, dict(r=3, lora_alpha=5, target_modules=["q_proj", "v_proj", "up_proj",
                                                                            "down_proj"], use_rslora=True)),
    # QDoRA: DoRA's row norms over the dequantised weights (PEFT's dequantize_module_weight); q and v are
    # parts of the fused q/k/v linear, up of gate/up
    "llama-nf4-dq-dora": ("llama_fp32", True, dict(r=4, lora_alpha=6, use_dora=True,
                                                   target_modules=["q_proj", "v_proj", "o_proj", "up_proj",
                                                                   "down_proj"])),
    "gpt2-nf4-dora": ("gpt2_fp32", False, dict(r=4, lora_alpha=8, use_dora=True,
                                               target_modules=["c_attn", "c_proj", "c_fc"])),
}



def lora_config(kw):
    return LoraConfig(lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **kw)


def dequantised_fp32_model(base_dir, qmodel):
    """The fp32 model with every Linear4bit's weight replaced by bitsandbytes' dequantised value."""
    model = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager")
    mods = dict(model.named_modules())
    n = 0
    for name, mod in qmodel.named_modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            w = bnb.functional.dequantize_4bit(mod.weight.data, mod.weight.quant_state).float()
            target = mods[name]
            with torch.no_grad():
                # GPT-2's Conv1D stores (in, out); transformers quantises it as nn.Linear (out, in)
                target.weight.copy_(w.t() if type(target).__name__ == "Conv1D" else w)
            n += 1
    assert n > 0
    return model


def run(case, base, dq, kw):
    base_dir = os.path.join(BASES, base)
    qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=dq,
                            bnb_4bit_compute_dtype=torch.float32)
    qmodel = AutoModelForCausalLM.from_pretrained(base_dir, quantization_config=qc, device_map="cpu",
                                                  attn_implementation="eager")
    exact_base = dequantised_fp32_model(base_dir, qmodel)
    V = qmodel.config.vocab_size
    peft_model = get_peft_model(qmodel, lora_config(kw))
    peft_model.train()   # bitsandbytes' float32 CPU path (docs/quantization.md); no dropout in these models
    inputs, targets = random_adapters_and_batch(peft_model, V, B, T)

    out_dir = os.path.join(OUT, case)
    os.makedirs(out_dir, exist_ok=True)
    peft_model.peft_config["default"].base_model_name_or_path = base
    peft_model.save_pretrained(out_dir, safe_serialization=True)
    os.remove(os.path.join(out_dir, "README.md"))
    saved = load_file(os.path.join(out_dir, "adapter_model.safetensors"))

    expected = {"input_ids": inputs.float(), "targets": targets.clamp(min=-1).float()}
    logits, loss = loss_of(peft_model, inputs, targets, V)
    loss.backward()
    expected["bnb.logits"] = logits.detach().float().contiguous()
    expected["bnb.loss"] = loss.detach().float().reshape(1)
    for name, p in peft_model.named_parameters():
        if p.requires_grad:
            expected["bnb.grad." + saved_name(name)] = p.grad.detach().float().contiguous()
    peft_model.zero_grad()

    exact = get_peft_model(exact_base, lora_config(kw)).double()
    with torch.no_grad():
        for name, p in exact.named_parameters():
            if "lora_" in name:
                p.copy_(saved[saved_name(name)].double())
    logits64, loss64 = loss_of(exact, inputs, targets, V)
    loss64.backward()
    expected["logits"] = logits64.detach().float().contiguous()
    expected["loss"] = loss64.detach().float().reshape(1)
    worst = (expected["logits"] - expected["bnb.logits"]).abs().max() / expected["logits"].abs().max()
    for name, p in exact.named_parameters():
        if p.requires_grad:
            key = saved_name(name)
            assert key in saved, key
            g = p.grad.detach().float().contiguous()
            expected["grad." + key] = g
            worst = max(worst, (g - expected["bnb.grad." + key]).abs().max() / g.abs().max())
    assert worst < 1e-4, f"{case}: PEFT + bitsandbytes fp32 is {worst:.3g} away from its float64 maths"

    losses = adamw_losses(peft_model, [p for _, p in peft_model.named_parameters() if p.requires_grad], inputs,
                          targets, V)
    expected["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    save_file(expected, os.path.join(out_dir, "expected.safetensors"))
    print(f"{case}: {len(saved)} adapter tensors, loss {loss64.item():.6f} (bnb fp32 {loss.item():.6f}), "
          f"bnb vs float64 worst relative {worst:.2e}, adamw {losses[0]:.4f} .. {losses[-1]:.4f}")


BF16_CASES = ["gpt2-nf4-dq", "llama-nf4-dq", "llama-nf4-dq-dora"]


def run_bf16(case, base, dq, kw):
    out_dir = os.path.join(OUT, case)
    qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=dq,
                            bnb_4bit_compute_dtype=torch.bfloat16)
    qmodel = AutoModelForCausalLM.from_pretrained(os.path.join(BASES, base), quantization_config=qc,
                                                  device_map="cpu", attn_implementation="eager")
    V = qmodel.config.vocab_size
    peft_model = get_peft_model(qmodel, lora_config(kw))
    peft_model.train()
    saved = load_file(os.path.join(out_dir, "adapter_model.safetensors"))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(saved[saved_name(name)])
    batch = load_file(os.path.join(out_dir, "expected.safetensors"))
    inputs, targets = batch["input_ids"].long(), batch["targets"].long()
    targets[targets < 0] = -100

    def autocast_loss(model, inputs, targets, V):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return loss_of(model, inputs, targets, V)

    expected = {}
    logits, loss = autocast_loss(peft_model, inputs, targets, V)
    loss.backward()
    expected["logits"] = logits.detach().float().contiguous()
    expected["loss"] = loss.detach().float().reshape(1)
    for name, p in peft_model.named_parameters():
        if p.requires_grad:
            assert p.dtype == torch.float32
            expected["grad." + saved_name(name)] = p.grad.detach().float().contiguous()
    peft_model.zero_grad()
    import make_lora_fixtures
    plain = make_lora_fixtures.loss_of
    make_lora_fixtures.loss_of = autocast_loss   # adamw_losses' forward under autocast too
    try:
        losses = adamw_losses(peft_model, [p for _, p in peft_model.named_parameters() if p.requires_grad], inputs,
                              targets, V)
    finally:
        make_lora_fixtures.loss_of = plain
    expected["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    save_file(expected, os.path.join(out_dir, "expected_bf16.safetensors"))
    print(f"{case} bf16: loss {loss.item():.6f}, adamw {losses[0]:.4f} .. {losses[-1]:.4f}")


if __name__ == "__main__":
    # the cases named on the command line (default: all), so a new case does not rewrite the others
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or list(CASES)
    for case in names:
        base, dq, kw = CASES[case]
        if "--bf16" not in sys.argv[1:]:
            run(case, base, dq, kw)
        if case in BF16_CASES:
            run_bf16(case, base, dq, kw)
