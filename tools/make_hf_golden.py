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

The Gemma models are narrower (hidden size 32) so that four layers stay
small, see more tokens (32) than their sliding window (6 or 5 positions) so
the window matters, draw norm weights around 0 (Gemma multiplies by 1 + w),
and switch on what their configs can ask for: soft-capped attention scores
and logits (gemma2), per-layer-type RoPE with a linear scaling of the global
layers and a query_pre_attn_scalar unlike head_dim (both).

Mixtral (4 experts) and Qwen3-MoE (8 experts) route each token to 2 experts
(Mixtral renormalises the two weights, this Qwen3-MoE does not:
norm_topk_prob false); Phi-3 has fused qkv_proj and gate_up_proj, rotates
half of each head (partial_rotary_factor 0.5) and has a sliding window of 8
on every layer. The expert models' references use transformers' eager expert
loop (its grouped-matmul path has no float64 kernel).

Needs torch and transformers (not needed to run the tests). Usage:
  python3 tools/make_hf_golden.py --out tests/data/hf [--only gemma2,gemma3]
"""
import argparse
import json
import math
import os
import shutil

import numpy as np
import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig,
                          LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, Phi3Config, Phi3ForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

VOCAB = 256
N_TOKENS = 24

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)

GEMMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, head_dim=8, tie_word_embeddings=True,
             hidden_activation="gelu_pytorch_tanh", pad_token_id=0)

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
    # Local (even) and global (odd) layers, window 6; soft-capping low enough
    # to bend the scores and logits of a model this small.
    "gemma2": (Gemma2Config, Gemma2ForCausalLM, dict(
        GEMMA, sliding_window=6, query_pre_attn_scalar=12, attn_logit_softcapping=2.0,
        final_logit_softcapping=15.0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # Layers local, local, global, local (sliding_window_pattern 3), window 5,
    # local RoPE base 10000, global base 1e6 with linear scaling 4, q/k norms.
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, dict(
        GEMMA, sliding_window=5, sliding_window_pattern=3, query_pre_attn_scalar=12,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0}})),
    # 4 experts, 2 per token, routing weights renormalised over the chosen two
    # (Mixtral's router); expert FFN width 16.
    "mixtral": (MixtralConfig, MixtralForCausalLM, dict(
        tie_word_embeddings=True, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
        rope_theta=1000000.0, sliding_window=None)),
    # 8 experts, 2 per token, routing weights left as the softmax over all
    # experts gave them (norm_topk_prob false); per-head q/k norms.
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(
        tie_word_embeddings=True, head_dim=16, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], rope_theta=1000000.0)),
    # Fused qkv_proj and gate_up_proj, half the head rotated
    # (partial_rotary_factor 0.5), a sliding window of 8 on every layer.
    "phi3": (Phi3Config, Phi3ForCausalLM, dict(
        tie_word_embeddings=True, intermediate_size=32, sliding_window=8, pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
}
N_TOKENS_OF = {"gemma2": 32, "gemma3": 32}


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    gemma = model.config.model_type.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_((0.0 if gemma else 1.0) + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:  # [out, in] matrices ([expert, out, in] for fused expert banks)
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
        if model.config.tie_word_embeddings:
            model.tie_weights()


def reference_logits(path, cls, ids):
    # Eager experts: the grouped-matmul path has no float64 kernel.
    extra = {"experts_implementation": "eager"} if "moe" in path or "mixtral" in path else {}
    model = cls.from_pretrained(path, dtype=torch.float32, **extra).double().eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/hf")
    ap.add_argument("--only", default="", help="comma-separated architectures to (re)make (default: all)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    for i, (name, (cfg_cls, cls, extra)) in enumerate(MODELS.items()):
        if only and name not in only:
            continue
        n_tokens = N_TOKENS_OF.get(name, N_TOKENS)
        ids = [int(x) for x in np.random.default_rng(8).integers(0, VOCAB, n_tokens)]
        root = os.path.join(args.out, name)
        shutil.rmtree(root, ignore_errors=True)
        torch.manual_seed(100 + i)
        model = cls(cfg_cls(**{**COMMON, **extra})).eval()
        randomise(model, 100 + i)
        meta = {"architecture": name, "n_vocab": VOCAB, "tokens": ids, "checkpoints": {}}
        for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            d = os.path.join(root, dtype_name)
            shard = "40KB" if (name == "qwen2" and dtype_name == "bf16") else "100MB"
            model.to(dtype).save_pretrained(d, safe_serialization=True, max_shard_size=shard)
            logits = reference_logits(d, cls, ids)
            assert logits.shape == (n_tokens, VOCAB)
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
