#!/usr/bin/env python3
"""Turn a GGUF vocabulary into the Hugging Face tokenizer files the model ships.

    python3 tools/tok_gguf_to_tokenizer_json.py VOCAB.gguf OUT_DIR [--pre NAME]

writes OUT_DIR/tokenizer.json and OUT_DIR/tokenizer_config.json, laid out as
the model families' own files are (so the Hugging Face `tokenizers` package
can serve as the reference for quern's tokenizer, tests/python/tok_diff.py):

- byte-level BPE ("gpt2" GGUF model): the GGUF vocab and merges, the
  pre-tokenizer pipeline of the family named by tokenizer.ggml.pre (or by
  --pre, to try a family's regexes with another vocabulary), a ByteLevel
  decoder; Llama 3 sets ignore_merges; GPT-NeoX and Qwen2 declare NFC.
- SentencePiece ("llama" GGUF model): a BPE model with byte_fallback whose
  merges are derived from the piece scores the way transformers'
  LlamaConverter does it (every split of a piece into two pieces, ordered by
  the piece's score, highest first); normalizer Prepend("▁") + Replace(" ",
  "▁") (no Prepend when add_space_prefix is false); the Replace / ByteFallback /
  Fuse / Strip decoder.
- CONTROL / UNKNOWN tokens become special added tokens, USER_DEFINED tokens
  non-special ones. Phi-3's chat tokens and </s> strip the white space after
  them (rstrip), as in its tokenizer_config.json.

Usable as a module: convert(path, pre=None) -> (tokenizer_json, tokenizer_config).
"""
import argparse
import json
import os
import sys

import gguf

# Pre-tokenizer regexes of each family, as in the families' tokenizer.json
# files (the same strings as src/tokenizer/patterns.h).
GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
          r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
         r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN35 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
          r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
GPT4O = (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
         r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
         r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
DS_LETTER_RANGES = [
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x376), (0x377, 0x377), (0x37B, 0x37D),
    (0x37F, 0x37F), (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x3A1), (0x3A3, 0x3F5),
    (0x3F7, 0x481), (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD),
    (0x1C90, 0x1CBA), (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15),
    (0x1F18, 0x1F1D), (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D), (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4),
    (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC),
    (0x2102, 0x2102), (0x2107, 0x2107), (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124),
    (0x2126, 0x2126), (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F),
    (0x2145, 0x2149), (0x214E, 0x214E), (0x2183, 0x2183), (0x2184, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF2), (0x2CF3, 0x2CF3), (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F),
    (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2),
    (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943)]
DS_PUNCT_RANGES = [(0x21, 0x2F), (0x3A, 0x7E), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E), (0x2018, 0x201F), (0x3000, 0x3002)]
DS_CJK = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+"
DS3_CJK = r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+"
DS3_MAIN = (r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
            r"""| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def _cls(ranges):
    return "".join(r"\x{%X}" % a if a == b else r"\x{%X}-\x{%X}" % (a, b) for a, b in ranges)


def _split(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


def _byte_level(use_regex):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _digits(individual):
    return {"type": "Digits", "individual_digits": individual}


# tokenizer.ggml.pre names -> (family, pre_tokenizer steps); as in
# src/tokenizer/pretokenizer.cpp.
FAMILIES = {
    "gpt2": ["default", "gpt2", "gpt-2", "phi-2", "gpt-neox", "mpt", "olmo", "jais", "roberta-bpe", "gigachat",
             "poro-chat", "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "jina-es", "jina-de"],
    "starcoder": ["starcoder", "refact", "smollm", "command-r", "codeshell", "exaone", "minerva-7b"],
    "llama3": ["llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"],
    "qwen2": ["qwen2", "stablelm2", "hunyuan", "megrez", "deepseek-r1-qwen"],
    "qwen35": ["qwen35"],
    "gpt-4o": ["gpt-4o", "llama4"],
    "deepseek-llm": ["deepseek-llm"],
    "deepseek-coder": ["deepseek-coder"],
    "deepseek-v3": ["deepseek-v3"],
    "falcon": ["falcon"],
}


def family_of(pre):
    for fam, names in FAMILIES.items():
        if pre in names:
            return fam
    return "gpt2"


def pre_tokenizer_steps(family):
    return {
        "gpt2": [_byte_level(True)],
        "starcoder": [_digits(True), _byte_level(True)],
        "llama3": [_split(LLAMA3), _byte_level(False)],
        "qwen2": [_split(QWEN2), _byte_level(False)],
        "qwen35": [_split(QWEN35), _byte_level(False)],
        "gpt-4o": [_split(GPT4O), _byte_level(False)],
        "deepseek-llm": [_split(r"[\r\n]"), _split(r"\s?[" + _cls(DS_LETTER_RANGES) + "]+"),
                         _split(r"\s?[" + _cls(DS_PUNCT_RANGES) + "]+"), _split(r"\s+$"), _split(DS_CJK),
                         _digits(True), _byte_level(False)],
        "deepseek-coder": [_split(r"[\r\n]"), _split(r"\s?\p{L}+"), _split(r"\s?\p{P}+"), _split(DS_CJK),
                           _digits(True), _byte_level(False)],
        "deepseek-v3": [_split(r"\p{N}{1,3}"), _split(DS3_CJK), _split(DS3_MAIN), _byte_level(False)],
        "falcon": [{"type": "Punctuation", "behavior": "Contiguous"}, _byte_level(True), _digits(False),
                   _split(r"[0-9][0-9][0-9]")],
    }[family]


def _field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        sub = f.types[1]
        if sub == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    if t == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]][0].item()


def _added(tokens, types, rstrip=()):
    out = []
    for i, t in enumerate(tokens):
        if types[i] in (2, 3, 4):
            out.append({"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": i in rstrip,
                        "normalized": False, "special": types[i] != 4})
    return out


def _spm_merges(tokens, scores):
    """Merges from piece scores, as transformers' SentencePieceExtractor makes them."""
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    merges = []
    for piece, i in vocab.items():
        local = [(piece[:k], piece[k:], scores[i]) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2], reverse=True)
    return vocab, [[a, b] for a, b, _ in merges]


