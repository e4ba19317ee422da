#!/usr/bin/env python3
"""make_hf5_fixtures.py: writes the transformers 5 fidelity fixtures under tests/fixtures/hf5/.

Run from the repository root:  python3 tests/reference/make_hf5_fixtures.py
Needs torch, transformers 5 (made with
5.24.0, torch 2.15), safetensors and numpy. Deterministic: fixed seeds, one CPU thread, float32; a rerun
writes the same bytes. The outputs are committed; tests/unit/test_hf_fidelity.c checks shardlm against them
and tests/reference/check_hf5_roundtrip.sh has transformers load what shardlm writes from them.

Each fixture tests/fixtures/hf5/<name>/ is a tiny 2-layer model as save_pretrained writes it (config.json,
model.safetensors in float32, generation_config.json) with random weights (uniform in [-0.5, 0.5); RMSNorm
weights uniform in [0.5, 1.5)), whose config gives a non-default value to every numeric key (rope theta,
rms_norm_eps, head_dim, GQA ratio, intermediate size not a multiple of 64, vocabulary sizes around 100..150
with some not a multiple of 128, bos/eos ids, tied or untied), plus expected.json:
  transformers_version
  input_ids    24 pseudo-random token ids in [0, vocab_size)
  logits       the float32 logits of model(input_ids) (24 x vocab_size), computed on a freshly loaded model,
               written with 9 significant digits (exactly the float32 values)
  prompt_ids   the first 8 of input_ids
  greedy_ids   32 tokens of greedy decoding after the prompt: an explicit loop through the KV cache (the whole
               prompt first, then one token per step, argmax of the last logits); model.generate(do_sample=False,
               32 new tokens, an end token that never occurs) gives the same ids; at every step the top-2 logits
               differ by more than 1e-3 (otherwise the weights are drawn again with another seed).

Checks made while writing (the script stops on a failure): the model reloaded from the written directory with
from_pretrained gives logits bitwise equal to the in-memory model's, and reads back the same config values
(rope_parameters, head_dim, eps, ...); eager and sdpa attention agree; except for dynamic RoPE, the cached
greedy run's logits equal a full forward over the same 40 tokens (dynamic NTK changes the frequencies as
positions pass max_position_embeddings, so there keys keep the frequencies of the step that cached them:
the fixture records transformers' cached behaviour).

llama-v4-layout and llama-v4-llama3 have config.json rewritten after saving in transformers 4.x's layout
(top-level rope_theta and rope_scaling, no rope_parameters); their expected values come from transformers 5
loading that file, and the script asserts transformers 5 reads the same RoPE settings from it.
"""
import copy
import json
import math
import os
import shutil

import numpy as np
import torch
import transformers
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

OUT = os.path.join("tests", "fixtures", "hf5")
T, PROMPT, NEW = 24, 8, 32
MIN_GAP = 1e-3       # top-2 logit gap required at every greedy step
MIN_DISTINCT = 8     # greedy_ids must not collapse into a short loop of a few tokens
SEEDS_PER_FIXTURE = 20

LLAMA = (LlamaConfig, LlamaForCausalLM)
QWEN2 = (Qwen2Config, Qwen2ForCausalLM)
MISTRAL = (MistralConfig, MistralForCausalLM)


def llama3(theta, original, factor=8.0, low=1.0, high=4.0):
    return {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": low,
            "high_freq_factor": high, "original_max_position_embeddings": original}


