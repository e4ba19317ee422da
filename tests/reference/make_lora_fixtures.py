#!/usr/bin/env python3
"""Reference values for the LoRA tests, from PEFT's get_peft_model on transformers' models.

The base models are the model tests' tiny GPT-2 and LLaMA (tests/fixtures/model/<base>, weights
already committed). For each case below this writes, under tests/fixtures/lora/<case>/:
  adapter_config.json + adapter_model.safetensors   the adapters, saved by PeftModel.save_pretrained
                                                    (A and B drawn N(0, 0.1^2), DoRA's magnitudes
                                                    PEFT's start times 1 + N(0, 0.1^2): B nonzero, so every
                                                    path of the maths is exercised; at 0.3 the adapters
                                                    swamp the base and fp32 gradients of torch itself
                                                    drift 2.3e-5 from float64)
  expected.safetensors   input_ids, targets (float32), logits (B,T,V), loss, the gradient of every
                         adapter tensor (and modules_to_save copy, moved N(0, 0.1^2) from the base)
                         under "grad.<PEFT name>" (these computed by the same PEFT model
                         in float64 and stored as float32, so a test measures shardlm's error and not
                         torch's own fp32 rounding), and the losses of 10 AdamW steps (float32) on
                         the adapters ("adamw_losses"; lr 1e-2, betas 0.9/0.95, eps 1e-8, weight
                         decay 0.1 on every adapter tensor)
Run: python3 tests/reference/make_lora_fixtures.py [CASE ...]   (torch, transformers, peft, safetensors;
default every case)
"""
import copy
import os
import sys

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
BASES = os.path.join(HERE, "..", "fixtures", "model")
OUT = os.path.join(HERE, "..", "fixtures", "lora")
B, T = 2, 24
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

