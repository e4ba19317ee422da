#!/usr/bin/env python3
"""torch_finetune.py: the PyTorch side of bench/finetune.sh, and the maker of the models and token data
both sides read.

  torch_finetune.py make --out DIR [--seed 1234] [--tokens N]
      writes DIR/gpt2 (GPT-2 124M: 12 layers, 12 heads, C=768, 1024 positions, vocab 50257, tied
      embeddings, dropout 0) and DIR/llama (a LLaMA of similar size: hidden 768, 12 layers, 12 heads
      (12 key/value heads), intermediate 2048, vocab 32000, 1024 positions, untied head, SiLU,
      RMSNorm eps 1e-5, rope_theta 10000), random weights from transformers' initialisation at the
      seed, saved by save_pretrained as fp32 model.safetensors + config.json; and DIR/data-gpt2,
      DIR/data-llama: one token shard train_000000.bin each (llm.c's format, docs/data.md: 1024-byte
      header, uint16 tokens) of N tokens drawn uniformly from the model's vocabulary.

  torch_finetune.py train --model DIR --data DIR --mode lora|dora|qlora|full --batch 4 --seq 256
                          --threads 2 --steps S --warmup W [--lora-r 16 --lora-alpha 32]
                          [--precision fp32|bf16]
      fine-tunes the model on the shard's windows, read as shardlm's loader reads them without shuffling
      (window k = tokens [k*B*T, k*B*T + B*T + 1), inputs its first B*T tokens, targets the last B*T),
      so both sides see the same batches in the same order:
        lora:  PEFT LoRA (get_peft_model, LoraConfig r, lora_alpha, lora_dropout 0, bias "none", every
               linear of the blocks: GPT-2 c_attn, c_proj, c_fc (c_proj names attn.c_proj and
               mlp.c_proj; fan_in_fan_out for GPT-2's Conv1D), LLaMA q/k/v/o/gate/up/down_proj) on the
               fp32 base;
        dora:  the LoRA adapters with use_dora (DoRA: a magnitude per output row);
        qlora: the same adapters on a base loaded through BitsAndBytesConfig(load_in_4bit, nf4, double
               quantisation, compute dtype float32), device_map cpu (bitsandbytes' CPU 4-bit path);
        full:  every parameter trained (no PEFT).
      --precision bf16: forward and loss under torch.autocast("cpu", torch.bfloat16) (fp32 parameters,
      gradients and AdamW, as bench/torch_train.py), and bitsandbytes' compute dtype bfloat16 for qlora.
      Step: zero_grad, forward (attention "sdpa"), F.cross_entropy over all B*T positions, backward,
      clip_grad_norm_(trainable, 1.0), AdamW (lr 1e-4, betas 0.9/0.95, eps 1e-8, weight decay 0) over
      the trainable parameters: what shardlm train runs with the flags bench/finetune.sh gives it. W
      untimed steps, then S timed; one JSON line: ms_per_step (mean of the timed steps), tokens_per_s,
      every step's loss, the first step's loss (the base model's loss on the first window: the same on
      both sides), parameters, trainable parameters, versions, other_load. Prints "step K/N ..." after
      each step (finetune_run.py watches for the first one). --profile-steps P: P more steps after the timed
      ones under torch.profiler; the line then also holds "profile": ms per step of the profiled steps and
      of the matrix products (aten::mm / addmm / bmm / baddbmm, self CPU time), fused attention and the
      loss's log-softmax / NLL, and the top ops (bench/finetune.sh's where-the-time-goes pass).

Peak memory is measured outside this process, by bench/finetune_run.py, as for shardlm.
"""
import argparse
import json
import os
import sys
import time

from bench_util import machine_busy_seconds, step_times_ms

GPT2_TARGETS = ["c_attn", "c_proj", "c_fc"]
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SHARD_MAGIC_U16 = 20240520


def write_shard(path, tokens):
    """llm.c's token shard (docs/data.md): 256 little-endian int32 header, then uint16 tokens."""
    import numpy as np
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = SHARD_MAGIC_U16, 1, len(tokens)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())
    os.replace(tmp, path)


