#!/usr/bin/env python3
"""GGUF fixtures written by llama.cpp's own converter (tests/model/llamacpp_gguf_test.cpp).

quern's GGUF loaders are written against llama.cpp's tensor names, keys and
layouts; a file quern writes itself (quern synth) cannot show that they
match what users download. This script runs llama.cpp's convert_hf_to_gguf.py
on the tiny Hugging Face fixtures that tools/make_hf_golden.py made, so the
test can load the result and compare its logits with the same golden logits
transformers computed for the checkpoint (the weights are identical; only
their layout and names differ).

  OUT/NAME/llamacpp-VARIANT.gguf   converted with --outtype f32 (VARIANT: fp32, or
                                   gpt-oss's mxfp4, whose experts stay MXFP4)

The fixtures have no tokenizer (their vocabulary is 256 ids), so the script
gives the converter a byte-level BPE tokenizer of 256 tokens (255 bytes and
an end-of-text token) and no merges,
and names its pre-tokenizer "qwen2" (the converter otherwise refuses a
tokenizer whose hash it does not know). Nothing in the test reads the
vocabulary beyond its size.

llama.cpp comes from the llama-cpp-python sdist on PyPI, which vendors it:

  pip download --no-deps --no-binary :all: llama-cpp-python
  tar xzf llama_cpp_python-*.tar.gz
  python tools/make_llamacpp_gguf.py --llama-cpp llama_cpp_python-*/vendor/llama.cpp

Needs torch, transformers, tokenizers, numpy, sentencepiece (imported by the
converter). The committed fixtures come from llama-cpp-python 0.3.36.
"""
import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

# Per fixture, the checkpoints to convert (gpt-oss's MXFP4 one keeps its
# experts in MXFP4: the converter repacks them into GGML's blocks).
FIXTURES = {"qwen3_5": ["fp32"], "qwen3_5_moe": ["fp32"], "gpt_oss": ["fp32", "mxfp4"]}


def byte_tokenizer(folder: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # GPT-2's printable stand-ins for the 256 byte values.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    stand_in, extra = {}, 0
    for b in range(256):
        if b in printable:
            stand_in[b] = chr(b)
        else:
            stand_in[b] = chr(256 + extra)
            extra += 1
    # Byte 255's id holds the end-of-text token that transformers' Qwen3.5
    # tokenizer class adds when it finds none, which would make 257 ids.
    vocab = {stand_in[b]: b for b in range(255)}
    vocab["<|endoftext|>"] = 255
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(folder)


def convert(llama_cpp: Path, src: Path, out: Path):
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    sys.path.insert(0, str(llama_cpp))
    import convert_hf_to_gguf  # noqa: E402
    from conversion import base  # noqa: E402

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / src.parent.name
        shutil.copytree(src, folder)
        byte_tokenizer(folder)
        cfg = json.loads((folder / "config.json").read_text())
        args = [str(folder), "--outtype", "f32", "--outfile", str(out)]
        if "mtp_num_hidden_layers" in cfg and not cfg["mtp_num_hidden_layers"]:  # Qwen3.5: the flag exists
            args.append("--no-mtp")
        argv, sys.argv = sys.argv, ["convert_hf_to_gguf.py", *args]
        try:
            convert_hf_to_gguf.main()
        finally:
            sys.argv = argv


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, type=Path, help="llama.cpp source folder (vendor/llama.cpp)")
    ap.add_argument("--out", default="tests/data/hf", type=Path)
    ap.add_argument("--only", default="", help="comma-separated fixtures (default: all)")
    a = ap.parse_args()
    only = set(filter(None, a.only.split(",")))
    for name, variants in FIXTURES.items():
        if only and name not in only:
            continue
        for variant in variants:
            convert(a.llama_cpp.resolve(), a.out / name / variant, a.out / name / f"llamacpp-{variant}.gguf")


if __name__ == "__main__":
    main()
