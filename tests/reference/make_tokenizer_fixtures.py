#!/usr/bin/env python3
"""make_tokenizer_fixtures.py: produces the Hugging Face reference ids that tests/unit/test_tokenizer.c
compares shardlm's GPT-2 tokenizer against. Offline: loads GPT2TokenizerFast from the local
vocab/merges files (../shared/data/gpt2/encoder.json + vocab.bpe, byte-identical to HF's
vocab.json + merges.txt).

Writes, under tests/fixtures/tokenizer/:
  gpt2_sotu.txt    one line per corpus file:  NAME N_IDS FNV1A64_HEX ID0,ID1,...(first 64 ids)
                   the hash is 64-bit FNV-1a over the ids written as little-endian uint32.
  gpt2_tricky.txt  one line per hand-picked string:  UTF8_HEX ID0,ID1,...   (all ids)

Run from the repository root:  HF_HUB_OFFLINE=1 python3 tests/reference/make_tokenizer_fixtures.py
"""
import os
import shutil
import struct
import tempfile
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from transformers import GPT2TokenizerFast  # noqa: E402

DATA = os.environ.get("SHARDLM_DATA", "../shared/data")
OUT = "tests/fixtures/tokenizer"

TRICKY = [
    "Hello world",
    "I'm sure they'll say it's what we've done, isn't it? You'd re-do it; we're fine.",
    "I'M SURE THEY'LL SAY IT'S DONE",
    "  leading spaces and trailing spaces   ",
    "multiple    spaces\tand\ttabs\t\t end",
    "line one\nline two\n\n\nline five\r\nwindows\n",
    "trailing newline spaces  \n  \n",
    "Ünïcödé lëttérs: naïve café résumé Straße",
    "Русский текст и цифры ١٢٣ ٤٥٦ and ०१२३",
    "中文字符测试，日本語のテキスト、한국어",
    "emoji 😀😃🎉 👍🏽 family 👨‍👩‍👧‍👦 flags 🇺🇸",
    "numbers 1234567890 3.14159 1,000,000 ²³ ½ Ⅻ",
    "punctuation!!! ??? ... --- ''' \"\"\" (([[{{}}]])) @#$%^&*",
    "<|endoftext|>",
    "before<|endoftext|>after",
    "text <|endoftext|> more text <|endoftext|><|endoftext|> end",
    "<|endoftext|",
    "'s 't 're 've 'm 'll 'd 'S 'T",
    "don't can't won't shouldn't y'all o'clock",
    " ",
    "\n",
    "   \n\t  \u00a0nbsp\u2003emspace\u3000ideographic",
    "a\u0301 combining e\u0301 mark \u200b zero width",
    "mixed123abc 456def ghi789",
    "$100 €200 £300 ¥400",
]


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for b in b"".join(struct.pack("<I", i) for i in ids):
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    gpt2 = os.path.join(DATA, "gpt2")
    # from_pretrained on a local folder holding HF's file names works across transformers 4.x and 5.x
    # (5.x changed the constructor's arguments to vocab=/merges=).
    tmp = tempfile.mkdtemp(prefix="shardlm_gpt2_")
    shutil.copyfile(os.path.join(gpt2, "encoder.json"), os.path.join(tmp, "vocab.json"))
    shutil.copyfile(os.path.join(gpt2, "vocab.bpe"), os.path.join(tmp, "merges.txt"))
    tok = GPT2TokenizerFast.from_pretrained(tmp, local_files_only=True)
    shutil.rmtree(tmp)
    assert tok.convert_tokens_to_ids("<|endoftext|>") == 50256
    os.makedirs(OUT, exist_ok=True)
    sotu = os.path.join(DATA, "sotu")
    lines = []
    for name in sorted(os.listdir(sotu)):
        if not name.endswith(".txt"):
            continue
        with open(os.path.join(sotu, name), "rb") as f:
            text = f.read().decode("utf-8")
        ids = tok.encode(text)
        lines.append("%s %d %016x %s\n" % (name, len(ids), fnv1a64(ids), ",".join(map(str, ids[:64]))))
    with open(os.path.join(OUT, "gpt2_sotu.txt"), "w") as f:
        f.writelines(lines)
    with open(os.path.join(OUT, "gpt2_tricky.txt"), "w") as f:
        for s in TRICKY:
            ids = tok.encode(s)
            f.write("%s %s\n" % (s.encode("utf-8").hex(), ",".join(map(str, ids))))
    print("wrote %d corpus lines and %d tricky strings to %s" % (len(lines), len(TRICKY), OUT), file=sys.stderr)


if __name__ == "__main__":
    main()