CASES = {
    # GPT-2: "c_proj" matches attn.c_proj and mlp.c_proj, so all four Conv1D linears
    "gpt2-tiny-all": ("gpt2-tiny", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"])),
    # LLaMA: q and v (gaps in the fused q/k/v output), up (second half of gate/up) and down
    "llama-tiny-qvud": ("llama-tiny", dict(r=4, lora_alpha=6, target_modules=["q_proj", "v_proj", "up_proj",
                                                                             "down_proj"])),
    # LLaMA: every linear of the blocks, rsLoRA scaling alpha / sqrt(r)
    "llama-tiny-rslora": ("llama-tiny", dict(r=3, lora_alpha=5, target_modules="all-linear", use_rslora=True)),
    # target_modules as a string: PEFT's regular expression, matched against whole module paths; here
    # q and v of block 1 only, and down_proj of every block
    "llama-tiny-regex": ("llama-tiny", dict(r=4, lora_alpha=8,
                                            target_modules=r".*\.layers\.1\.self_attn\.(q|v)_proj|.*\.mlp\.down_proj")),
    # GPT-2: attn.c_proj of block 0 and mlp.c_fc of block 1 (a list could not say "block 0 only")
    "gpt2-tiny-regex": ("gpt2-tiny", dict(r=4, lora_alpha=8,
                                          target_modules=r"transformer\.h\.0\.attn\.c_proj|transformer\.h\.1\.mlp\.c_fc")),
    # layers_to_transform: q_proj and down_proj of block 1 only (layers_pattern "layers"), and GPT-2's
    # linears of block 0 (an integer, no pattern: the index after the first ".<name>.")
    "llama-tiny-layers": ("llama-tiny", dict(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"],
                                             layers_to_transform=[1], layers_pattern="layers")),
    "gpt2-tiny-layers": ("gpt2-tiny", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"],
                                           layers_to_transform=0)),
    # rank_pattern / alpha_pattern (the first key that matches the end of a path wins: block 1's down_proj
    # takes 3, the rest of block 1 5, block 0's q_proj 2) and exclude_modules as a list (block 1's k_proj
    # not adapted). PEFT writes the keys sorted and reads them in the file's order, so the keys are given
    # sorted here: in another order PEFT could not load its own file (a rank other than the tensors')
    "llama-tiny-pattern": ("llama-tiny", dict(r=4, lora_alpha=8, target_modules="all-linear",
                                              rank_pattern={"down_proj": 3, r"layers\.1\..*": 5, "q_proj": 2},
                                              alpha_pattern={r"model\.layers\.0\.mlp\..*": 5.5, "o_proj": 3},
                                              exclude_modules=["model.layers.1.self_attn.k_proj"])),
    # GPT-2 with rsLoRA (alpha / sqrt(r) per module) and exclude_modules as a regular expression
    "gpt2-tiny-pattern": ("gpt2-tiny", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"],
                                            use_rslora=True, rank_pattern={"c_attn": 2, r"h\.1\.mlp\.c_proj": 6},
                                            alpha_pattern={"c_fc": 3},
                                            exclude_modules=r"transformer\.h\.0\.mlp\.c_proj")),
    # DoRA (use_dora): a trained magnitude per output row over the row norms of W + s B A; LLaMA on some
    # modules of the fused q/k/v and gate/up GEMMs, GPT-2 on all four Conv1D linears with rsLoRA
    "llama-tiny-dora": ("llama-tiny", dict(r=4, lora_alpha=8, use_dora=True,
                                           target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"])),
    "gpt2-tiny-dora": ("gpt2-tiny", dict(r=3, lora_alpha=5, use_dora=True, use_rslora=True,
                                         target_modules=["c_attn", "c_proj", "c_fc"])),
    # DoRA with per-module ranks and alphas (the widest rank not the config's r) and an excluded module
    "llama-tiny-dora-pattern": ("llama-tiny", dict(r=2, lora_alpha=4, use_dora=True, target_modules="all-linear",
                                                   rank_pattern={"down_proj": 6, "q_proj": 3},
                                                   alpha_pattern={"gate_proj": 9},
                                                   exclude_modules=["model.layers.0.self_attn.k_proj"])),
    # modules_to_save: modules trained whole next to the adapters (PEFT's copies, picked by str.endswith).
    # GPT-2: the embeddings and every ln_1 (block 0's included, below every adapter), the tied head still
    # reading the frozen wte while the lookup reads the copy; then the head's own copy (which unties it)
    # and ln_f, over adapters of block 1 only
    "gpt2-tiny-save": ("gpt2-tiny", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"],
                                         modules_to_save=["wte", "wpe", "ln_1"])),
    "gpt2-tiny-save-head": ("gpt2-tiny", dict(r=4, lora_alpha=8, target_modules=["c_attn"], layers_to_transform=[1],
                                              modules_to_save=["lm_head", "ln_f"])),
    # block 0's ln_2 alone, below the only adapters (block 1): block 0's backward runs to its ln_2, no further;
    # block 0's ln_1 alone: down to block 0's input gradient
    "gpt2-tiny-save-ln2": ("gpt2-tiny", dict(r=4, lora_alpha=8, target_modules=["c_attn"], layers_to_transform=[1],
                                             modules_to_save=["h.0.ln_2"])),
    "gpt2-tiny-save-ln1": ("gpt2-tiny", dict(r=4, lora_alpha=8, target_modules=["c_attn"], layers_to_transform=[1],
                                             modules_to_save=["h.0.ln_1"])),
    # PEFT's bias: "all" trains every bias (the norms' too; an adapted linear's saved as "base_layer.bias"),
    # "lora_only" the adapted linears' (here block 1's c_attn only: its input gradient is then needed)
    "gpt2-tiny-bias-all": ("gpt2-tiny", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], bias="all")),
    "gpt2-tiny-bias-lora": ("gpt2-tiny", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"],
                                              layers_to_transform=[1], bias="lora_only")),
    # trainable_token_indices (PEFT's TrainableTokens): rows of the embedding trained whole; GPT-2's tied head
    # reads them too; LLaMA's (untied) object form names the embedding
    "gpt2-tiny-tokens": ("gpt2-tiny", dict(r=4, lora_alpha=8, target_modules=["c_attn"],
                                           trainable_token_indices=list(range(3, 100, 6)))),
    "llama-tiny-tokens": ("llama-tiny", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                             trainable_token_indices={"embed_tokens": list(range(97, 0, -5))})),
    # LoRA on the (untied) LM head: target_modules "lm_head" next to q_proj
    "llama-tiny-head": ("llama-tiny", dict(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"])),
    # PEFT's lora_bias: lora_B carries a trained bias (out), y += scaling * (B A x + b); GPT-2's linears have
    # base biases (merge adds into them), LLaMA's none (training works, merging is refused)
    "gpt2-tiny-lora-bias": ("gpt2-tiny", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"],
                                              lora_bias=True)),
    "llama-tiny-lora-bias": ("llama-tiny", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                                lora_bias=True)),
    # LoRA on the embedding (PEFT's lora.Embedding: lora_embedding_A (r, vocab), lora_embedding_B (C, r)); GPT-2's
    # is tied to the head, which keeps reading the base matrix; LLaMA's with its own alpha (alpha_pattern)
    "gpt2-tiny-embed": ("gpt2-tiny", dict(r=4, lora_alpha=8, target_modules=["wte", "c_attn"])),
    "llama-tiny-embed": ("llama-tiny", dict(r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj", "down_proj"],
                                            alpha_pattern={"embed_tokens": 4})),
    # LLaMA (untied head): "norm" picks model.norm and every input_layernorm / post_attention_layernorm
    "llama-tiny-save": ("llama-tiny", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                           modules_to_save=["embed_tokens", "lm_head", "norm"])),
}


