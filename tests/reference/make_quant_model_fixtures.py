#!/usr/bin/env python3
"""make_quant_model_fixtures.py: tiny models saved by transformers + bitsandbytes, for
tests/unit/test_quant_model.c and tests/cli/test_quantize.sh.

Writes under tests/fixtures/quant/:
  llama_fp32/, gpt2_fp32/   a tiny LlamaForCausalLM (grouped-query attention) and GPT2LMHeadModel
                            with random weights, saved in float32
  llama_nf4/, gpt2_nf4/     from_pretrained(..._fp32, quantization_config=BitsAndBytesConfig(
                            load_in_4bit=True, bnb_4bit_quant_type="nf4",
                            bnb_4bit_use_double_quant=True)).save_pretrained(...)
  llama_fp4/                load_in_4bit, fp4, no double quantisation (fp32 block scales)
  llama_int8/               load_in_8bit=True (LLM.int8() rows + SCB)
  models_ref.safetensors    input_ids (I64 [T]) and NAME.logits (F32 [T, vocab]) for each directory:
                            the quantised models' logits from bitsandbytes' training-mode forward
                            (dequantise, then a float32 matmul; in eval mode on a CPU with AVX512-BF16
                            bitsandbytes switches to a bfloat16 kernel instead)
Every linear has a multiple of 64 input features: bitsandbytes 0.50's CPU dequantisation kernel (AVX-512
path) indexes block scales per row and gives wrong values otherwise (its reference implementation and
CUDA use flat blocks, as shardlm does).
Run from the repository root with the venv that has transformers and bitsandbytes 0.50:
python3 tests/reference/make_quant_model_fixtures.py
"""
import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
import bitsandbytes as bnb  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (AutoModelForCausalLM, BitsAndBytesConfig, GPT2Config, GPT2LMHeadModel,  # noqa: E402
                          LlamaConfig, LlamaForCausalLM)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "quant")
IDS = [1, 5, 9, 20, 33, 70, 127, 0, 64]
assert bnb.__version__.startswith("0.50"), bnb.__version__


def save(model, name):
    path = os.path.join(OUT, name)
    model.save_pretrained(path)
    gen = os.path.join(path, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    return path


def logits(path):
    m = AutoModelForCausalLM.from_pretrained(path, device_map="cpu")
    m.train()   # see the docstring: bitsandbytes' float32 path
    with torch.no_grad():
        return m(torch.tensor([IDS])).logits[0].float().contiguous()


def main():
    torch.manual_seed(7)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         bos_token_id=1, eos_token_id=2))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      bos_token_id=0, eos_token_id=0))
    ref = {"input_ids": torch.tensor(IDS, dtype=torch.int64)}
    for arch, model in (("llama", llama), ("gpt2", gpt2)):
        fp32 = save(model, arch + "_fp32")
        ref[arch + "_fp32.logits"] = logits(fp32)
        kinds = {"nf4": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                           bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32)}
        if arch == "llama":
            kinds["fp4"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="fp4",
                                              bnb_4bit_compute_dtype=torch.float32)
            kinds["int8"] = BitsAndBytesConfig(load_in_8bit=True)
        for kind, qc in kinds.items():
            q = AutoModelForCausalLM.from_pretrained(fp32, quantization_config=qc, device_map="cpu")
            path = save(q, f"{arch}_{kind}")
            ref[f"{arch}_{kind}.logits"] = logits(path)
    save_file(ref, os.path.join(OUT, "models_ref.safetensors"))
    print("wrote", sorted(ref))


if __name__ == "__main__":
    main()
