#!/usr/bin/env python3
"""LoRA files both ways between shardlm and PEFT, and `shardlm merge` against merge_and_unload.

Run by hand after building (needs torch, transformers, peft, safetensors; not part of `make test`):
    python3 tests/reference/check_lora_peft.py [build/shardlm]
For the tiny GPT-2 and LLaMA bases of tests/fixtures/model:
  1. shardlm -> PEFT: `shardlm train --lora-*` for a few steps on random tokens; its checkpoint directory
     loads with peft.PeftModel.from_pretrained(base, dir) and gives the logits `shardlm generate
     --adapter dir --logits-out` gives (max |diff| / max |logit| below 1e-5);
  2. PEFT -> shardlm: the adapters PEFT saved (tests/fixtures/lora) give the same logits in shardlm;
  (1 and 2 also with target_modules as PEFT's regular expression, with layers_to_transform, with
  rank_pattern / alpha_pattern / exclude_modules, with DoRA, with modules_to_save, with bias "all" /
  "lora_only" and with trainable_token_indices: a config's "lora" block one way, the *-regex, *-layers,
  *-pattern, *-dora, *-save, *-bias-* and *-tokens fixtures the other);
  3. merge: `shardlm merge` loads in transformers with PEFT's merged logits and its weights equal
     merge_and_unload()'s, in float32 and (for a base saved in bfloat16) in bfloat16 (measured: bit for
     bit in both, r = 4); a tied model's copied wte / lm_head is refused by name instead.
Prints one line per check and exits non-zero when any fails.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "shardlm"))
PROMPT = [5, 17, 3, 42, 8, 99, 0, 61, 23, 7]
failures = 0


def report(name, ok, detail):
    global failures
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")


def run(*args):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"shardlm {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return r.stdout


def write_shard(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def shardlm_logits(base, adapter, tmp):
    out = os.path.join(tmp, "logits.json")
    run("generate", "--model", base, "--adapter", adapter, "--prompt-ids", ",".join(map(str, PROMPT)),
        "--max-new-tokens", "1", "--temperature", "0", "--logits-out", out)
    return torch.tensor(json.load(open(out))["logits"])


def peft_logits(base, adapter):
    model = AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager", dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        return peft_model(input_ids=torch.tensor([PROMPT])).logits[0].float()


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def check_base(name, base, peft_adapter, targets, tmp):
    # 1. shardlm -> PEFT
    data = os.path.join(tmp, "data")
    os.makedirs(data, exist_ok=True)
    write_shard(os.path.join(data, "train_000000.bin"), np.random.default_rng(0).integers(0, 100, 4096))
    save = os.path.join(tmp, "run")
    if isinstance(targets, str):
        lora = ["--lora-r", "4", "--lora-alpha", "8", "--lora-targets", targets]
    else:  # a dict: more of the "lora" block (a target_modules regex, layers_to_transform), through a config
        targets = dict(targets)
        tied_copy = targets.pop("tied_copy", False)  # the PEFT fixture copies a tied model's wte or lm_head
        no_base_bias = targets.pop("no_base_bias", False)  # lora_bias on linears without a bias: no merge
        config = os.path.join(tmp, "lora.json")
        json.dump({"lora": {"r": 4, "lora_alpha": 8, **targets}}, open(config, "w"))
        lora = ["--config", config]
    run("train", "--model", base, "--data", data, "--seq-len", "16", "--batch-size", "2", "--steps", "4",
        "--lr", "5e-2", "--eval-interval", "0", "--sample-tokens", "0", "--save-dir", save, *lora, "--threads", "2")
    ckpt = os.path.join(save, open(os.path.join(save, "latest")).read().strip())
    ours, theirs = shardlm_logits(base, ckpt, tmp), peft_logits(base, ckpt)
    report(f"{name}_shardlm_adapter_loads_in_peft", rel(ours, theirs) < 1e-5,
           f"logits rel err {rel(ours, theirs):.2e}")
    # 2. PEFT -> shardlm
    ours, theirs = shardlm_logits(base, peft_adapter, tmp), peft_logits(base, peft_adapter)
    report(f"{name}_peft_adapter_loads_in_shardlm", rel(ours, theirs) < 1e-5,
           f"logits rel err {rel(ours, theirs):.2e}")
    # 3. merge, float32 and bfloat16 bases (a tied model's copied wte / lm_head cannot merge: refused)
    if not isinstance(targets, str) and no_base_bias:  # PEFT's merge raises; shardlm's refuses by name
        r = subprocess.run([BIN, "merge", "--model", base, "--adapter", peft_adapter, "--output",
                            os.path.join(tmp, "merged")], capture_output=True, text=True)
        try:
            PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), peft_adapter).merge_and_unload()
            peft_refuses = False
        except RuntimeError as e:
            peft_refuses = "lora_bias" in str(e)
        report(f"{name}_merge_refused_as_in_peft", r.returncode == 1 and "has no bias" in r.stderr and peft_refuses
               and not os.path.exists(os.path.join(tmp, "merged")), r.stderr.strip()[-160:])
        return
    if not isinstance(targets, str) and tied_copy:
        r = subprocess.run([BIN, "merge", "--model", base, "--adapter", peft_adapter, "--output",
                            os.path.join(tmp, "merged")], capture_output=True, text=True)
        report(f"{name}_merge_refuses_tied_copies", r.returncode == 1 and "tie_word_embeddings" in r.stderr and
               not os.path.exists(os.path.join(tmp, "merged")), r.stderr.strip()[-160:])
        return
    for dtype in (torch.float32, torch.bfloat16):
        tag = str(dtype).split(".")[1]
        base_dir = base
        if dtype != torch.float32:
            base_dir = os.path.join(tmp, f"base-{tag}")
            AutoModelForCausalLM.from_pretrained(base, dtype=dtype).save_pretrained(base_dir)
        out = os.path.join(tmp, f"merged-{tag}")
        run("merge", "--model", base_dir, "--adapter", peft_adapter, "--output", out)
        peft_model = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager", dtype=dtype), peft_adapter)
        want_model = peft_model.merge_and_unload().eval()
        want = {k: v for k, v in want_model.state_dict().items()}
        got = load_file(os.path.join(out, "model.safetensors"))
        worst, differing, total = 0.0, 0, 0
        for k, v in got.items():
            ref = want[k] if k in want else want["transformer." + k]
            report_dtype = v.dtype == dtype
            if not report_dtype:
                report(f"{name}_merge_{tag}_dtype", False, f"{k} stored as {v.dtype}")
                break
            worst = max(worst, ((v.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-30)).item())
            differing += int((v != ref).sum())
            total += v.numel()
        loaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=dtype).eval()
        with torch.no_grad():
            lg = loaded(input_ids=torch.tensor([PROMPT])).logits[0].float()
            lw = want_model(input_ids=torch.tensor([PROMPT])).logits[0].float()
        tol = 1e-6 if dtype == torch.float32 else 1e-2
        report(f"{name}_merge_{tag}_equals_merge_and_unload", worst < tol and rel(lg, lw) < tol,
               f"weights worst rel err {worst:.2e} ({differing} of {total} values differ), "
               f"logits rel err {rel(lg, lw):.2e}")


if __name__ == "__main__":
    cases = [("gpt2", "gpt2-tiny", "gpt2-tiny-all", "c_attn,c_proj,c_fc"),
             ("llama", "llama-tiny", "llama-tiny-qvud", "q_proj,v_proj,up_proj,down_proj"),
             # target_modules as a regular expression, and layers_to_transform (through a config file), both ways
             ("gpt2_regex", "gpt2-tiny", "gpt2-tiny-regex",
              {"target_modules": r"transformer\.h\.1\.(attn\.c_attn|mlp\.c_proj)"}),
             ("llama_regex", "llama-tiny", "llama-tiny-regex", {"target_modules": r".*\.layers\.0\..*_proj"}),
             ("llama_layers", "llama-tiny", "llama-tiny-layers",
              {"target_modules": ["k_proj", "up_proj"], "layers_to_transform": [0], "layers_pattern": "layers"}),
             ("gpt2_layers", "gpt2-tiny", "gpt2-tiny-layers", {"target_modules": ["c_fc"], "layers_to_transform": 1}),
             # rank_pattern / alpha_pattern / exclude_modules (a list; a regular expression with rsLoRA)
             ("llama_pattern", "llama-tiny", "llama-tiny-pattern",
              {"target_modules": "all-linear", "rank_pattern": {"down_proj": 3, r"layers\.1\..*": 5, "q_proj": 2},
               "alpha_pattern": {"o_proj": 3}, "exclude_modules": ["model.layers.1.self_attn.k_proj"]}),
             ("gpt2_pattern", "gpt2-tiny", "gpt2-tiny-pattern",
              {"target_modules": ["c_attn", "c_fc"], "use_rslora": True, "rank_pattern": {"c_fc": 6},
               "alpha_pattern": {r"transformer\.h\.0\.attn\.c_attn": 2}, "exclude_modules": r".*\.1\.attn\..*"}),
             # DoRA (use_dora): magnitudes, merged as W' = m / ||W + dW|| (W + dW) row by row
             ("llama_dora", "llama-tiny", "llama-tiny-dora", {"target_modules": "all-linear", "use_dora": True}),
             ("gpt2_dora", "gpt2-tiny", "gpt2-tiny-dora",
              {"target_modules": ["c_attn", "c_fc"], "use_dora": True, "use_rslora": True}),
             # modules_to_save: whole copies next to the adapters (LLaMA's merge into the untied model)
             ("llama_save", "llama-tiny", "llama-tiny-save",
              {"target_modules": ["q_proj"], "modules_to_save": ["embed_tokens", "lm_head", "norm"]}),
             ("gpt2_save", "gpt2-tiny", "gpt2-tiny-save",
              {"target_modules": ["c_attn"], "modules_to_save": ["wte", "ln_f"], "tied_copy": True}),
             # PEFT's bias: "all" and "lora_only" (trained biases merge into the base)
             ("gpt2_bias_all", "gpt2-tiny", "gpt2-tiny-bias-all", {"target_modules": ["c_fc"], "bias": "all"}),
             ("gpt2_bias_lora", "gpt2-tiny", "gpt2-tiny-bias-lora",
              {"target_modules": ["c_attn", "c_proj"], "bias": "lora_only"}),
             # an adapter on the untied LM head (PEFT also saves the head's weight: shardlm checks it)
             ("llama_head", "llama-tiny", "llama-tiny-head", {"target_modules": ["v_proj", "lm_head"]}),
             # trainable_token_indices (GPT-2's tied head reads the rows too; LLaMA's object form)
             ("gpt2_tokens", "gpt2-tiny", "gpt2-tiny-tokens",
              {"target_modules": ["c_fc"], "trainable_token_indices": [2, 11, 40]}),
             ("llama_tokens", "llama-tiny", "llama-tiny-tokens",
              {"target_modules": ["q_proj"], "trainable_token_indices": {"embed_tokens": [0, 9, 99]}}),
             # LoRA on the embedding (GPT-2's is tied to the head: merge refused; LLaMA's merges into embed_tokens)
             ("gpt2_embed", "gpt2-tiny", "gpt2-tiny-embed", {"target_modules": ["wte", "c_fc"], "tied_copy": True}),
             ("llama_embed", "llama-tiny", "llama-tiny-embed",
              {"target_modules": ["embed_tokens", "v_proj"], "alpha_pattern": {"embed_tokens": 2}}),
             # lora_bias: a trained bias on lora_B (GPT-2 merges it into its biases; LLaMA has none: refused)
             ("gpt2_lora_bias", "gpt2-tiny", "gpt2-tiny-lora-bias",
              {"target_modules": ["c_attn", "c_proj", "c_fc"], "lora_bias": True}),
             ("llama_lora_bias", "llama-tiny", "llama-tiny-lora-bias",
              {"target_modules": ["q_proj", "down_proj"], "lora_bias": True, "no_base_bias": True}),
             ("gpt2_save_head", "gpt2-tiny", "gpt2-tiny-save-head",
              {"target_modules": ["c_fc"], "modules_to_save": ["lm_head", "wpe"], "tied_copy": True})]
    for name, base, adapter, targets in cases:
        with tempfile.TemporaryDirectory() as tmp:
            check_base(name, os.path.join(ROOT, "tests/fixtures/model", base),
                       os.path.join(ROOT, "tests/fixtures/lora", adapter), targets, tmp)
    sys.exit(1 if failures else 0)
