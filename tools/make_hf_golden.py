#!/usr/bin/env python3
"""Golden fixtures for quern's Hugging Face checkpoint tests (tests/model/hf_golden_test.cpp).

Builds tiny randomly initialised transformers models (seeded), one per
architecture, saves each with save_pretrained (safetensors, config.json,
generation_config.json) in fp32 and in bf16, and stores the logits that
transformers computes on fixed token ids at every position:

  OUT/NAME/fp32/...          the fp32 checkpoint (one model.safetensors)
  OUT/NAME/bf16/...          the bf16 checkpoint (sharded with an index for qwen2)
  OUT/NAME/golden.json       token ids, vocabulary size, architecture facts
  OUT/NAME/fp32.logits       float32 logits, [position][vocab], little-endian
  OUT/NAME/bf16.logits       the same for the bf16 checkpoint

Each reference runs in float64 on the weights exactly as saved (the bf16
checkpoint's weights are widened, not re-rounded), so a checkpoint's logits
measure how closely quern computes that checkpoint. Parameters are drawn so
the logits have a spread (N(0, 1/fan_in) matrices, norms around 1, non-zero
biases) rather than transformers' near-zero initialisation, which would make
the argmax of every position a coin toss.

Needs torch and transformers (not needed to run the tests). Usage:
  python3 tools/make_hf_golden.py --out tests/data/hf
"""
import argparse
import json
import math
import os
import shutil

import numpy as np
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

VOCAB = 256
N_TOKENS = 24

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)

MODELS = {
    # Untied output projection; Llama 3.1's RoPE scaling with a short original
    # context so that the 8 RoPE pairs fall in all three of its bands.
    "llama": (LlamaConfig, LlamaForCausalLM, dict(
        tie_word_embeddings=False, rope_theta=10000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    # Q/K/V biases; tied embeddings; a different RoPE base.
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=True, rope_theta=1000000.0)),
    # Per-head q/k RMSNorm; head_dim (8) smaller than hidden_size / heads (16).
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(tie_word_embeddings=True, rope_theta=1000000.0, head_dim=8)),
}


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:  # [out, in] matrices
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
        if model.config.tie_word_embeddings:
            model.tie_weights()


def reference_logits(path, cls, ids):
    model = cls.from_pretrained(path, dtype=torch.float32).double().eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/hf")
    args = ap.parse_args()
    ids = [int(x) for x in np.random.default_rng(8).integers(0, VOCAB, N_TOKENS)]
    for i, (name, (cfg_cls, cls, extra)) in enumerate(MODELS.items()):
        root = os.path.join(args.out, name)
        shutil.rmtree(root, ignore_errors=True)
        torch.manual_seed(100 + i)
        model = cls(cfg_cls(**COMMON, **extra)).eval()
        randomise(model, 100 + i)
        meta = {"architecture": name, "n_vocab": VOCAB, "tokens": ids, "checkpoints": {}}
        for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            d = os.path.join(root, dtype_name)
            shard = "40KB" if (name == "qwen2" and dtype_name == "bf16") else "100MB"
            model.to(dtype).save_pretrained(d, safe_serialization=True, max_shard_size=shard)
            logits = reference_logits(d, cls, ids)
            assert logits.shape == (N_TOKENS, VOCAB)
            logits.astype("<f4").tofile(os.path.join(root, dtype_name + ".logits"))
            top2 = np.sort(logits, axis=1)[:, -2:]
            meta["checkpoints"][dtype_name] = {
                "folder": dtype_name, "logits_file": dtype_name + ".logits",
                "min_top2_gap": float((top2[:, 1] - top2[:, 0]).min()),
                "files": sorted(os.listdir(d))}
            model.float()
        with open(os.path.join(root, "golden.json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        print(name, {k: v["min_top2_gap"] for k, v in meta["checkpoints"].items()})


if __name__ == "__main__":
    main()