def read_shard(path):
    import numpy as np
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        if header[0] != SHARD_MAGIC_U16:
            sys.exit(f"torch_finetune: {path}: magic {header[0]}, expected {SHARD_MAGIC_U16} (uint16 tokens)")
        tokens = np.frombuffer(f.read(), dtype="<u2")
    if len(tokens) != header[2]:
        sys.exit(f"torch_finetune: {path}: header says {header[2]} tokens, the file holds {len(tokens)}")
    return tokens.astype("int64")


def make(a):
    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    models = {
        "gpt2": (GPT2LMHeadModel, GPT2Config(
            vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=3072,
            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            layer_norm_epsilon=1e-5, tie_word_embeddings=True, bos_token_id=50256, eos_token_id=50256)),
        "llama": (LlamaForCausalLM, LlamaConfig(
            vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
            num_attention_heads=12, num_key_value_heads=12, hidden_act="silu", max_position_embeddings=1024,
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
            mlp_bias=False, bos_token_id=1, eos_token_id=2)),
    }
    for name, (cls, cfg) in models.items():
        out = os.path.join(a.out, name)
        if not os.path.exists(os.path.join(out, "model.safetensors")):
            torch.manual_seed(a.seed)
            model = cls(cfg).float()
            model.save_pretrained(out, safe_serialization=True)
            n = sum(p.numel() for p in model.parameters())
            print(f"torch_finetune: wrote {out} ({n} parameters)", file=sys.stderr)
        data = os.path.join(a.out, f"data-{name}")
        shard = os.path.join(data, "train_000000.bin")
        if not os.path.exists(shard):
            os.makedirs(data, exist_ok=True)
            rng = np.random.default_rng(a.seed)
            write_shard(shard, rng.integers(0, cfg.vocab_size, size=a.tokens))
            print(f"torch_finetune: wrote {shard} ({a.tokens} tokens)", file=sys.stderr)


def resident_bytes():
    """VmRSS of this process, from /proc/self/status; None where unreadable."""
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def train(a):
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    if a.mode != "full":
        import peft
        from peft import LoraConfig, get_peft_model
    if a.mode == "qlora":
        import bitsandbytes
        from transformers import BitsAndBytesConfig
    import_rss = resident_bytes()  # the interpreter and its libraries, before any model exists

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cfg = AutoConfig.from_pretrained(a.model)
    arch = cfg.model_type
    kw = {"dtype": torch.float32, "attn_implementation": "sdpa"}
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    if a.mode == "qlora":
        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16 if a.precision == "bf16" else torch.float32)
        kw["device_map"] = "cpu"
        versions["bitsandbytes"] = bitsandbytes.__version__
    t_load = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model, **kw)
    model.config.use_cache = False
    n_params = sum(p.numel() for p in model.parameters())
    if a.mode in ("lora", "dora", "qlora"):
        targets = GPT2_TARGETS if arch == "gpt2" else LLAMA_TARGETS
        lc = LoraConfig(r=a.lora_r, lora_alpha=a.lora_alpha, lora_dropout=0.0, bias="none", target_modules=targets,
                        task_type="CAUSAL_LM", fan_in_fan_out=arch == "gpt2", use_dora=a.mode == "dora")
        model = get_peft_model(model, lc)
        versions["peft"] = peft.__version__
    model.train()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    checkpointing = any(getattr(m, "gradient_checkpointing", False) is True for m in base.modules())
    t_load = time.perf_counter() - t_load
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    opt = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)

    tokens = read_shard(a.data)
    BT = a.batch * a.seq
    windows = (len(tokens) - 1) // BT
    if windows < 1:
        sys.exit(f"torch_finetune: {a.data} holds {len(tokens)} tokens, fewer than one window of {BT + 1}")
    tokens = torch.from_numpy(tokens)

    def batch(k):  # shardlm's loader without shuffling: window k of the shard, epochs wrap around
        w = tokens[(k % windows) * BT:(k % windows) * BT + BT + 1]
        return w[:-1].view(a.batch, a.seq), w[1:].view(a.batch, a.seq)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        return loss.item()

    total = a.warmup + a.steps
    losses, times = [], []
    busy0 = own0 = wall0 = None
    for k in range(total):
        if k == a.warmup:
            busy0, own0, wall0 = machine_busy_seconds(), time.process_time(), time.perf_counter()
        x, y = batch(k)
        t0 = time.perf_counter()
        losses.append(step(x, y))
        if k >= a.warmup:
            times.append(time.perf_counter() - t0)
        print(f"step {k + 1}/{total} | loss {losses[-1]:.4f}", flush=True)
    wall, own = time.perf_counter() - wall0, time.process_time() - own0
    busy1 = machine_busy_seconds()
    profile = profile_steps(a, step, batch, total) if a.profile_steps else None
    other_load = max(0.0, (busy1 - busy0 - own) / wall) if busy0 is not None and busy1 is not None else -1
    mean = sum(times) / len(times)
    out = {
        "impl": "pytorch", "mode": a.mode, "arch": arch, "precision": a.precision, "B": a.batch, "T": a.seq, "threads": a.threads,
        "steps": a.steps, "warmup": a.warmup, **step_times_ms(times),
        "tokens_per_s": round(BT / mean, 2), "first_loss": round(losses[0], 5), "losses": [round(v, 5) for v in losses],
        "params": n_params, "trainable_params": n_trainable, "load_s": round(t_load, 2), "import_rss_bytes": import_rss,
        "lora_r": a.lora_r if a.mode != "full" else 0, "lora_alpha": a.lora_alpha if a.mode != "full" else 0,
        "torch_threads": torch.get_num_threads(), "gradient_checkpointing": checkpointing, "other_load": round(other_load, 2),
        "own_cpu_util": round(own / wall, 2), **versions,
    }
    if profile:
        out["profile"] = profile
    print(json.dumps(out), flush=True)


