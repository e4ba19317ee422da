#!/usr/bin/env python3
"""Reference values for the model tests, from transformers' GPT2LMHeadModel and LlamaForCausalLM.

For each tiny model (the presets gpt2-tiny and llama-tiny) this writes, under tests/fixtures/model/<name>/:
  model.safetensors + config.json   random weights, saved by transformers' save_pretrained
  expected.safetensors              input_ids, targets (as float32), logits (B,T,V), loss, every
                                    parameter's gradient under "grad.<hf name>" (HF layout), and the
                                    losses of 10 AdamW steps ("adamw_losses")
Weights are drawn wider than the usual 0.02 init so every op works in a non-trivial range.
Run: python3 tests/reference/make_model_fixtures.py   (needs torch, transformers, safetensors)
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "model")
B, T = 2, 24
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def make_gpt2():
    cfg = GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=128,
                     layer_norm_epsilon=1e-5, activation_function="gelu_new", resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
    return GPT2LMHeadModel(cfg)


def make_llama():
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      attention_bias=False, mlp_bias=False, hidden_act="silu")
    return LlamaForCausalLM(cfg)


def randomise(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("ln" in name or "norm" in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def decays(name, p):
    # shardlm's rule: decay linear weights only; no decay on norms, biases, embeddings
    return p.dim() == 2 and not any(k in name for k in ("wte", "wpe", "embed_tokens"))


def run(name, model):
    gen = torch.Generator().manual_seed(1234)
    randomise(model, gen)
    model.config._attn_implementation = "eager"
    model.eval()
    V = model.config.vocab_size
    ids = torch.randint(0, V, (B, T + 1), generator=gen)
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    targets[1, 5] = -100  # one ignored position (shardlm: any negative target)

    out_dir = os.path.join(OUT, name)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)

    logits = model(input_ids=inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)
    loss.backward()
    expected = {
        "input_ids": inputs.float(),
        "targets": targets.clamp(min=-1).float(),
        "logits": logits.detach().contiguous(),
        "loss": loss.detach().reshape(1),
    }
    for pname, p in model.named_parameters():
        expected["grad." + pname] = p.grad.detach().clone().contiguous()

    params = dict(model.named_parameters())
    groups = [{"params": [p for n, p in params.items() if decays(n, p)], "weight_decay": ADAMW["weight_decay"]},
              {"params": [p for n, p in params.items() if not decays(n, p)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"], foreach=False)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        lg = model(input_ids=inputs).logits
        l = torch.nn.functional.cross_entropy(lg.reshape(-1, V), targets.reshape(-1), ignore_index=-100)
        l.backward()
        opt.step()
        losses.append(l.item())
    expected["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    save_file(expected, os.path.join(out_dir, "expected.safetensors"))
    print(f"{name}: loss {loss.item():.6f}, adamw losses {losses[0]:.4f} .. {losses[-1]:.4f} -> {out_dir}")


if __name__ == "__main__":
    torch.manual_seed(0)
    run("gpt2-tiny", make_gpt2())
    run("llama-tiny", make_llama())
    sys.exit(0)