class _Fields:
    """The metadata of one GGUF file, read once (values decoded on first use)."""

    def __init__(self, path):
        self.reader = gguf.GGUFReader(path)
        self.cache = {}

    def get(self, key, default=None):
        if key not in self.cache:
            self.cache[key] = _field(self.reader, key, default)
        return self.cache[key]


_READ = {}


def convert(path, pre=None):
    if path not in _READ:
        _READ.clear()  # keep one file's metadata at a time
        _READ[path] = _Fields(path)
    fields = _READ[path]
    model = fields.get("tokenizer.ggml.model")
    tokens = fields.get("tokenizer.ggml.tokens")
    types = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    arch = fields.get("general.architecture", "")
    n = len(tokens)

    def tok_id(key):
        v = fields.get(key)
        return v if v is not None and 0 <= v < n else None

    bos, eos, unk = tok_id("tokenizer.ggml.bos_token_id"), tok_id("tokenizer.ggml.eos_token_id"), \
        tok_id("tokenizer.ggml.unknown_token_id")
    spm = model == "llama"
    add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", spm))
    add_eos = bool(fields.get("tokenizer.ggml.add_eos_token", False))
    name = lambda i: tokens[i] if i is not None else None  # noqa: E731

    if model == "gpt2":
        family = family_of(pre or fields.get("tokenizer.ggml.pre", "default"))
        vocab = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)
        merges = fields.get("tokenizer.ggml.merges")
        normalizer = {"type": "NFC"} if family in ("qwen2", "qwen35") or (arch == "gptneox" and family == "gpt2") else None
        j = {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": _added(tokens, types),
            "normalizer": normalizer,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre_tokenizer_steps(family)},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                               "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None,
                      "unk_token": name(unk) if unk is not None and types[unk] == 2 else None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
                      "byte_fallback": False, "ignore_merges": family == "llama3", "vocab": vocab, "merges": merges},
        }
    elif model == "llama":
        scores = fields.get("tokenizer.ggml.scores") or [0.0] * n
        prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
        vocab, merges = _spm_merges(tokens, scores)
        rstrip = set()
        if arch in ("phi3", "phi-3"):
            rstrip = {i for i, t in enumerate(tokens)
                      if (types[i] == 3 and t.startswith("<|") and t.endswith("|>") and t != "<|endoftext|>")
                      or t == "</s>"}
        norm = [{"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]
        dec = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
               {"type": "Fuse"}]
        if prefix:
            norm.insert(0, {"type": "Prepend", "prepend": "\u2581"})
            dec.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
        j = {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": _added(tokens, types, rstrip),
            "normalizer": {"type": "Sequence", "normalizers": norm},
            "pre_tokenizer": None,
            "post_processor": None,
            "decoder": {"type": "Sequence", "decoders": dec},
            "model": {"type": "BPE", "dropout": None, "unk_token": name(unk), "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": vocab, "merges": merges},
        }
    else:
        raise SystemExit(f"{path}: tokenizer.ggml.model '{model}' is not supported")

    # BOS/EOS the way the model adds them.
    single = ([{"SpecialToken": {"id": name(bos), "type_id": 0}}] if add_bos and bos is not None else []) + \
        [{"Sequence": {"id": "A", "type_id": 0}}] + \
        ([{"SpecialToken": {"id": name(eos), "type_id": 0}}] if add_eos and eos is not None else [])
    if len(single) > 1:
        special = {name(i): {"id": name(i), "ids": [i], "tokens": [name(i)]}
                   for i in (bos if add_bos else None, eos if add_eos else None) if i is not None}
        tp = {"type": "TemplateProcessing", "single": single, "pair": single, "special_tokens": special}
        j["post_processor"] = {"type": "Sequence", "processors": [j["post_processor"], tp]} \
            if j["post_processor"] else tp
    config = {"add_bos_token": add_bos, "add_eos_token": add_eos, "bos_token": name(bos), "eos_token": name(eos),
              "unk_token": name(unk), "model_max_length": 1 << 30,
              "tokenizer_class": "LlamaTokenizerFast" if spm else "PreTrainedTokenizerFast"}
    return j, config


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("out_dir")
    ap.add_argument("--pre", help="use this tokenizer.ggml.pre family instead of the file's (byte-level BPE)")
    a = ap.parse_args()
    j, config = convert(a.gguf, a.pre)
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    with open(os.path.join(a.out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
    print(f"wrote {a.out_dir}/tokenizer.json and tokenizer_config.json ({len(j['model']['vocab'])} tokens, "
          f"{len(j['model']['merges'])} merges)", file=sys.stderr)


if __name__ == "__main__":
    main()
