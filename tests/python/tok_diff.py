#!/usr/bin/env python3
"""Differential test of quern's tokenizer against the Hugging Face `tokenizers` package.

    python3 tests/python/tok_diff.py --quern build/quern [--n 10000] [--seed N] [--family NAME ...]

For every vocabulary available (the GGUF vocabs in ../shared/testdata/vocab,
the default model SmolLM2-135M-Instruct when fetched, and the GPT-2 vocab run
with the Llama 3 / Qwen2 / Qwen3.5 / GPT-4o / DeepSeek LLM / DeepSeek V3 pre-tokenizers, whose
real vocabularies are not in the test data), it

1. turns the GGUF vocab into the tokenizer.json the model would ship
   (tools/tok_gguf_to_tokenizer_json.py) and loads it with `tokenizers`;
2. generates --n random strings (ASCII, white space runs, digits,
   punctuation, contractions, CJK, kana, Hangul, emoji with ZWJ/VS16,
   combining marks, many scripts, control characters, "▁", special-token
   text) from a fixed seed (printed; --seed to change it);
3. compares the ids of `quern tokenize --jsonl --no-bos` with Hugging Face
   `encode(add_special_tokens=False)`: from the GGUF without --parse-special
   (HF with encode_special_tokens=True: only non-special added tokens are
   matched), from the GGUF with --parse-special (HF default), and from the
   tokenizer.json folder with --parse-special (quern's tokenizer.json loader),
   and for the first 2,000 strings with BOS/EOS added as the model says
   (quern without --no-bos, HF add_special_tokens=True);
4. checks decode(encode(s)) == s through `quern detokenize --jsonl` for every
   string without added-token text (which may strip spaces, by design) and,
   for SentencePiece, without "▁" (SentencePiece cannot tell it from a space);
5. invalid UTF-8: Hugging Face only takes Python str, so each of --n/10
   random byte strings with invalid sequences is compared on its lossy decoding
   (U+FFFD for each invalid sequence, as Python decodes it) like any other
   string, and the raw bytes are sent to quern as {"hex": ...}: quern must not
   fail, must give ids in range, and must decode them back to the same bytes
   (byte-level BPE: less the bytes the vocabulary has no byte token for, which
   it drops as HF drops characters without a token; SentencePiece: exactly,
   via <0xNN> byte fallback).

Families whose tokenizer.json declares an NFC normalizer (GPT-NeoX, Qwen2)
get the same strings as the others (most already in NFC, many not: the
combining marks follow letters and each other), which quern normalizes
(src/tokenizer/unicode_nfc.h).

The pseudo-family "nfc" checks the NFC normalizer alone, byte for byte: a
tokenizer.json with the NFC normalizer and a byte-level BPE without merges
(ids = the bytes of the normalized text) gets every code point between "a"
and U+0334 (which reorders every mark of class > 1), and --n
random strings built from composites, decomposable and excluded characters,
singletons, combining marks of many classes, Hangul jamo and syllables and
the starters that compose with the one before them (NFC_QC=Maybe).

Exit status 0 when every comparison agrees; the first differences are printed.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from tokenizers import Tokenizer  # noqa: E402

import tok_gguf_to_tokenizer_json as conv  # noqa: E402

DEFAULT_SEED = 20260601
VOCABS = ["gpt-2", "llama-spm", "phi-3", "falcon", "deepseek-coder", "starcoder", "gpt-neox", "baichuan"]
SYNTHETIC = ["llama3", "qwen2", "qwen35", "gpt-4o", "deepseek-llm", "deepseek-v3"]  # pre-tokenizers run with the GPT-2 vocab

# ---------------------------------------------------------------- random text

RANGES = [
    (0x41, 0x5A), (0x61, 0x7A), (0xA0, 0xFF), (0x100, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x530, 0x58F),
    (0x5D0, 0x5EA), (0x600, 0x6FF), (0x900, 0x97F), (0x980, 0x9FF), (0xE00, 0xE5B), (0x10A0, 0x10FF),
    (0x1100, 0x11FF), (0x13A0, 0x13F5), (0x1780, 0x17DD), (0x1E00, 0x1FFF), (0x2000, 0x206F), (0x2070, 0x218F),
    (0x2190, 0x23FF), (0x2460, 0x24FF), (0x2500, 0x27BF), (0x2C00, 0x2C7F), (0x3000, 0x303F), (0x3040, 0x30FF),
    (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xA000, 0xA48F), (0xA640, 0xA69F), (0xAC00, 0xD7A3), (0xF900, 0xFAFF),
    (0xFB00, 0xFB4F), (0xFE30, 0xFE4F), (0xFF01, 0xFF65), (0x10400, 0x1044F), (0x1D400, 0x1D7FF),
    (0x1F300, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F900, 0x1F9FF), (0x20000, 0x2A6DF),
    (0x1144B, 0x1145D), (0x11DE0, 0x11DE9), (0x16FF0, 0x16FF6), (0x10D40, 0x10D4F), (0x1C89, 0x1C8A), (0x2E40, 0x2E5D),
]
WHITESPACE = [" ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r", " \n",
              "\n ", " \n ", "  \n\n  ", "\u00a0", "\u3000", "\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\u2009",
              "\u200b", "\u180e", "\u202f", " \t "]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "--", "->", "=>", "!=", "::", "//", "/*", "*/", "{}",
                                                      "()", "[]", "\u2014", "\u2013", "\u201c", "\u201d",
                                                      "\u2018", "\u2019", "\u00bf", "\u00a1", "\u3001", "\u3002"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D", "n't",
                "I'm", "it's", "'", "''", "\u2019s", "'\u017f"]
WORDS = ["the", "Hello", "world", "quern", "token", "GGUF", "naïve", "café", "straße", "Ünïcödé", "ΑΒΓ", "Привет",
         "東京", "こんにちは", "안녕하세요", "مرحبا", "שלום", "नमस्ते", "ไทย", "def", "return", "self", "x_1", "camelCase",
         "SNAKE_CASE", "http://example.com/a?b=c", "user@mail.org", "0x1F", "1e-5", "v1.2.3"]
COMBINING = [chr(c) for c in range(0x300, 0x370)] + ["\u0483", "\u0591", "\u064b", "\u093c", "\u0e31", "\u20dd",
                                                    "\u3099", "\ufe0f", "\u200d"]
EMOJI_SEQ = ["\U0001F468\u200d\U0001F469\u200d\U0001F467", "\u2764\ufe0f", "\U0001F44D\U0001F3FD",
             "\U0001F1EF\U0001F1F5", "\U0001F3F3\ufe0f\u200d\U0001F308", "\U0001F999", "\U0001FA75", "\U0001F6DC"]


def rand_char(rng):
    a, b = rng.choice(RANGES)
    c = rng.randint(a, b)
    return "" if 0xD800 <= c <= 0xDFFF else chr(c)


def rand_atom(rng, specials):
    k = rng.random()
    if k < 0.16:
        return rng.choice(WHITESPACE)
    if k < 0.30:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
                       for _ in range(rng.randint(1, 10)))
    if k < 0.38:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 9))) + \
            (rng.choice([",", ".", ""]) + str(rng.randint(0, 999)) if rng.random() < 0.3 else "")
    if k < 0.46:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 3)))
    if k < 0.51:
        return rng.choice(CONTRACTIONS)
    if k < 0.58:
        return rng.choice(WORDS)
    if k < 0.62:
        return rng.choice(COMBINING)
    if k < 0.65:
        return rng.choice(EMOJI_SEQ)
    if k < 0.67:
        return chr(rng.choice(list(range(0, 9)) + list(range(14, 32)) + [0x7F]))
    if k < 0.68:
        return "\u2581" * rng.randint(1, 3)
    if k < 0.70 and specials:
        return rng.choice(["", " ", "\n"]) + rng.choice(specials) + rng.choice(["", " ", "\n", "  "])
    if k < 0.71:
        return rng.choice([" ", "a", "7", "\n", "!", "\u4e00"]) * rng.randint(20, 80)
    return "".join(rand_char(rng) for _ in range(rng.randint(1, 6)))


def rand_text(rng, specials):
    r = rng.random()
    n = 0 if r < 0.005 else rng.randint(1, 4) if r < 0.3 else rng.randint(5, 40)
    return "".join(rand_atom(rng, specials) for _ in range(n))


def rand_bytes(rng, specials):
    """Text with invalid UTF-8 mixed in (stray continuation bytes, bad leads, truncated sequences)."""
    out = bytearray()
    for _ in range(rng.randint(1, 20)):
        k = rng.random()
        if k < 0.4:
            out += rand_atom(rng, specials).encode("utf-8")
        elif k < 0.55:
            out.append(rng.randint(0x80, 0xBF))
        elif k < 0.7:
            out.append(rng.choice([0xC0, 0xC1, 0xF5, 0xF8, 0xFE, 0xFF]))
        elif k < 0.85:
            out += rand_char(rng).encode("utf-8")[:-1] or b"\xe4"
        else:
            out += bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 4)))
    return bytes(out)


# ---------------------------------------------------------------- quern

def run_quern(args, lines, what):
    inp = "".join(lines).encode()
    t0 = time.time()
    p = subprocess.run(args, input=inp, capture_output=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{what}: quern failed ({p.returncode}): {p.stderr.decode(errors='replace')[:2000]}")
    # Split on "\n" only: JSON strings may hold U+2028 and other line breaks.
    out = [json.loads(x) for x in p.stdout.decode().split("\n") if x]
    if len(out) != len(lines):
        raise SystemExit(f"{what}: quern gave {len(out)} lines for {len(lines)} inputs")
    return out, time.time() - t0


def as_bytes(v):
    return bytes.fromhex(v["hex"]) if isinstance(v, dict) else v.encode("utf-8")


class Family:
    def __init__(self, name, gguf_path, pre=None):
        self.name, self.gguf, self.pre = name, gguf_path, pre


def check_family(fam, a, workdir):
    t0 = time.time()
    j, config = conv.convert(fam.gguf, fam.pre)
    d = os.path.join(workdir, fam.name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    hf = Tokenizer.from_str(json.dumps(j))
    spm = j["model"]["byte_fallback"]
    nfc = "NFC" in json.dumps(j["normalizer"])
    added = [t["content"] for t in j["added_tokens"]]
    specials = [t["content"] for t in j["added_tokens"] if not t["content"].startswith("[PAD")]

    rng = random.Random(f"{a.seed}/{fam.name}")
    texts = [rand_text(rng, specials) for _ in range(a.n)]
    raw = [rand_bytes(rng, specials) for _ in range(max(1, a.n // 10))]
    texts += [b.decode("utf-8", "replace") for b in raw]

    model = ["-m", fam.gguf] + (["--pre", fam.pre] if fam.pre else [])
    lines = [json.dumps(t) + "\n" for t in texts]
    exe = [a.quern, "tokenize", "--jsonl", "--no-bos"]
    got_plain, t_plain = run_quern(exe + model, lines, fam.name)
    got_special, _ = run_quern(exe + model + ["--parse-special"], lines, fam.name)
    got_json, _ = run_quern(exe + ["-m", d, "--parse-special"], lines, fam.name + " (tokenizer.json)")
    n_bos = min(len(texts), 2000)
    got_bos, _ = run_quern([a.quern, "tokenize", "--jsonl", "--parse-special"] + model, lines[:n_bos], fam.name)

    hf.encode_special_tokens = True
    exp_plain = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    hf.encode_special_tokens = False
    exp_special = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    exp_bos = [e.ids for e in hf.encode_batch(texts[:n_bos], add_special_tokens=True)]

    report = {}
    shown = [0]

    def compare(label, got, exp):
        bad = 0
        for t, g, e in zip(texts, got, exp):
            if g != e:
                bad += 1
                if shown[0] < a.show:
                    shown[0] += 1
                    k = next((i for i, (x, y) in enumerate(zip(g, e)) if x != y), min(len(g), len(e)))
                    lo = max(0, k - 3)
                    print(f"  {fam.name} [{label}] DIFF at id {k} in {t!r}\n"
                          f"    hf:    ...{e[lo:k + 8]} = {hf.decode(e[lo:k + 8])!r}\n"
                          f"    quern: ...{g[lo:k + 8]} = {hf.decode(g[lo:k + 8])!r}")
        report[label] = bad

    compare("gguf", got_plain, exp_plain)
    compare("gguf+special", got_special, exp_special)
    compare("tokenizer.json+special", got_json, exp_special)
    compare("gguf+bos", got_bos, exp_bos)

    # Round trips of valid strings.
    rt_idx = [i for i, t in enumerate(texts)
              if not any(s in t for s in added) and not (spm and "\u2581" in t)]
    dec, _ = run_quern([a.quern, "detokenize", "--jsonl", "-m", fam.gguf],
                       [json.dumps(got_plain[i]) + "\n" for i in rt_idx], fam.name + " detokenize")
    byte_chars = conv_byte_chars()
    vocab = j["model"]["vocab"]
    # Bytes with a byte-level token (an added token with the same text stands
    # for that text, not for the byte: DeepSeek-Coder re-adds the characters
    # of bytes 0xC0, 0xC1, 0xF5-0xFF, which valid UTF-8 never contains).
    keep = [b for b in range(256) if spm or (byte_chars[b] in vocab and byte_chars[b] not in added)]
    # With NFC, decoding gives the normalized text; quern keeps invalid bytes
    # and normalizes the valid text between them.
    from tokenizers import normalizers
    norm = normalizers.NFC().normalize_str if nfc else (lambda t: t)

    def norm_bytes(b):
        t = b.decode("utf-8", "surrogateescape")
        parts, run = [], ""
        for ch in t:
            if 0xDC80 <= ord(ch) <= 0xDCFF:
                parts.append(norm(run).encode("utf-8") + bytes([ord(ch) - 0xDC00]))
                run = ""
            else:
                run += ch
        return b"".join(parts) + norm(run).encode("utf-8")

    n_changed = sum(norm(t) != t for t in texts) if nfc else 0
    rt_bad = 0
    for i, v in zip(rt_idx, dec):
        if as_bytes(v) != bytes(x for x in norm(texts[i]).encode("utf-8") if x in keep):
            rt_bad += 1
            if shown[0] < a.show:
                shown[0] += 1
                print(f"  {fam.name} [round trip] {texts[i][:120]!r} -> {as_bytes(v)[:120]!r}")
    report["round-trip"] = rt_bad

    # Raw invalid bytes: no failure, ids in range, bytes back.
    n_vocab = max(max(vocab.values()), max((t["id"] for t in j["added_tokens"]), default=0)) + 1
    raw_rt = [b for b in raw if not any(s.encode() in b for s in added) and not (spm and "\u2581".encode() in b)]
    got_raw, _ = run_quern(exe + model, [json.dumps({"hex": b.hex()}) + "\n" for b in raw_rt], fam.name + " bytes")
    dec_raw, _ = run_quern([a.quern, "detokenize", "--jsonl", "-m", fam.gguf],
                           [json.dumps(ids) + "\n" for ids in got_raw], fam.name + " bytes detokenize")
    raw_bad = 0
    for b, ids, v in zip(raw_rt, got_raw, dec_raw):
        want = bytes(x for x in norm_bytes(b) if x in keep)
        if not all(0 <= i < n_vocab for i in ids) or as_bytes(v) != want:
            raw_bad += 1
            if shown[0] < a.show:
                shown[0] += 1
                print(f"  {fam.name} [bytes] {b[:80]!r} -> {as_bytes(v)[:80]!r}")
    report["invalid-bytes"] = raw_bad

    n = len(texts)
    status = "ok" if not any(report.values()) else "DIFFERENCES"
    print(f"{fam.name:16s} {n} strings: gguf {report['gguf']} diffs, gguf+parse-special {report['gguf+special']}, "
          f"tokenizer.json {report['tokenizer.json+special']}, with BOS/EOS {report['gguf+bos']}/{n_bos}; round trip {report['round-trip']}/{len(rt_idx)} "
          f"failed; raw bytes {report['invalid-bytes']}/{len(raw_rt)} failed{f'; NFC, {n_changed} inputs not in NFC' if nfc else ''} "
          f"[{time.time() - t0:.1f}s, quern {t_plain:.2f}s] {status}", flush=True)
    return sum(report.values())


# ---------------------------------------------------------------- NFC alone

NFC_MAYBE_STARTERS = [0x09BE, 0x09D7, 0x0B3E, 0x0B56, 0x0B57, 0x0BBE, 0x0BD7, 0x0C56, 0x0CC2, 0x0CD5, 0x0CD6, 0x0D3E,
                      0x0D57, 0x0DCF, 0x0DDF, 0x102E, 0x1161, 0x1175, 0x11A8, 0x11C2, 0x1B35, 0x110BA, 0x11127,
                      0x1133E, 0x11357, 0x114B0, 0x114BA, 0x114BD, 0x115AF]
NFC_BASES = [0x09C7, 0x0B47, 0x0BC6, 0x0BC7, 0x0BD2, 0x0C46, 0x0CBF, 0x0CC6, 0x0CCA, 0x0D46, 0x0D47, 0x0DD9, 0x0DDC,
             0x1025, 0x1B05, 0x11099, 0x11131, 0x11347, 0x114B9, 0x115B8]
NFC_SPECIAL = [0x0340, 0x0341, 0x0343, 0x0344, 0x0374, 0x037E, 0x0387, 0x0958, 0x095F, 0x0F43, 0x0F73, 0x0F75, 0x0F81,
               0x1F71, 0x1FBB, 0x1FEE, 0x2000, 0x2001, 0x2126, 0x212A, 0x212B, 0x2329, 0x232A, 0x2ADC, 0xFB1D,
               0xFB1F, 0xFB2A, 0xFB4E, 0x1D15E, 0x1D164, 0x1D1BB, 0x1D1C0, 0x2F800, 0x2FA1D, 0xF900, 0xFA10, 0xFA6D,
               0x1E9B, 0x0345, 0x1F80, 0x1FB3, 0x00C5, 0x01FA, 0x1E08, 0x1EA0, 0x1EAC, 0x0226, 0x01E0, 0x0390, 0x03B0,
               0x0DDA, 0x0DDD, 0x0DDE, 0x0B4C, 0x0B48, 0x0B4B, 0x0BCA, 0x0BCB, 0x0BCC, 0x0CCB, 0x1026, 0x1B06]


def nfc_pools():
    marks = [c for c in range(0x300, 0x20000) if unicodedata.combining(chr(c))]
    decomposable = [c for c in range(0xA0, 0x30000) if unicodedata.decomposition(chr(c))[:1] not in ("", "<")]
    return marks, decomposable


def rand_nfc_text(rng, pools):
    marks, decomposable = pools
    out = []
    for _ in range(rng.randint(1, 24)):
        k = rng.random()
        if k < 0.15:
            out.append(rng.choice("aeiouAEIOUnNcCsSzZwyY ."))
        elif k < 0.35:
            out.append(chr(rng.choice(marks)))
        elif k < 0.45:
            out.append(chr(rng.choice([0x300, 0x301, 0x302, 0x303, 0x308, 0x30A, 0x323, 0x327, 0x328, 0x331, 0x342,
                                       0x345, 0x313, 0x314, 0x31B, 0x334, 0x338, 0x5B4, 0x5BC, 0x3099, 0x309A])))
        elif k < 0.58:
            out.append(chr(rng.choice(decomposable)))
        elif k < 0.66:
            out.append(chr(rng.choice(NFC_SPECIAL)))
        elif k < 0.74:
            out.append(chr(rng.choice(NFC_MAYBE_STARTERS + NFC_BASES)))
        elif k < 0.86:
            r = rng.random()
            out.append(chr(rng.randint(0x1100, 0x1112)) if r < 0.3 else chr(rng.randint(0x1161, 0x1175)) if r < 0.55
                       else chr(rng.randint(0x11A7, 0x11C3)) if r < 0.8 else chr(rng.randint(0xAC00, 0xD7A3)))
        elif k < 0.9:
            out.append(chr(rng.choice([0x3046, 0x304B, 0x30A6, 0x30AB, 0x30CF, 0x309D, 0x30FD, 0x1B3A, 0x1B3C])))
        else:
            c = rng.randint(0, 0x10FFFF)
            out.append("" if 0xD800 <= c <= 0xDFFF else chr(c))
    return "".join(out)


def check_nfc(a, workdir):
    """The NFC normalizer alone: ids of a merge-free byte-level BPE are the normalized bytes."""
    t0 = time.time()
    bc = conv_byte_chars()
    j = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": {"type": "NFC"},
         "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
         "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                             "use_regex": False},
         "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                   "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                   "vocab": {bc[b]: b for b in range(256)}, "merges": []}}
    d = os.path.join(workdir, "nfc")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    from tokenizers import normalizers
    hf = normalizers.NFC()
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    texts = ["".join("a" + chr(c) + "\u0334" for c in cps[k:k + 128]) for k in range(0, len(cps), 128)]
    n_cover = len(texts)
    rng = random.Random(f"{a.seed}/nfc")
    pools = nfc_pools()
    texts += [rand_nfc_text(rng, pools) for _ in range(a.n)]
    got, t_q = run_quern([a.quern, "tokenize", "--jsonl", "--no-bos", "-m", d], [json.dumps(t) + "\n" for t in texts],
                         "nfc")
    bad = changed = 0
    for t, g in zip(texts, got):
        e = hf.normalize_str(t)
        changed += e != t
        if bytes(g) != e.encode("utf-8"):
            bad += 1
            if bad <= a.show:
                print(f"  nfc DIFF {[hex(ord(x)) for x in t][:40]}\n    hf:    {[hex(ord(x)) for x in e][:40]}\n"
                      f"    quern: {[hex(ord(x)) for x in bytes(g).decode('utf-8', 'replace')][:40]}")
    print(f"{'nfc':16s} {len(texts)} strings ({n_cover} covering every code point, {len(texts) - n_cover} random; "
          f"{changed} changed by NFC): {bad} differ from tokenizers' NFC [{time.time() - t0:.1f}s, quern {t_q:.2f}s] "
          f"{'ok' if not bad else 'DIFFERENCES'}", flush=True)
    return bad


def conv_byte_chars():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    m, n = {}, 0
    for b in range(256):
        if b in bs:
            m[b] = chr(b)
        else:
            m[b] = chr(256 + n)
            n += 1
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quern", required=True, help="path of the quern binary")
    ap.add_argument("--vocab-dir", default=os.path.join(ROOT, "..", "shared", "testdata", "vocab"))
    ap.add_argument("--model", default=os.path.join(os.environ.get("QUERN_HOME", os.path.expanduser("~/.cache/quern")),
                                                    "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--n", type=int, default=10000, help="random strings per family")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--family", action="append", help="only these families (repeatable)")
    ap.add_argument("--show", type=int, default=10, help="differences to print")
    a = ap.parse_args()

    fams = []
    for v in VOCABS:
        p = os.path.join(a.vocab_dir, f"ggml-vocab-{v}.gguf")
        if os.path.exists(p):
            fams.append(Family(v, p))
            if v == "gpt-2":  # right after it: the converter reuses what it read
                fams += [Family(f"gpt2-vocab+{pre}", p, pre) for pre in SYNTHETIC]
        else:
            print(f"{v}: vocab not found at {p}, skipped")
    if os.path.exists(a.model):
        fams.append(Family("smollm2", a.model))
    else:
        print(f"smollm2: default model not found at {a.model}, skipped (bash tools/fetch-model.sh)")
    do_nfc = not a.family or "nfc" in a.family
    if a.family:
        fams = [f for f in fams if f.name in a.family]
    print(f"tok_diff: seed {a.seed}, {a.n} strings + {max(1, a.n // 10)} with invalid UTF-8 per family, "
          f"{len(fams)} families{' and NFC alone' if do_nfc else ''}")
    total = 0
    with tempfile.TemporaryDirectory(prefix="quern-tok-diff-") as workdir:
        if do_nfc:
            total += check_nfc(a, workdir)
        for fam in fams:
            total += check_family(fam, a, workdir)
    print(f"tok_diff: {'all agree' if total == 0 else f'{total} differences'}")
    sys.exit(0 if total == 0 else 1)


if __name__ == "__main__":
    main()
