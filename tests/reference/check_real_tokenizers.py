#!/usr/bin/env python3
"""check_real_tokenizers.py: `shardlm prepare` with real tokenizers against Hugging Face's `tokenizers`.

Not part of `make test` (it needs PyPI): fetches two wheels that carry real tokenizer files,
  - anthropic 0.30.0 (MIT): anthropic/tokenizer.json, a 65,000-token byte-level BPE with an NFKC
    normalizer and 64,739 merges;
  - mistral-common 1.3.0 (Apache-2.0): Mistral 7B's SentencePiece models (v1: 32,000 tokens, v3: 32,768),
    converted to tokenizer.json with transformers' SentencePieceExtractor (its merges, in the order
    transformers gives them) in both LLaMA layouts: Metaspace (prepend_scheme "first") and the legacy
    Prepend + Replace normalizer;
then runs `build/shardlm prepare --tokenizer DIR` over every SOTU file and checks the shard against what
`tokenizers` gives for the same documents: [eos] + tokenizer(text) ids, document after document.

Needs: a built build/shardlm, and tokenizers + transformers + sentencepiece + protobuf in the Python
running it. From the repository root:
    HF_HUB_OFFLINE=1 /path/to/venv/bin/python tests/reference/check_real_tokenizers.py [--wheels DIR]
Prints one line per tokenizer and exits non-zero if any differs.
"""
import argparse
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile
import zipfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tokenizers import Tokenizer  # noqa: E402

DATA = os.environ.get("SHARDLM_DATA", "../shared/data")
WHEELS = {"anthropic": "anthropic==0.30.0", "mistral_common": "mistral-common==1.3.0"}
SP = "\u2581"


def fetch(wheels):
    for name, spec in WHEELS.items():
        if not glob.glob(os.path.join(wheels, name + "-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", wheels, spec], check=True)
    return {name: glob.glob(os.path.join(wheels, name + "-*.whl"))[0] for name in WHEELS}


def write_dir(root, name, tokenizer, bos, eos):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": bos, "eos_token": eos}, f)
    return d


def sentencepiece_json(model_path, legacy):
    from transformers.convert_slow_tokenizer import SentencePieceExtractor
    r = SentencePieceExtractor(model_path).extract(None)
    specials = ["<unk>", "<s>", "</s>"]
    llama_decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, c in enumerate(specials)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SP}, {"type": "Replace", "pattern": {"String": " "}, "content": SP}]}
        if legacy else None,
        "pre_tokenizer": None if legacy else {"type": "Metaspace", "replacement": SP, "prepend_scheme": "first",
                                              "split": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": llama_decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": r["vocab"], "merges": [list(m) for m in r["merges"]]},
    }


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, _, count = struct.unpack("<3i", data[:12])
    width = 2 if count * 2 + 1024 == len(data) else 4
    return list(struct.unpack("<%d%s" % (count, "H" if width == 2 else "I"), data[1024:1024 + count * width]))


def check(binary, tok_dir, files):
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    eos = tok.token_to_id(json.load(open(os.path.join(tok_dir, "tokenizer_config.json")))["eos_token"])
    want = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            want += [eos] + tok.encode(f.read()).ids
    out = tempfile.mkdtemp(prefix="shardlm_realtok_")
    subprocess.run([binary, "prepare", "--input", os.path.join(DATA, "sotu"), "--output", out, "--tokenizer", tok_dir,
                    "--val-fraction", "0"], check=True, stdout=subprocess.DEVNULL)
    got = read_shard(os.path.join(out, "train_000000.bin"))
    subprocess.run(["rm", "-rf", out], check=True)
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if first is None and len(got) == len(want):
        return True, "%d ids, identical" % len(want)
    at = first if first is not None else min(len(got), len(want))
    return False, "%d ids against %d; first difference at %d: %s vs %s" % (len(got), len(want), at, got[at:at + 5],
                                                                              want[at:at + 5])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheels", default=None, help="a folder holding (or to receive) the two wheels")
    ap.add_argument("--shardlm", default="build/shardlm")
    a = ap.parse_args()
    wheels = a.wheels or tempfile.mkdtemp(prefix="shardlm_wheels_")
    w = fetch(wheels)
    root = tempfile.mkdtemp(prefix="shardlm_tokdirs_")
    dirs = []
    with zipfile.ZipFile(w["anthropic"]) as z:
        dirs.append(write_dir(root, "anthropic-0.30.0", json.loads(z.read("anthropic/tokenizer.json")), None, "<EOT>"))
    with zipfile.ZipFile(w["mistral_common"]) as z:
        for version, member in (("v1", "tokenizer.model.v1"), ("v3", "mistral_instruct_tokenizer_240323.model.v3")):
            model = os.path.join(root, "mistral-%s.model" % version)
            with open(model, "wb") as f:
                f.write(z.read("mistral_common/data/" + member))
            for legacy in (False, True):
                dirs.append(write_dir(root, "mistral-%s%s" % (version, "-legacy" if legacy else ""),
                                      sentencepiece_json(model, legacy), "<s>", "</s>"))
    files = sorted(glob.glob(os.path.join(DATA, "sotu", "*.txt")))
    bad = 0
    for d in dirs:
        ok, msg = check(a.shardlm, d, files)
        bad += not ok
        print("%-22s %s: %s" % (os.path.basename(d), "ok" if ok else "DIFFERS", msg))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