# name: (family, config kwargs, 4.x layout to write into config.json or None)
FIXTURES = {
    # theta 500000; head_dim 16 != hidden 32 / 4 heads (q width 64); GQA 4:1; untied; eps 1e-5; intermediate 100
    "llama-theta": (LLAMA, dict(
        vocab_size=120, hidden_size=32, intermediate_size=100, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=3, eos_token_id=4,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}), None),
    # tied embeddings; GQA 6:3 with head_dim 12 (hidden 72); intermediate 77; theta 25000; vocab 131;
    # eps 3e-6; pad_token_id 0 (nn.Embedding's padding_idx)
    "llama-tied": (LLAMA, dict(
        vocab_size=131, hidden_size=72, intermediate_size=77, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=3, max_position_embeddings=48, rms_norm_eps=3e-6, tie_word_embeddings=True,
        bos_token_id=7, eos_token_id=8, pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 25000.0}), None),
    # linear factor 2.5, theta 40000; GQA 3:1 with head_dim 8; eps 0.01, large enough to move the logits
    "llama-linear": (LLAMA, dict(
        vocab_size=101, hidden_size=24, intermediate_size=45, num_hidden_layers=2, num_attention_heads=3,
        num_key_value_heads=1, max_position_embeddings=64, rms_norm_eps=1e-2, tie_word_embeddings=False,
        bos_token_id=10, eos_token_id=11,
        rope_parameters={"rope_type": "linear", "rope_theta": 40000.0, "factor": 2.5}), None),
    # dynamic NTK, factor 4, max_position_embeddings 16: the 24-token forward and the 40-position greedy run
    # go past it (the cached run changes frequencies at every step from position 16 on)
    "llama-dynamic": (LLAMA, dict(
        vocab_size=97, hidden_size=24, intermediate_size=44, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=16, rms_norm_eps=4e-6, tie_word_embeddings=True,
        bos_token_id=20, eos_token_id=21,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 30000.0, "factor": 4.0}), None),
    # llama3, factor 8, low 1, high 4, theta 10000, head_dim 16 (!= 24 / 2). original_max_position_embeddings is 32, not
    # 16: the shortest wavelength is 2*pi, so the "unchanged" band (wavelength < original / high_freq_factor)
    # needs original > 8*pi; with 32 the 8 frequencies fall in all three bands (asserted below)
    "llama-llama3": (LLAMA, dict(
        vocab_size=110, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, rms_norm_eps=2e-5,
        tie_word_embeddings=False, bos_token_id=30, eos_token_id=31,
        rope_parameters=llama3(10000.0, 32)), None),
    # yarn factor 4, original 16, max positions 64, beta_fast 32 / beta_slow 1 given, attention factor derived
    # (0.1 ln 4 + 1); theta 500 puts the ramp's ends at 0 and 2 (one frequency half interpolated); vocab 128;
    # head_dim 16 != 24 / 2
    "llama-yarn": (LLAMA, dict(
        vocab_size=128, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, rms_norm_eps=5e-6, tie_word_embeddings=True,
        bos_token_id=40, eos_token_id=41,
        rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0}), None),
    # yarn with attention_factor 1.3, beta_fast 16, beta_slow 2, truncate false; original 128 (max 512) and
    # theta 1000 make both ends of the ramp fractional (0.28, 2.69), so truncation would change numbers;
    # head_dim 16 != 24 / 2
    "llama-yarn-explicit": (LLAMA, dict(
        vocab_size=100, hidden_size=24, intermediate_size=39, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=50, eos_token_id=51,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                         "original_max_position_embeddings": 128, "attention_factor": 1.3, "beta_fast": 16.0,
                         "beta_slow": 2.0, "truncate": False}), None),
    # yarn with mscale 0.7 / mscale_all_dim 0.5 (DeepSeek style), no attention_factor; head_dim 16 != 24 / 2
    "llama-yarn-mscale": (LLAMA, dict(
        vocab_size=99, hidden_size=24, intermediate_size=52, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, rms_norm_eps=2e-6,
        tie_word_embeddings=True, bos_token_id=60, eos_token_id=61,
        rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "mscale": 0.7, "mscale_all_dim": 0.5}), None),
    # Qwen2: q/k/v biases, tied, GQA 4:2 (head_dim 10), theta 1e6, eps 1e-6, intermediate 44, vocab 150;
    # use_sliding_window false with sliding_window 8 and max_window_layers 1 passed (Qwen2Config nulls the window
    # and makes every layer full attention: the window must not be applied)
    "qwen2": (QWEN2, dict(
        vocab_size=150, hidden_size=40, intermediate_size=44, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=True,
        use_sliding_window=False, sliding_window=8, max_window_layers=1, bos_token_id=5, eos_token_id=6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}), None),
    # Mistral: sliding_window 8 (shorter than the 24-token forward and the 40-position greedy run);
    # head_dim 12 != 24 / 4 (q width 48); GQA 4:1; untied; theta 100000
    "mistral": (MISTRAL, dict(
        vocab_size=100, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=12, max_position_embeddings=64, rms_norm_eps=1e-5, sliding_window=8,
        tie_word_embeddings=False, bos_token_id=70, eos_token_id=71,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0}), None),
    # 4.x layout: top-level rope_theta 250000, rope_scaling {"type": "linear", "factor": 2.0}; MHA (3:3)
    "llama-v4-layout": (LLAMA, dict(
        vocab_size=100, hidden_size=24, intermediate_size=45, num_hidden_layers=2, num_attention_heads=3,
        num_key_value_heads=3, max_position_embeddings=64, rms_norm_eps=5e-6, tie_word_embeddings=False,
        bos_token_id=80, eos_token_id=81,
        rope_parameters={"rope_type": "linear", "rope_theta": 250000.0, "factor": 2.0}),
        {"rope_theta": 250000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}),
    # 4.x layout: top-level rope_theta 20000, rope_scaling {"rope_type": "llama3", factor 8, low 1, high 4,
    # original 16); head_dim 16 != 24 / 2
    "llama-v4-llama3": (LLAMA, dict(
        vocab_size=113, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=90, eos_token_id=91,
        rope_parameters=llama3(20000.0, 16)),
        {"rope_theta": 20000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
}

# config values the reloaded model must read back as the in-memory model has them
CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
               "bos_token_id", "eos_token_id", "pad_token_id", "sliding_window", "use_sliding_window", "layer_types")


