#!/usr/bin/env python3
"""Golden reference fixtures for quern's model tests, from Hugging Face transformers.

Loads a GGUF file with transformers (which dequantizes every tensor to float),
runs it in float64 on the CPU on fixed prompts and writes:
  OUT/NAME.json      prompts, token ids (from the HF tokenizer built from the
                     GGUF vocab), greedy continuation, logits file layout
  OUT/NAME.logits    float16 logits, [position][vocab] for each prompt in order
Optionally computes perplexity of a text file the way llama.cpp's
llama-perplexity does (consecutive non-overlapping chunks of n_ctx tokens, each
from an empty cache, BOS replacing the first token when the model adds BOS,
only the second half of each chunk scored).

Needs: torch, transformers, gguf, numpy. Usage:
  python3 tools/make_golden.py MODEL.gguf --out tests/data/golden --name smollm2-135m-q4_1 \
      [--ppl tests/data/genesis-kjv.txt --ctx 512]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n<|im_start|>assistant\n",
    "In 1969, Neil Armstrong became the first person to walk on the Moon. The mission, Apollo 11, "
    "launched from Florida and",
]


def load(path, dtype):
    d, f = os.path.split(os.path.abspath(path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=dtype)
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = head.data_ptr() == emb.data_ptr() or torch.equal(head, emb)
    print(f"loaded {f}: tie_word_embeddings={model.config.tie_word_embeddings} head==emb={tied}",
          file=sys.stderr)
    model.eval()
    return tok, model


def golden(args):
    tok, model = load(args.model, torch.float32)
    model = model.double()
    entries, blobs, offset = [], [], 0
    with torch.no_grad():
        for p in PROMPTS:
            ids = tok(p, add_special_tokens=False).input_ids
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
            out = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
            cont = out[0, len(ids):].tolist()
            entries.append({"prompt": p, "tokens": ids, "logits_offset": offset,
                            "n_positions": len(ids), "greedy_continuation": cont,
                            "greedy_text": tok.decode(cont)})
            blobs.append(logits.astype(np.float16))
            offset += logits.size * 2
            print(f"prompt {len(ids)} tokens -> {tok.decode(cont)!r}", file=sys.stderr)
    n_vocab = blobs[0].shape[1]
    meta = {"model_file": os.path.basename(args.model), "n_vocab": int(n_vocab),
            "reference": "transformers (GGUF dequantized), float64 on CPU",
            "logits_file": args.name + ".logits", "logits_dtype": "float16", "prompts": entries}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, args.name + ".logits"), "wb") as fh:
        for b in blobs:
            fh.write(b.tobytes())
    with open(os.path.join(args.out, args.name + ".json"), "w") as fh:
        json.dump(meta, fh, indent=1)


def perplexity(args):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    tok, model = load(args.model, torch.float32)
    model = model.to(dev)
    text = open(args.ppl, encoding="utf-8").read()
    ids = tok(text, add_special_tokens=False).input_ids
    add_bos = bool(getattr(tok, "add_bos_token", False))
    n_ctx = args.ctx
    n_chunk = len(ids) // n_ctx
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    with torch.no_grad():
        for c in range(n_chunk):
            chunk = ids[c * n_ctx:(c + 1) * n_ctx]
            if add_bos:
                chunk = [tok.bos_token_id] + chunk[1:]
            logits = model(torch.tensor([chunk], device=dev)).logits[0].double()
            lp = torch.log_softmax(logits[first:n_ctx - 1], dim=-1)
            tgt = torch.tensor(chunk[first + 1:], device=dev)
            v = -lp.gather(1, tgt[:, None])[:, 0]
            nll += v.sum().item()
            nll2 += (v * v).sum().item()
            count += v.numel()
    mean = nll / count
    err = math.sqrt(max(nll2 / count - mean * mean, 0.0) / (count - 1))
    res = {"text": os.path.basename(args.ppl), "n_tokens": len(ids), "n_ctx": n_ctx,
           "n_chunks": n_chunk, "add_bos": add_bos, "ppl": math.exp(mean),
           "ppl_err": math.exp(mean) * err, "reference": f"transformers float32 on {dev}"}
    print(json.dumps(res))
    if args.out:
        with open(os.path.join(args.out, args.name + ".ppl.json"), "w") as fh:
            json.dump(res, fh, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--out", default="tests/data/golden")
    ap.add_argument("--name", default="smollm2-135m-q4_1")
    ap.add_argument("--ppl", help="text file for a perplexity reference")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--no-golden", action="store_true")
    args = ap.parse_args()
    if not args.no_golden:
        golden(args)
    if args.ppl:
        perplexity(args)


if __name__ == "__main__":
    main()
