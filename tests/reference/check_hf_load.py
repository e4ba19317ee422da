#!/usr/bin/env python3
"""check_hf_load.py: loads a shardlm-written Hugging Face directory with transformers and runs it.

  python3 tests/reference/check_hf_load.py DIR [--tokens 1,2,3] [--check-weights]
                                              [--expect logits.npy|logits.json] [--tol 1e-4]
                                              [--logits-out FILE.npy] [--full]

DIR holds config.json and model.safetensors (as written by sl_hf_save). The model is loaded with
AutoModelForCausalLM.from_pretrained (local files only, HF_HUB_OFFLINE=1), run in float32 on the token ids,
and one JSON object is printed: model_type, num_parameters, tokens, loss (next-token cross-entropy with
labels = tokens), logits (all of them with --full or when small, otherwise the first 8 per position), and:
  --check-weights  every tensor in DIR/*.safetensors must equal the loaded model's state_dict entry exactly
                   (and transformers must report no missing/unexpected keys): "weights_match".
  --expect FILE    logits from shardlm, (T, V) as .npy or JSON (a list of lists, or {"logits": ...,
                   "loss": ...}): "max_abs_diff" and "match" (within --tol, default 1e-4).
Exit status: 0 when every requested check passes, 1 otherwise, 2 on usage / loading errors.
"""
import argparse
import glob
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402


def parse_tokens(text, vocab):
    if text is None:
        return [i % vocab for i in (1, 5, 9, 2, 7, 3, 11, 4)]
    toks = [int(t) for t in text.replace(" ", "").split(",") if t]
    bad = [t for t in toks if t < 0 or t >= vocab]
    if not toks or bad:
        raise SystemExit(f"check_hf_load: token ids must be in [0, {vocab}); got {toks}")
    return toks


def load_expected(path):
    if path.endswith(".npy"):
        return np.load(path).astype(np.float64), None
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict):
        return np.asarray(data["logits"], dtype=np.float64), data.get("loss")
    return np.asarray(data, dtype=np.float64), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("dir")
    ap.add_argument("--tokens", help="comma-separated token ids (default: a fixed short sequence)")
    ap.add_argument("--check-weights", action="store_true")
    ap.add_argument("--expect")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--logits-out")
    ap.add_argument("--full", action="store_true", help="print every logit")
    args = ap.parse_args()

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(args.dir, local_files_only=True, output_loading_info=True,
                                                           dtype=torch.float32)
    except Exception as e:  # a clear one-line failure for the caller
        print(json.dumps({"dir": args.dir, "error": f"{type(e).__name__}: {e}"}))
        return 2
    model.eval()
    vocab = model.config.vocab_size
    tokens = parse_tokens(args.tokens, vocab)
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    logits = out.logits[0].double().numpy()  # (T, V)
    result = {
        "dir": args.dir,
        "model_type": model.config.model_type,
        "num_parameters": model.num_parameters(),
        "tokens": tokens,
        "loss": float(out.loss),
        "logits_shape": list(logits.shape),
    }
    if args.full or logits.size <= 4096:
        result["logits"] = logits.tolist()
    else:
        result["logits_head"] = logits[:, :8].tolist()
    if args.logits_out:
        np.save(args.logits_out, logits.astype(np.float32))
    ok = True

    if args.check_weights:
        sd = model.state_dict()
        problems = []
        missing = [k for k in info.get("missing_keys", []) if not k.endswith(("attn.bias", "masked_bias"))]
        if missing:
            problems.append(f"missing keys: {missing}")
        if info.get("unexpected_keys"):
            problems.append(f"unexpected keys: {info['unexpected_keys']}")
        if info.get("mismatched_keys"):
            problems.append(f"mismatched keys: {info['mismatched_keys']}")
        n = 0
        for path in sorted(glob.glob(os.path.join(args.dir, "model*.safetensors"))):
            for name, t in load_file(path).items():
                n += 1
                if name not in sd:
                    problems.append(f"{name}: not in the model's state_dict")
                elif tuple(sd[name].shape) != tuple(t.shape):
                    problems.append(f"{name}: shape {tuple(t.shape)} in file, {tuple(sd[name].shape)} in model")
                elif not torch.equal(sd[name].float(), t.float()):
                    d = (sd[name].float() - t.float()).abs().max().item()
                    problems.append(f"{name}: values differ (max abs diff {d:g})")
        if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" in sd:
            emb = model.get_input_embeddings().weight
            if not torch.equal(sd["lm_head.weight"], emb):
                problems.append("lm_head.weight is not tied to the input embedding")
        result["tensors_checked"] = n
        result["weights_match"] = not problems and n > 0
        if problems:
            result["weight_problems"] = problems[:20]
        ok = ok and result["weights_match"]

    if args.expect:
        want, want_loss = load_expected(args.expect)
        if want.shape != logits.shape:
            result["match"] = False
            result["expect_error"] = f"expected logits shape {list(want.shape)}, got {list(logits.shape)}"
        else:
            diff = float(np.max(np.abs(want - logits))) if want.size else 0.0
            result["max_abs_diff"] = diff
            result["match"] = diff <= args.tol
            if want_loss is not None:
                result["loss_diff"] = abs(float(want_loss) - result["loss"])
                result["match"] = result["match"] and result["loss_diff"] <= args.tol
        ok = ok and result["match"]

    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