def saved_name(name):
    """The name PEFT saves a parameter under: no adapter name, a modules_to_save copy under its module's
    name, and a DoRA magnitude without ".weight"."""
    key = name.replace(".default", "").replace(".modules_to_save", "")
    return key[: -len(".weight")] if key.endswith("lora_magnitude_vector.weight") else key


def loss_of(model, inputs, targets, V):
    logits = model(input_ids=inputs).logits
    return logits, torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)


def random_adapters_and_batch(peft_model, V, B, T):
    """Adapters drawn N(0, 0.1^2) and a (B, T) batch with one ignored target, from a fixed generator."""
    gen = torch.Generator().manual_seed(4321)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_magnitude_vector" in name:  # DoRA: the row norms PEFT started from, moved by 10%
                p.mul_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif "modules_to_save" in name:  # a copy moved away from the base it started as
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif "trainable_tokens_delta" in name:  # the trained rows, moved from the base's
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.requires_grad and name.endswith("bias"):  # a bias PEFT's `bias` trains, moved the same way
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    ids = torch.randint(0, V, (B, T + 1), generator=gen)
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    targets[0, 3] = -100
    return inputs, targets


def adamw_losses(model, params, inputs, targets, V, steps=10):
    """The losses of `steps` AdamW steps (ADAMW) on params, one batch."""
    opt = torch.optim.AdamW(params, lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], foreach=False)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        _, l = loss_of(model, inputs, targets, V)
        l.backward()
        opt.step()
        losses.append(l.item())
    return losses


def run(case, base, lora_kwargs):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(os.path.join(BASES, base), attn_implementation="eager")
    model.eval()
    V = model.config.vocab_size
    peft_model = get_peft_model(model, LoraConfig(**{"lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM",
                                                     **lora_kwargs}))
    inputs, targets = random_adapters_and_batch(peft_model, V, B, T)

    out_dir = os.path.join(OUT, case)
    os.makedirs(out_dir, exist_ok=True)
    peft_model.peft_config["default"].base_model_name_or_path = base
    peft_model.save_pretrained(out_dir, safe_serialization=True)
    os.remove(os.path.join(out_dir, "README.md"))  # PEFT's model card: not a fixture
    saved = load_file(os.path.join(out_dir, "adapter_model.safetensors"))

    exact = copy.deepcopy(peft_model).double()
    logits, loss = loss_of(exact, inputs, targets, V)
    loss.backward()
    expected = {
        "input_ids": inputs.float(),
        "targets": targets.clamp(min=-1).float(),
        "logits": logits.detach().float().contiguous(),
        "loss": loss.detach().float().reshape(1),
    }
    for name, p in exact.named_parameters():
        if p.requires_grad:
            key = saved_name(name)
            assert key in saved, key
            expected["grad." + key] = p.grad.detach().float().contiguous()
    trainable = [(n, p) for n, p in peft_model.named_parameters() if p.requires_grad]
    # an adapted lm_head's own weight PEFT saves too (save_embedding_layers "auto"): not trained
    assert len(trainable) == len([k for k in saved if not k.endswith("base_layer.weight")]) == len(expected) - 4

    losses = adamw_losses(peft_model, [p for _, p in trainable], inputs, targets, V)
    expected["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    save_file(expected, os.path.join(out_dir, "expected.safetensors"))
    print(f"{case}: {len(saved)} adapter tensors, loss {loss.item():.6f}, "
          f"adamw {losses[0]:.4f} .. {losses[-1]:.4f} -> {out_dir}")


if __name__ == "__main__":
    # the cases named on the command line (default: all), so a new case does not rewrite the others
    names = sys.argv[1:] or list(CASES)
    for case in names:
        base, kw = CASES[case]
        run(case, base, kw)
    sys.exit(0)
