#!/usr/bin/env python3
"""Perplexity of a text under transformers, loading a GGUF file, scored exactly as
`quern perplexity` scores it (src/cli/cmd_perplexity.cpp, llama.cpp's
llama-perplexity method):

  * the whole text is tokenized once, with BOS when the tokenizer adds one;
  * it is cut into consecutive, non-overlapping chunks of CTX tokens (a partial
    last chunk is dropped); each chunk is evaluated on its own (empty cache),
    its first token replaced by BOS when the tokenizer adds BOS;
  * within a chunk, the predictions at positions CTX/2 .. CTX-2 (of tokens
    CTX/2+1 .. CTX-1) are scored: NLL = -log softmax(logits)[next token],
    accumulated in float64; PPL = exp(mean NLL).

The model is transformers' from_pretrained(dir, gguf_file=...), which
dequantizes every tensor to float (fp32 here), so the figure is that of the
same weights in float arithmetic. The token ids are by default those quern
produces (`quern tokenize`, passed with --ids FILE as one JSON array) so both
sides score the same sequence; without --ids, transformers' own tokenizer
(built from the GGUF) is used and the script reports whether the ids agree.

With --reference OUT.json it instead writes what tests/model/gemma3_270m_test.cpp
compares against: the first N ids of the text (BOS first), and per position
transformers' argmax and the log-probability of the next token.

Needs torch, transformers and gguf (pip install gguf). Usage:
  quern tokenize -m MODEL.gguf < tests/data/genesis-kjv.txt > /tmp/ids.txt
  python3 tools/hf_gguf_perplexity.py --gguf MODEL.gguf -f tests/data/genesis-kjv.txt -c 512 --ids /tmp/ids.txt
"""
import argparse
import json
import math
import os
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def read_ids(path):
    text = open(path).read().strip()
    if text.startswith("["):
        return [int(x) for x in json.loads(text)]
    return [int(x) for x in text.replace(",", " ").split()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True, help="the GGUF file")
    ap.add_argument("-f", "--file", required=True, help="text file to score")
    ap.add_argument("-c", "--ctx", type=int, default=512, help="tokens per chunk")
    ap.add_argument("--chunks", type=int, default=-1, help="score at most this many chunks (-1: all)")
    ap.add_argument("--ids", help="token ids of the text (quern tokenize output); default: transformers' tokenizer")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--reference", help="write a reference of the first --reference-tokens positions here and stop")
    ap.add_argument("--reference-tokens", type=int, default=64)
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    d, name = os.path.split(os.path.abspath(args.gguf))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    text = open(args.file, encoding="utf-8").read()
    hf_ids = tok(text, add_special_tokens=True)["input_ids"]
    bos = tok.bos_token_id
    add_bos = bool(hf_ids) and hf_ids[0] == bos
    if args.ids:
        ids = read_ids(args.ids)
        same = ids == hf_ids
        print(f"token ids: {len(ids)} from {args.ids}; transformers' tokenizer gives {len(hf_ids)}"
              f" ({'identical' if same else 'different'})")
        add_bos = bool(ids) and ids[0] == bos
    else:
        ids = hf_ids

    if args.reference:
        chunk = list(ids[:args.reference_tokens])
        if add_bos:
            chunk[0] = bos
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([chunk])).logits[0].double(), dim=-1)
        ref = {"gguf": name, "tokens": chunk, "argmax": lp.argmax(dim=-1).tolist(),
               "next_logprob": [lp[i, chunk[i + 1]].item() for i in range(len(chunk) - 1)]}
        with open(args.reference, "w") as f:
            json.dump(ref, f)
            f.write("\n")
        print(f"wrote {args.reference}: {len(chunk)} tokens")
        return

    n_ctx = args.ctx
    n_chunk = len(ids) // n_ctx
    if args.chunks > 0:
        n_chunk = min(n_chunk, args.chunks)
    first = n_ctx // 2
    nll, count = 0.0, 0
    t0 = time.time()
    for c in range(n_chunk):
        chunk = list(ids[c * n_ctx:(c + 1) * n_ctx])
        if add_bos:
            chunk[0] = bos
        with torch.no_grad():
            logits = model(torch.tensor([chunk])).logits[0].double()
        lp = torch.log_softmax(logits[first:n_ctx - 1], dim=-1)
        tgt = torch.tensor(chunk[first + 1:n_ctx])
        nll -= lp.gather(1, tgt[:, None]).sum().item()
        count += n_ctx - 1 - first
        print(f"[{c + 1}/{n_chunk}] PPL {math.exp(nll / count):.4f}  ({time.time() - t0:.0f} s)", flush=True)
    result = {"file": args.file, "n_tokens": len(ids), "n_ctx": n_ctx, "n_chunks": n_chunk, "n_scored": count,
              "ppl": math.exp(nll / count), "add_bos": add_bos}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
