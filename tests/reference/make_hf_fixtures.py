#!/usr/bin/env python3
"""make_hf_fixtures.py: writes the tiny Hugging Face weight fixtures under tests/fixtures/hf/.

Run from the repository root:  python3 tests/reference/make_hf_fixtures.py
Needs torch, transformers, safetensors. Deterministic (fixed seed); the outputs are committed.

  gpt2/           GPT2LMHeadModel.save_pretrained (F32, "transformer.*" names, no lm_head: tied)
  gpt2-bf16/      the same weights saved in bfloat16
  gpt2-hub-f16/   the same weights in float16 with the original hub checkpoint's names ("h.0.attn.c_attn.weight",
                  "wte.weight", no "transformer." prefix) plus its non-parameter buffers h.N.attn.bias and
                  h.N.attn.masked_bias, written with safetensors.torch.save_file
  llama/          LlamaForCausalLM.save_pretrained (F32, tie_word_embeddings=False)
  llama-sharded/  the same LLaMA weights, saved with a small max_shard_size (2 files + index)
  expected.json   for each variant and tensor: the internal shape (out, in) shardlm uses, and sample values
                  [row, col, value] in internal coordinates (GPT-2 Conv1D weights transposed), taken from the
                  torch modules (not from the files), so the C test checks transposition and dtype conversion.
"""
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

OUT = os.path.join("tests", "fixtures", "hf")
GPT2_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=g) * 2 - 1)


def samples(sd, transposed_suffixes, cast):
    """Internal shape and a few [row, col, value] samples per tensor, values rounded through `cast`."""
    out = {}
    g = torch.Generator().manual_seed(7)
    for name, t in sd.items():
        t = t.detach().to(cast).float()
        if t.dim() == 2 and name.endswith(transposed_suffixes):
            t = t.t().contiguous()  # HF Conv1D (in, out) -> internal (out, in)
        shape = list(t.shape)
        if t.dim() == 1:
            t = t.unsqueeze(1)
        rows, cols = t.shape
        pts = {(0, 0), (rows - 1, cols - 1), (0, cols - 1), (rows - 1, 0)}
        for _ in range(4):
            pts.add((int(torch.randint(rows, (1,), generator=g)), int(torch.randint(cols, (1,), generator=g))))
        out[name] = {"shape": shape,
                     "samples": [[r, c, float(t[r, c])] for r, c in sorted(pts)]}
    return out


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)


def main():
    torch.manual_seed(0)
    expected = {}

    gcfg = GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=98, eos_token_id=99)
    gpt2 = GPT2LMHeadModel(gcfg).eval()
    randomise(gpt2, 1)
    sd = {k: v for k, v in gpt2.state_dict().items() if k != "lm_head.weight" and not k.endswith(".attn.bias")
          and not k.endswith(".attn.masked_bias")}
    fresh(os.path.join(OUT, "gpt2"))
    gpt2.save_pretrained(os.path.join(OUT, "gpt2"), safe_serialization=True)
    expected["gpt2"] = samples(sd, GPT2_TRANSPOSED, torch.float32)

    fresh(os.path.join(OUT, "gpt2-bf16"))
    gpt2_bf16 = GPT2LMHeadModel(gcfg).eval()
    gpt2_bf16.load_state_dict(gpt2.state_dict())
    gpt2_bf16.to(torch.bfloat16).save_pretrained(os.path.join(OUT, "gpt2-bf16"), safe_serialization=True)
    expected["gpt2-bf16"] = samples(sd, GPT2_TRANSPOSED, torch.bfloat16)

    hub = os.path.join(OUT, "gpt2-hub-f16")
    fresh(hub)
    tensors = {k[len("transformer."):]: v.detach().half().contiguous() for k, v in sd.items()}
    T = gcfg.n_positions
    for layer in range(gcfg.n_layer):
        tensors[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T).half()
        tensors[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4).half()
    save_file(tensors, os.path.join(hub, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(OUT, "gpt2", "config.json"), os.path.join(hub, "config.json"))
    expected["gpt2-hub-f16"] = samples(sd, GPT2_TRANSPOSED, torch.float16)

    lcfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    llama = LlamaForCausalLM(lcfg).eval()
    randomise(llama, 2)
    lsd = {k: v for k, v in llama.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    fresh(os.path.join(OUT, "llama"))
    llama.save_pretrained(os.path.join(OUT, "llama"), safe_serialization=True)
    expected["llama"] = samples(lsd, (), torch.float32)

    fresh(os.path.join(OUT, "llama-sharded"))
    llama.save_pretrained(os.path.join(OUT, "llama-sharded"), safe_serialization=True, max_shard_size="60KB")
    expected["llama-sharded"] = expected["llama"]

    for d in os.listdir(OUT):
        gen = os.path.join(OUT, d, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        f.write("{\n")
        for i, (variant, tensors) in enumerate(expected.items()):
            f.write(f' "{variant}": {{\n')
            for j, (name, e) in enumerate(tensors.items()):
                f.write(f'  "{name}": {json.dumps(e, separators=(",", ":"))}{"," if j + 1 < len(tensors) else ""}\n')
            f.write(f' }}{"," if i + 1 < len(expected) else ""}\n')
        f.write("}\n")
    for root, _, files in sorted(os.walk(OUT)):
        for fn in sorted(files):
            p = os.path.join(root, fn)
            print(f"{os.path.getsize(p):8d}  {p}")


if __name__ == "__main__":
    main()