class Redraw(Exception):
    """The drawn weights give a near tie or a degenerate greedy run: draw again with the next seed."""


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied lm_head is the embedding (listed once)
            u = torch.rand(p.shape, generator=g, dtype=torch.float32)
            p.copy_(u + 0.5 if name.endswith("norm.weight") else u - 0.5)


def load(path, attn="sdpa"):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn).eval()


def forward_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def greedy(model, prompt):
    """Greedy decoding through the KV cache: the prompt first, then one token per step.
    Returns the new ids, the last-position logits of each step, and the smallest top-2 gap."""
    ids, steps, past, x, gap = [], [], None, torch.tensor([prompt]), math.inf
    with torch.no_grad():
        for _ in range(NEW):
            out = model(input_ids=x, past_key_values=past, use_cache=True)
            past, last = out.past_key_values, out.logits[0, -1]
            top = torch.topk(last, 2).values
            gap = min(gap, float(top[0] - top[1]))
            ids.append(int(torch.argmax(last)))
            steps.append(last.clone())
            x = torch.tensor([[ids[-1]]])
    return ids, torch.stack(steps), gap


def rope_of(cfg):
    return {k: v for k, v in cfg.rope_parameters.items()}


def write_v4_layout(path, v4):
    """Rewrites config.json in transformers 4.x's layout: rope_parameters replaced by top-level keys."""
    with open(path) as f:
        cfg = json.load(f)
    del cfg["rope_parameters"]
    cfg.update(v4)
    with open(path, "w") as f:  # save_pretrained's own format: indent 2, sorted keys, final newline
        f.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def band_report(name, model, cfg):
    """Prints which inverse frequencies the RoPE type changed and how (for llama3 and yarn)."""
    rp = cfg.rope_parameters
    d = cfg.head_dim
    base = 1.0 / (rp["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    inv = model.model.rotary_emb.inv_freq.float()
    ratio = (base / inv).tolist()
    factor = rp["factor"]
    kinds = ["unchanged" if abs(r - 1) < 1e-6 else f"/factor" if abs(r - factor) < 1e-5 * factor else "blended"
             for r in ratio]
    print(f"  {name}: inv_freq base/scaled ratios {[round(r, 4) for r in ratio]} -> {kinds}; "
          f"attention_scaling {model.model.rotary_emb.attention_scaling!r}")
    return set(kinds)


def fmt(x):
    """Nine significant digits: enough to give back the float32 value exactly."""
    v = float(f"{x:.9g}")
    assert np.float32(v) == np.float32(x)
    return v


def make(index, name, family, kwargs, v4, seed):
    config_cls, model_cls = family
    path = os.path.join(OUT, name)
    g = torch.Generator().manual_seed(1000 + index)
    ids = [int(t) for t in torch.randint(0, kwargs["vocab_size"], (T,), generator=g)]
    prompt = ids[:PROMPT]

    model = model_cls(config_cls(**copy.deepcopy(kwargs))).eval()
    randomise(model, seed)
    mem_logits = forward_logits(model, ids)  # a fresh model: dynamic RoPE has no state yet

    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(path)
    if v4 is not None:
        write_v4_layout(os.path.join(path, "config.json"), v4)

    # what the files say: a fresh load, its logits first (dynamic RoPE keeps state between calls)
    loaded = load(path)
    logits = forward_logits(loaded, ids)
    assert torch.equal(logits, mem_logits), \
        f"{name}: reloaded logits differ from the in-memory model's by {float((logits - mem_logits).abs().max())}"
    want, got = rope_of(model.config), rope_of(loaded.config)
    assert all(got.get(k) == v for k, v in want.items()), f"{name}: transformers read {got}, expected {want}"
    for k in CONFIG_KEYS:
        assert getattr(loaded.config, k, None) == getattr(model.config, k, None), \
            f"{name}: {k} reads back as {getattr(loaded.config, k, None)!r}, not {getattr(model.config, k, None)!r}"
    if v4 is not None:
        rs = v4["rope_scaling"]
        assert got["rope_theta"] == v4["rope_theta"] and got["factor"] == rs["factor"] and \
            got["rope_type"] == rs.get("rope_type", rs.get("type")), f"{name}: 4.x layout read as {got}"

    new, step_logits, gap = greedy(loaded, prompt)
    if gap <= MIN_GAP:
        raise Redraw(f"top-2 gap {gap:.2e}")
    if len(set(new)) < MIN_DISTINCT:
        raise Redraw(f"only {len(set(new))} distinct greedy tokens")

    # model.generate with an end token that greedy decoding never produces: no early stop, and the
    # min_new_tokens processor's suppression of that token changes no argmax
    stop = min(set(range(kwargs["vocab_size"])) - set(new))
    gen = loaded.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, PROMPT, dtype=torch.long),
                          do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=stop,
                          pad_token_id=stop)
    assert gen[0, PROMPT:].tolist() == new, f"{name}: generate() gives {gen[0, PROMPT:].tolist()}, loop {new}"

    # eager attention gives the same logits (the fixture does not depend on sdpa's kernel)
    eager = forward_logits(load(path, "eager"), ids)
    assert torch.allclose(eager, logits, rtol=1e-5, atol=1e-5), f"{name}: eager and sdpa differ"

    # the cached run against one full forward over the same 40 tokens
    full = forward_logits(load(path), prompt + new)[PROMPT - 1:PROMPT - 1 + NEW]
    drift = float((full - step_logits).abs().max())
    dynamic = loaded.config.rope_parameters["rope_type"] == "dynamic"
    if not dynamic:
        assert drift < 1e-4, f"{name}: cached greedy logits differ from a full forward by {drift}"
    else:
        flips = sum(int(a) != int(b) for a, b in zip(full.argmax(-1), step_logits.argmax(-1)))
        print(f"  {name}: the cached run differs from a full forward by up to {drift:.3g} "
              f"({flips} of {NEW} argmaxes differ): the cache keeps each step's RoPE frequencies")

    # how much rms_norm_eps moves the logits (1e-6 instead of the fixture's value)
    if loaded.config.rms_norm_eps != 1e-6:
        other = model_cls(config_cls(**{**copy.deepcopy(kwargs), "rms_norm_eps": 1e-6})).eval()
        other.load_state_dict(model.state_dict())
        d = float(((forward_logits(other, ids) - logits).abs() / logits.abs().clamp(min=1)).max())
        print(f"  {name}: rms_norm_eps {loaded.config.rms_norm_eps:g} vs 1e-6 moves the logits by {d:.2g} (relative)")

    rp = loaded.config.rope_parameters
    if rp["rope_type"] in ("llama3", "yarn"):
        kinds = band_report(name, loaded, loaded.config)
        if name == "llama-llama3":
            assert kinds == {"unchanged", "/factor", "blended"}, f"{name}: bands {kinds}"

    expected = {"transformers_version": transformers.__version__, "input_ids": ids,
                "logits": [[fmt(v) for v in row] for row in logits.tolist()], "prompt_ids": prompt,
                "greedy_ids": new}
    with open(os.path.join(path, "expected.json"), "w") as f:
        json.dump(expected, f, separators=(",", ":"))
        f.write("\n")

    c = loaded.config
    print(f"{name}: {type(loaded).__name__} seed {seed}; rope_parameters {rp}; head_dim "
          f"{getattr(c, 'head_dim', None)} (hidden {c.hidden_size} / {c.num_attention_heads} heads), kv heads "
          f"{c.num_key_value_heads}, intermediate {c.intermediate_size}, vocab {c.vocab_size}, eps {c.rms_norm_eps}, "
          f"tied {c.tie_word_embeddings}, window {getattr(c, 'sliding_window', None)}, bos/eos/pad "
          f"{c.bos_token_id}/{c.eos_token_id}/{c.pad_token_id}; logits in [{float(logits.min()):.2f}, "
          f"{float(logits.max()):.2f}] std {float(logits.std()):.2f}; greedy {len(set(new))} distinct, "
          f"min top-2 gap {gap:.3g}")


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.utils.logging.disable_progress_bar()
    os.makedirs(OUT, exist_ok=True)
    for d in sorted(os.listdir(OUT)):  # fixtures no longer made here
        if d not in FIXTURES and os.path.exists(os.path.join(OUT, d, "expected.json")):
            print(f"removing stale fixture {d}")
            shutil.rmtree(os.path.join(OUT, d))
    for index, (name, (family, kwargs, v4)) in enumerate(FIXTURES.items()):
        for seed in range(100 * index + 1, 100 * index + 1 + SEEDS_PER_FIXTURE):
            try:
                make(index, name, family, kwargs, v4, seed)
                break
            except Redraw as why:
                print(f"  {name}: seed {seed}: {why}, drawing again")
        else:
            raise SystemExit(f"{name}: no seed in {SEEDS_PER_FIXTURE} gave usable weights")
    total = 0
    for root, _, files in sorted(os.walk(OUT)):
        for fn in sorted(files):
            p = os.path.join(root, fn)
            total += os.path.getsize(p)
            print(f"{os.path.getsize(p):8d}  {p}")
    print(f"{total:8d}  total")


if __name__ == "__main__":
    main()