# torch.profiler's CPU ops by category: the matrix products (the base linears and the adapters' alike),
# fused attention, and the loss's log-softmax / NLL; everything else is "other".
PROFILE_CATEGORIES = {
    "gemm": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                  "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
    "cross_entropy": ("aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::nll_loss_forward",
                      "aten::nll_loss_backward"),
}


def profile_steps(a, step, batch, done):
    """a.profile_steps more steps under torch.profiler (after the timed ones, so the headline is unprofiled):
    ms per step of the whole step and of each category's ops, by their self CPU time (an op's wall time on the
    calling thread, its intra-op threads' work inside it), and the top ops."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for k in range(done, done + a.profile_steps):
            step(*batch(k))
        wall = time.perf_counter() - t0
    self_ms = {}
    for e in prof.key_averages():
        self_ms[e.key] = self_ms.get(e.key, 0.0) + e.self_cpu_time_total / 1e3 / a.profile_steps
    out = {"steps": a.profile_steps, "step_ms": round(1e3 * wall / a.profile_steps, 2)}
    for cat, names in PROFILE_CATEGORIES.items():
        out[cat + "_ms"] = round(sum(self_ms.get(n, 0.0) for n in names), 2)
    out["top_ms"] = {k: round(v, 2) for k, v in sorted(self_ms.items(), key=lambda kv: -kv[1])[:12]}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="write the two models and their token shards")
    m.add_argument("--out", required=True)
    m.add_argument("--seed", type=int, default=1234)
    m.add_argument("--tokens", type=int, default=1 << 18)
    t = sub.add_parser("train", help="fine-tune and time it")
    t.add_argument("--model", required=True, help="a Hugging Face model directory")
    t.add_argument("--data", required=True, help="a token shard (train_000000.bin)")
    t.add_argument("--mode", required=True, choices=["lora", "dora", "qlora", "full"])
    t.add_argument("--batch", type=int, default=4)
    t.add_argument("--seq", type=int, default=256)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--steps", type=int, default=3)
    t.add_argument("--warmup", type=int, default=1)
    t.add_argument("--lora-r", type=int, default=16)
    t.add_argument("--lora-alpha", type=float, default=32)
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    t.add_argument("--profile-steps", type=int, default=0,
                   help="after the timed steps, this many under torch.profiler (\"profile\" in the JSON line)")
    a = ap.parse_args()
    if a.cmd == "make":
        make(a)
    else:
        if a.steps < 1 or a.warmup < 0 or a.batch < 1 or a.seq < 1 or a.threads < 1 or a.profile_steps < 0:
            sys.exit("torch_finetune: --steps, --batch, --seq and --threads must be at least 1, --warmup and "
                     "--profile-steps at least 0")
        train(a)


if __name__ == "__main__":
    main()
