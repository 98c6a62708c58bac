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

Quantized checkpoints (llama and qwen3): the bf16 checkpoint's linear layers
(q/k/v/o, gate/up/down projections) quantized by the numpy reference
quantizers below to the published layouts, everything else kept in bf16, and
written as real checkpoint folders with the configuration their producers
write:

  OUT/llama/fp8_block     quant_method "fp8" (transformers' fine-grained FP8):
                          F8_E4M3 weight, F32 weight_scale_inv per 128x128 block
  OUT/llama/fp8_channel   compressed-tensors float-quantized, strategy channel:
                          F8_E4M3 weight, BF16 weight_scale [N, 1], FP8 dynamic
                          per-token activations (ignore: lm_head)
  OUT/llama/fp8_tensor    ModelOpt FP8 in hf_quant_config.json only (as older
                          exports have it): F32 scalar weight_scale and
                          input_scale, FP8 KV cache with k_scale / v_scale
  OUT/llama/nvfp4         ModelOpt NVFP4 (config.json quantization_config and
                          hf_quant_config.json): U8 weight [N, K/2] (element
                          2i in the low nibble), F8_E4M3 weight_scale [N, K/16],
                          F32 weight_scale_2, input_scale
  OUT/qwen3/fp8_block     fine-grained FP8 with weight_block_size [32, 32], so
                          that these narrow matrices have several blocks each way
  OUT/qwen3/nvfp4         ModelOpt NVFP4 (o_proj has 32 input columns: fewer
                          than quern's 64-element NVFP4 blocks)
  OUT/qwen3_5/fp8_block   the same two for Qwen3.5, its DeltaNet in_proj_qkv,
  OUT/qwen3_5/nvfp4       in_proj_z and out_proj quantized too
  OUT/qwen3_5_moe/fp8_block, nvfp4 (--gpu-shapes only) the same for the MoE
                          model, each expert's matrices stored and quantized
                          alone (experts.N.gate_proj ..., as published)

Qwen3.5 (dense and MoE): the fp32 checkpoint also carries a
multi-token-prediction head (mtp.*, config mtp_num_hidden_layers 1) drawn at
random and then distilled from the trunk for a few hundred steps, so that its
drafts are sometimes right; OUT/NAME/fp32.mtp.logits holds its reference
logits (golden.json "mtp"), see add_mtp_head.

GPU shapes (--gpu-shapes, default OUT tests/data/hf_gpu): the same
architectures (LongRoPE excepted) with every head of 32 elements and every
width a multiple of 32 (and of 64 where NVFP4 blocks meet it), the sizes the
CUDA decode path takes; tests/cuda/hf_golden_cuda_test.cpp reads them on
the GPU, and tests/model/hf_golden_test.cpp (HfGoldenGpuShapes) on the CPU.
The committed fixtures come from transformers 5.24.0 and torch 2.15.0 (CPU),
granite's from transformers 5.17.0 and torch 2.11.0 (the GPU machine's),
qwen3_5's from transformers 5.25.0 and torch 2.15.0 (CPU; it needs >= 5.2);
transformers 5.17.0 computed Gemma 2's logits differently from the second
position on (same weights), so remake the others with one version.

Each one's golden logits come from transformers' float model with the
dequantized weights loaded into it (float64, as above), not from
transformers' own quantized loaders; golden.json records per quantized
weight the FNV-1a 64 hash of its dequantized float32 bytes (row-major
[N][K]), so a test can check quern decodes every weight exactly as the
reference does. Recipes (ties to even in every rounding; saturating):
  FP8 E4M3: scale = amax / 448 over the block, row or tensor (1 if zero),
            code = E4M3(w / scale); dequantized = code * scale (f32).
  NVFP4:    global = amax(tensor) / (6 * 448); per 16 elements
            scale = E4M3(amax / (6 * global)), E4M3(1) for an all-zero group
            (ModelOpt's rule); code = E2M1(w / f32(scale * global));
            dequantized = e2m1(code) * f32(e4m3(scale) * global).
The numpy E4M3 encoder is checked against torch's float8_e4m3fn cast.

Needs torch and transformers (not needed to run the tests). Usage:
  python3 tools/make_hf_golden.py --out tests/data/hf [--only gemma2,gemma3]
  python3 tools/make_hf_golden.py --quant-only [--only llama]   # remake only the quantized folders
"""
import argparse
import copy
import json
import math
import os
import shutil
import tempfile

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GraniteConfig,
                          GraniteForCausalLM, LlamaConfig,
                          LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, Phi3Config, Phi3ForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

try:  # transformers >= 5.2
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig
except ImportError:
    Qwen3_5ForCausalLM = Qwen3_5TextConfig = None
try:
    from transformers import GptOssConfig, GptOssForCausalLM
except ImportError:
    GptOssConfig = None

VOCAB = 256
N_TOKENS = 24

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)

GEMMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, head_dim=8, tie_word_embeddings=True,
             hidden_activation="gelu_pytorch_tanh", pad_token_id=0)

LONGROPE = dict(
    tie_word_embeddings=True, intermediate_size=32, pad_token_id=0, max_position_embeddings=64,
    original_max_position_embeddings=16,
    rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 16,
                     "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                     "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 13.0, 18.0]})

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
    # LongRoPE (Phi-3 128k / Phi-3.5): original context 16 of 64 (factor 4,
    # attention factor sqrt(1 + ln 4 / ln 16)); 24 tokens run past the original
    # context (the long factors at every position, as transformers picks them
    # for one pass), 12 stay within it (the short factors).
    "phi3_longrope": (Phi3Config, Phi3ForCausalLM, dict(LONGROPE)),
    "phi3_longrope_short": (Phi3Config, Phi3ForCausalLM, dict(LONGROPE)),
    # Llama's block with Granite's four multipliers: embeddings x 12, each
    # branch x 0.22 before its residual add, scores x 0.09 (not
    # 1/sqrt(head_dim)), logits / 8.
    "granite": (GraniteConfig, GraniteForCausalLM, dict(
        tie_word_embeddings=False, rope_theta=10000.0, embedding_multiplier=12.0, residual_multiplier=0.22,
        attention_multiplier=0.09, logits_scaling=8.0)),
}
if Qwen3_5TextConfig is not None:
    # Qwen3.5: layers linear, linear, linear, full (full_attention_interval 4);
    # Gated DeltaNet with 2 key heads and 4 value heads of 8 (each key head
    # serves two value heads), conv kernel 4; gated full attention with heads
    # of 16, a quarter of each rotated. 64 tokens: the recurrence runs long.
    MODELS["qwen3_5"] = (Qwen3_5TextConfig, Qwen3_5ForCausalLM, dict(
        num_hidden_layers=4, head_dim=16, tie_word_embeddings=False, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}))
    # Qwen3.5-MoE: the same hybrid stack, every FFN 8 experts of 16 (2 per
    # token, renormalised) plus a shared expert of 32 behind a sigmoid gate.
    MODELS["qwen3_5_moe"] = (Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM, dict(
        num_hidden_layers=4, head_dim=16, tie_word_embeddings=False, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=32,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}))
if GptOssConfig is not None:
    # gpt-oss: layers sliding, full, sliding, full (window 32 of 300 tokens);
    # heads of 16 with sinks; 8 experts of 32, 4 per token, biased, their
    # clamped SwiGLU reached (gate|up drawn 4x wider); YaRN with factor 8 over
    # an original context of 64, not truncated, as the released config has it.
    MODELS["gpt_oss"] = (GptOssConfig, GptOssForCausalLM, dict(
        num_hidden_layers=4, head_dim=16, num_local_experts=8, num_experts_per_tok=4, intermediate_size=32,
        sliding_window=32, max_position_embeddings=512, tie_word_embeddings=False, attention_bias=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64}))
N_TOKENS_OF = {"gemma2": 32, "gemma3": 32, "phi3_longrope": 24, "phi3_longrope_short": 12, "qwen3_5": 64,
               "qwen3_5_moe": 64, "gpt_oss": 300}

LONGROPE_GPU = {**LONGROPE["rope_parameters"],
                "short_factor": [1.0, 1.05, 1.1, 1.2, 1.3, 1.45, 1.6, 1.8, 2.0, 2.2, 2.5, 2.8, 3.1, 3.4, 3.8, 4.2],
                "long_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.2, 4.0, 5.0, 6.0, 7.5, 9.0, 11.0, 13.0, 15.5, 18.0, 21.0]}

# --gpu-shapes: overrides per architecture giving heads of 32 elements and
# widths that are multiples of 64.
GPU_COMMON = dict(hidden_size=128, intermediate_size=128)
GPU_SHAPES = {
    "llama": {}, "qwen2": {},
    "qwen3": dict(head_dim=32),
    "gemma2": dict(hidden_size=64, head_dim=32, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128),
    "gemma3": dict(hidden_size=64, head_dim=32, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128),
    "mixtral": dict(intermediate_size=64),
    "qwen3_moe": dict(head_dim=32, moe_intermediate_size=64),
    "phi3": dict(intermediate_size=128),
    # Heads of 32, all rotated: 16 factors each.
    "phi3_longrope": dict(intermediate_size=128, rope_parameters=LONGROPE_GPU),
    "phi3_longrope_short": dict(intermediate_size=128, rope_parameters=LONGROPE_GPU),
    "granite": {},
    # DeltaNet heads of 32 too (2 key, 4 value heads), experts and the shared expert of 64.
    "qwen3_5": dict(head_dim=32, linear_key_head_dim=32, linear_value_head_dim=32),
    "qwen3_5_moe": dict(head_dim=32, linear_key_head_dim=32, linear_value_head_dim=32, moe_intermediate_size=64,
                        shared_expert_intermediate_size=64),
}


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    # Norms that multiply by 1 + w (Gemma's, Qwen3.5's but its DeltaNet output norm) draw w around 0.
    zero_centred = model.config.model_type.startswith("gemma") or model.config.model_type.startswith("qwen3_5")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                zc = zero_centred and not name.endswith("linear_attn.norm.weight")
                p.copy_((0.0 if zc else 1.0) + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("self_attn.sinks"):  # gpt-oss: logits of the scale of the scores
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                # gpt-oss stacks experts input-major ([expert, in, out]); gate|up
                # wide enough that its clamp at 7 bites
                wide = 4.0 if name.endswith("gate_up_proj") else 1.0
                p.copy_(wide * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-2]))
            elif name.endswith(".bias") or name.endswith("_proj_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:  # [out, in] matrices ([expert, out, in] for fused expert banks)
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
        if model.config.tie_word_embeddings:
            model.tie_weights()


# Architectures whose golden.json also holds transformers' greedy continuation
# of the prompt (this many new tokens, float64, with its cache).
GREEDY = {"qwen3_5": 16, "qwen3_5_moe": 16, "gpt_oss": 16}


def eager_experts(path):
    return {"experts_implementation": "eager"} if "moe" in path or "mixtral" in path or "gpt_oss" in path else {}


def greedy_continuation(path, cls, ids, n):
    extra = eager_experts(path)
    model = cls.from_pretrained(path, dtype=torch.float32, **extra).double().eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return [int(x) for x in out[0, len(ids):]]


# Architectures whose fp32 checkpoint also carries a multi-token-prediction
# head (mtp.*, config mtp_num_hidden_layers 1), as Qwen's releases do.
MTP = {"qwen3_5", "qwen3_5_moe"}
# With --gpu-shapes the dense model's head only (tests/cuda/mtp_cuda_test.cpp
# reads it); the committed MoE fixture of GPU shapes predates the head and
# the CUDA draft head's MoE path is checked against the CPU instead.
MTP_GPU = {"qwen3_5"}
MTP_TRAIN_STEPS = 300


def add_mtp_head(root, d, cls, ids, seed):
    """Adds an MTP head (random, then distilled from the trunk) to the fp32
    checkpoint in d and writes its
    reference logits: at position p (0 .. n-2) the head reads token ids[p+1]
    and the trunk's last hidden state h_p (after the final norm) and predicts
    ids[p+2]: x = fc([norm_e(embed(ids[p+1])) | norm_h(h_p)]), one
    full-attention decoder layer over x at positions 0 .. n-2 (causal), then
    logits = lm_head(norm(x)). transformers has no MTP module; the layer is
    its own decoder layer class (the trunk's full-attention layer, reused
    with fresh weights), the norms its RMSNorm (1 + w)."""
    from safetensors.torch import load_file, save_file
    extra = {"experts_implementation": "eager"} if "moe" in d else {}
    model = cls.from_pretrained(d, dtype=torch.float32, **extra).double().eval()
    model.config._attn_implementation = "eager"
    full = model.config.layer_types.index("full_attention")
    head = copy.deepcopy(model)  # its layer `full` becomes the MTP layer; its file gives the saved names
    g = torch.Generator().manual_seed(seed)
    E = model.config.hidden_size
    norm_cls = type(model.model.norm)
    parts = {"fc": torch.nn.Linear(2 * E, E, bias=False).double(), "pre_fc_norm_embedding": norm_cls(E).double(),
             "pre_fc_norm_hidden": norm_cls(E).double(), "norm": norm_cls(E).double()}
    with torch.no_grad():
        for name, p in list(head.model.layers[full].named_parameters()) + [
                (k + ".weight", m.weight) for k, m in parts.items()]:
            if name.endswith("norm.weight"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))

    def head_logits(x_ids):
        """The head's logits at positions 0 .. n-2 of each row of x_ids."""
        h = model.model(x_ids).last_hidden_state[:, :-1].detach()
        e = model.model.embed_tokens(x_ids[:, 1:]).detach()
        x = parts["fc"](torch.cat([parts["pre_fc_norm_embedding"](e), parts["pre_fc_norm_hidden"](h)], dim=-1))
        b, n = x.shape[0], x.shape[1]
        pos = torch.arange(n)[None, None, :].expand(3, b, n)
        mask = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        x = head.model.layers[full](x, position_embeddings=head.model.rotary_emb(x, pos), attention_mask=mask,
                                    position_ids=torch.arange(n)[None].expand(b, n))
        x = x[0] if isinstance(x, tuple) else x
        return model.lm_head(parts["norm"](x))

    # Distil the head from the trunk (as MTP heads are trained to predict the
    # token after next): on random token rows, its logits at p towards the
    # trunk's at p + 1, so that its drafts are sometimes right and the
    # speculative tests see drafts kept as well as rejected.
    params = list(head.model.layers[full].parameters()) + [m.weight for m in parts.values()]
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(MTP_TRAIN_STEPS):
        rows = torch.randint(0, model.config.vocab_size, (16, 48), generator=g)
        with torch.no_grad():
            want = torch.softmax(model(rows).logits[:, 1:], dim=-1)
        loss = -(want * torch.log_softmax(head_logits(rows), dim=-1)).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        logits = head_logits(torch.tensor([ids]))[0].float().numpy()
    n = len(ids) - 1
    with tempfile.TemporaryDirectory() as tmp:
        head.float().save_pretrained(tmp, safe_serialization=True)
        saved = load_file(os.path.join(tmp, "model.safetensors"))
    prefix = f"model.layers.{full}."
    tensors = load_file(os.path.join(d, "model.safetensors"))
    for k, v in saved.items():
        if k.startswith(prefix):
            tensors["mtp.layers.0." + k[len(prefix):]] = v.contiguous()
    for k, m in parts.items():
        tensors[f"mtp.{k}.weight"] = m.weight.detach().float().contiguous()
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    cfg["mtp_num_hidden_layers"] = 1
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    logits.astype("<f4").tofile(os.path.join(root, "fp32.mtp.logits"))
    return {"logits_file": "fp32.mtp.logits", "positions": n}


def reference_logits(path, cls, ids, truncate_yarn=False, experts=None):
    # Eager experts: the grouped-matmul path has no float64 kernel.
    model = cls.from_pretrained(path, dtype=torch.float32, **eager_experts(path)).double().eval()
    if experts is not None:  # dequantized expert banks in place of the checkpoint's
        with torch.no_grad():
            for k, v in model.state_dict().items():
                if k in experts:
                    v.copy_(torch.from_numpy(experts[k]))
    if truncate_yarn:  # llama.cpp's YaRN: the correction range floored and ceiled
        model.config.rope_parameters["truncate"] = True
        model.model.rotary_emb = type(model.model.rotary_emb)(model.config).double()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


# ---------------------------------------------------------------- gpt-oss MXFP4 experts

def mxfp4_quantize(w):
    """[..., R, K] float32 -> (blocks uint8 [..., R, K/32, 16], scales uint8 [..., R, K/32]) in the checkpoint
    layout (element 2i in the low nibble of byte i): the OCP MX shared exponent floor(log2(amax)) - 2 (scale
    byte 0 for an all-zero block), codes E2M1(w / 2^(e - 127)), nearest, ties to even, saturating."""
    b = w.reshape(*w.shape[:-1], w.shape[-1] // 32, 32).astype(np.float32)
    amax = np.abs(b).max(axis=-1)
    e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2 + 127, 0)
    e = np.clip(e, 0, 254).astype(np.uint8)
    codes = to_e2m1(b / np.ldexp(np.float32(1), e.astype(np.int32) - 127)[..., None])
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return blocks, e


def make_gpt_oss_mxfp4(root, cls, ids, meta):
    """OUT/gpt_oss/mxfp4: the fp32 checkpoint with its expert banks in MXFP4 (gate_up_proj_blocks /
    _scales, down_proj_blocks / _scales; quantization_config quant_method mxfp4), the rest fp32; its
    reference runs on the banks as transformers' convert_moe_packed_tensors dequantizes them."""
    from safetensors.numpy import load_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    src, d = os.path.join(root, "fp32"), os.path.join(root, "mxfp4")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    sd = load_file(os.path.join(src, "model.safetensors"))
    deq = {}
    for k in list(sd):
        if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"):
            w = np.swapaxes(sd.pop(k), 1, 2)  # [X, out, in]
            blocks, scales = mxfp4_quantize(w)
            sd[k + "_blocks"], sd[k + "_scales"] = blocks, scales
            back = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
            deq[k] = back.numpy().astype(np.float64)  # back to [X, in, out]
    save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "mxfp4",
                                     "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                "model.embed_tokens", "lm_head"]}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    shutil.copy(os.path.join(src, "generation_config.json"), d)
    for variant, trunc in (("mxfp4", False), ("mxfp4_truncated", True)):
        logits = reference_logits(src, cls, ids, truncate_yarn=trunc, experts=deq)
        logits.astype("<f4").tofile(os.path.join(root, variant + ".logits"))
        if not trunc:
            top2 = np.sort(logits, axis=1)[:, -2:]
            gap = float((top2[:, 1] - top2[:, 0]).min())
    meta["checkpoints"]["mxfp4"] = {"folder": "mxfp4", "logits_file": "mxfp4.logits", "min_top2_gap": gap,
                                    "files": sorted(os.listdir(d))}


def add_truncated_yarn_reference(root, cls, ids, meta):
    """fp32 logits with llama.cpp's YaRN (truncated correction range), the reference of the GGUF files
    llama.cpp's converter writes from these checkpoints (tools/make_llamacpp_gguf.py)."""
    logits = reference_logits(os.path.join(root, "fp32"), cls, ids, truncate_yarn=True)
    logits.astype("<f4").tofile(os.path.join(root, "fp32_truncated.logits"))
    meta["llamacpp_references"] = {"fp32": "fp32_truncated.logits", "mxfp4": "mxfp4_truncated.logits"}


# ---------------------------------------------------------------- reference quantizers (numpy)

def _e4m3_values():
    """float32 value of every E4M3 (E4M3FN) byte; NaN for 0x7F and 0xFF."""
    v = np.zeros(256, np.float64)
    for c in range(256):
        mag, field, mant = c & 0x7F, (c >> 3) & 0xF, c & 7
        x = mant * 2.0 ** -9 if field == 0 else (8 + mant) * 2.0 ** (field - 10)
        v[c] = np.nan if mag == 0x7F else (-x if c & 0x80 else x)
    return v.astype(np.float32)


E4M3 = _e4m3_values()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def _nearest_even(a, grid):
    """Index of the grid value (ascending, codes 0..len-1) nearest to each a >= 0;
    ties go to the even index; beyond the last value saturates."""
    hi = np.clip(np.searchsorted(grid, a, side="left"), 1, len(grid) - 1)
    lo = hi - 1
    dlo, dhi = a - grid[lo], grid[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    return np.where(a >= grid[-1], len(grid) - 1, np.where(pick_hi, hi, lo))


def to_e4m3(x):
    """float32 array -> E4M3 codes (uint8): nearest, ties to even, |x| > 448 saturates."""
    x = np.asarray(x, np.float32)
    mag = _nearest_even(np.abs(x).astype(np.float64), E4M3[:127].astype(np.float64)).astype(np.uint8)
    return mag | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)


def to_e2m1(x):
    """float32 array -> E2M1 codes (0..15): nearest, ties to even, |x| > 6 saturates."""
    x = np.asarray(x, np.float32)
    mag = _nearest_even(np.abs(x).astype(np.float64), E2M1[:8].astype(np.float64)).astype(np.uint8)
    return mag | np.where(np.signbit(x), 8, 0).astype(np.uint8)


def check_e4m3_against_torch():
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.normal(0, 50, 100000), rng.normal(0, 1e-2, 100000), E4M3[:127].astype(np.float64),
                        (E4M3[:126].astype(np.float64) + E4M3[1:127]) / 2]).astype(np.float32)
    x = np.clip(x, -448, 448)
    t = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(to_e4m3(x), t), "numpy E4M3 encoder disagrees with torch"
    assert np.array_equal(E4M3[t], torch.from_numpy(t).view(torch.float8_e4m3fn).float().numpy())


def fp8_quantize(w, bn, bk):
    """w [N, K] float32 -> (codes uint8 [N, K], scale float32 [ceil(N/bn), ceil(K/bk)]) with
    scale = amax / 448 per bn x bk block (1 where a block is all zero); dequantize() inverts."""
    N, K = w.shape
    gr, gc = -(-N // bn), -(-K // bk)
    scale = np.ones((gr, gc), np.float32)
    for i in range(gr):
        for j in range(gc):
            am = np.abs(w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]).max()
            if am > 0:
                scale[i, j] = np.float32(am) / np.float32(448)
    full = np.repeat(np.repeat(scale, bn, 0), bk, 1)[:N, :K]
    return to_e4m3(w / full), scale


def fp8_dequantize(codes, scale, bn, bk):
    N, K = codes.shape
    full = np.repeat(np.repeat(scale.astype(np.float32), bn, 0), bk, 1)[:N, :K]
    return (E4M3[codes] * full).astype(np.float32)


def nvfp4_quantize(w):
    """w [N, K] float32 -> (packed uint8 [N, K/2], scale E4M3 codes [N, K/16], global float32)."""
    N, K = w.shape
    amax = np.float32(np.abs(w).max())
    g = amax / np.float32(6 * 448) if amax > 0 else np.float32(1)
    groups = w.reshape(N, K // 16, 16)
    gmax = np.abs(groups).max(axis=2)
    sc = np.where(gmax > 0, to_e4m3(gmax / (np.float32(6) * g)), to_e4m3(np.float32(1)))
    s = (E4M3[sc] * g).astype(np.float32)
    q = np.where(s[:, :, None] > 0, to_e2m1(groups / np.where(s > 0, s, 1)[:, :, None]), 0).astype(np.uint8)
    q = q.reshape(N, K)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8), sc.astype(np.uint8), np.float32(g)


def nvfp4_dequantize(packed, sc, g):
    N, half = packed.shape
    q = np.empty((N, 2 * half), np.uint8)
    q[:, 0::2], q[:, 1::2] = packed & 0xF, packed >> 4
    s = (E4M3[sc] * np.float32(g)).astype(np.float32)
    return (E2M1[q].reshape(N, -1, 16) * s[:, :, None]).reshape(N, 2 * half).astype(np.float32)


def fnv1a64(a):
    h = 0xCBF29CE484222325
    for b in np.ascontiguousarray(a, "<f4").tobytes():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


# Qwen3.5's DeltaNet projections too (in_proj_b / in_proj_a, one row per
# value head, stay in bf16, as in the published FP8 checkpoints' ignore lists).
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "in_proj_qkv", "in_proj_z",
          "out_proj")

FINE_GRAINED = {"quant_method": "fp8", "activation_scheme": "dynamic", "modules_to_not_convert": ["lm_head"]}
CT_FP8_CHANNEL = {
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False,
                    "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
                    "observer_kwargs": {}},
        "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True,
                              "group_size": None, "block_structure": None, "actorder": None, "observer": None,
                              "observer_kwargs": {}},
        "output_activations": None}},
    "ignore": ["lm_head"], "kv_cache_scheme": None, "global_compression_ratio": None, "sparsity_config": {},
    "transform_config": {}}
MODELOPT_PRODUCER = {"name": "modelopt", "version": "reference"}

# architecture -> [(folder, config.json quantization_config or None, hf_quant_config.json "quantization" or None)]
QUANT_FIXTURES = {
    "llama": [
        ("fp8_block", dict(FINE_GRAINED, weight_block_size=[128, 128]), None),
        ("fp8_channel", CT_FP8_CHANNEL, None),
        ("fp8_tensor", None, {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}),
        ("nvfp4", {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"],
                   "kv_cache_scheme": None, "producer": MODELOPT_PRODUCER},
         {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": ["lm_head"]}),
    ],
    "qwen3_5": [
        ("fp8_block", dict(FINE_GRAINED, weight_block_size=[32, 32]), None),
        ("nvfp4", {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"],
                   "producer": MODELOPT_PRODUCER}, None),
    ],
    "qwen3_5_moe": [
        ("fp8_block", dict(FINE_GRAINED, weight_block_size=[32, 32]), None),
        ("nvfp4", {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"],
                   "producer": MODELOPT_PRODUCER}, None),
    ],
    "qwen3": [
        ("fp8_block", dict(FINE_GRAINED, weight_block_size=[32, 32]), None),
        ("nvfp4", {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"],
                   "producer": MODELOPT_PRODUCER}, None),
    ],
}


def quantize_checkpoint(variant, qcfg, sd):
    """The tensors of a quantized checkpoint and the dequantized float32 weights
    of its quantized layers, from a float state dict `sd` (numpy float32)."""
    out, deq = {}, {}
    for name, w in sd.items():
        parts = name.split(".")
        if not (name.endswith(".weight") and len(parts) >= 2 and parts[-2] in LINEAR):
            out[name] = torch.from_numpy(w).to(torch.bfloat16)  # exact: the weights came from bf16
            continue
        module = name[:-len(".weight")]
        N, K = w.shape
        if variant == "nvfp4":
            packed, sc, g = nvfp4_quantize(w)
            out[name] = torch.from_numpy(packed)
            out[module + ".weight_scale"] = torch.from_numpy(sc).view(torch.float8_e4m3fn)
            out[module + ".weight_scale_2"] = torch.tensor(float(g), dtype=torch.float32)
            out[module + ".input_scale"] = torch.tensor(0.0125, dtype=torch.float32)
            deq[name] = nvfp4_dequantize(packed, sc, g)
            continue
        if variant == "fp8_block":
            bn, bk = qcfg["weight_block_size"]
        elif variant == "fp8_channel":
            bn, bk = 1, K
        else:
            bn, bk = N, K
        codes, scale = fp8_quantize(w, bn, bk)
        out[name] = torch.from_numpy(codes).view(torch.float8_e4m3fn)
        if variant == "fp8_block":
            out[module + ".weight_scale_inv"] = torch.from_numpy(scale)
            deq[name] = fp8_dequantize(codes, scale, bn, bk)
        elif variant == "fp8_channel":
            # compressed-tensors keeps scales in the model's dtype: round to bf16 first
            scale_bf16 = torch.from_numpy(scale).to(torch.bfloat16)
            out[module + ".weight_scale"] = scale_bf16
            scale = scale_bf16.float().numpy()
            codes = to_e4m3(w / np.repeat(scale, K, 1))
            out[name] = torch.from_numpy(codes).view(torch.float8_e4m3fn)
            deq[name] = fp8_dequantize(codes, scale, bn, bk)
        else:  # ModelOpt FP8: scalar scales, static input scale, KV-cache scales
            out[module + ".weight_scale"] = torch.tensor(float(scale[0, 0]), dtype=torch.float32)
            out[module + ".input_scale"] = torch.tensor(0.0234375, dtype=torch.float32)
            if parts[-2] in ("k_proj", "v_proj"):
                out[module + "." + parts[-2][0] + "_scale"] = torch.tensor(1.0, dtype=torch.float32)
            deq[name] = fp8_dequantize(codes, scale, bn, bk)
    return out, deq


def split_expert_banks(sd):
    """transformers holds an MoE layer's experts as stacked banks
    (experts.gate_up_proj [E, 2F, K], gate rows first; experts.down_proj
    [E, K, F]); published checkpoints, the quantized ones included, store one
    matrix per expert (experts.N.gate_proj.weight ...), as save_pretrained
    writes them. Those per-expert names, so that each is quantized alone."""
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            f = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{k[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = v[e, :f].copy()
                out[f"{k[:-len('gate_up_proj')]}{e}.up_proj.weight"] = v[e, f:].copy()
        elif k.endswith("mlp.experts.down_proj"):
            for e in range(v.shape[0]):
                out[f"{k[:-len('down_proj')]}{e}.down_proj.weight"] = v[e].copy()
        else:
            out[k] = v
    return out


def stack_expert_banks(deq, params):
    """The dequantized weights under the model's own parameter names: per-expert
    matrices stacked back into the banks split_expert_banks split."""
    out, banks = {}, {}
    for k, v in deq.items():
        parts = k.split(".")
        if len(parts) >= 4 and parts[-4] == "experts" and parts[-3].isdigit() and k not in params:
            prefix = ".".join(parts[:-3])
            banks.setdefault(prefix, {})[(int(parts[-3]), parts[-2])] = v
        else:
            out[k] = v
    for prefix, m in banks.items():
        n = 1 + max(e for e, _ in m)
        gu = params[prefix + ".gate_up_proj"].detach().numpy().copy()
        down = params[prefix + ".down_proj"].detach().numpy().copy()
        for e in range(n):
            f = gu.shape[1] // 2
            if (e, "gate_proj") in m:
                gu[e, :f] = m[(e, "gate_proj")]
            if (e, "up_proj") in m:
                gu[e, f:] = m[(e, "up_proj")]
            if (e, "down_proj") in m:
                down[e] = m[(e, "down_proj")]
        out[prefix + ".gate_up_proj"], out[prefix + ".down_proj"] = gu, down
    return out


def make_quantized(name, cls, root, ids, meta):
    check_e4m3_against_torch()
    src = os.path.join(root, "bf16")
    base = cls.from_pretrained(src, dtype=torch.float32)
    sd = {k: v.detach().numpy().copy() for k, v in base.state_dict().items()}
    if base.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    sd = split_expert_banks(sd)
    for variant, qcfg, modelopt in QUANT_FIXTURES.get(name, []):
        d = os.path.join(root, variant)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        tensors, deq = quantize_checkpoint(variant, qcfg, sd)
        save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(src, "config.json")) as f:
            config = json.load(f)
        if qcfg is not None:
            config["quantization_config"] = qcfg
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        shutil.copy(os.path.join(src, "generation_config.json"), d)
        if modelopt is not None:
            with open(os.path.join(d, "hf_quant_config.json"), "w") as f:
                json.dump({"producer": MODELOPT_PRODUCER, "quantization": modelopt}, f, indent=4)
                f.write("\n")
        # reference: the float model with the dequantized weights, in float64
        model = cls.from_pretrained(src, dtype=torch.float32, **eager_experts(src))
        with torch.no_grad():
            params = dict(model.named_parameters())
            for k, v in stack_expert_banks(deq, params).items():
                params[k].copy_(torch.from_numpy(v))
            logits = model.double().eval()(torch.tensor([ids])).logits[0].float().numpy()
        logits.astype("<f4").tofile(os.path.join(root, variant + ".logits"))
        top2 = np.sort(logits, axis=1)[:, -2:]
        meta["checkpoints"][variant] = {
            "folder": variant, "logits_file": variant + ".logits",
            "min_top2_gap": float((top2[:, 1] - top2[:, 0]).min()),
            "files": sorted(os.listdir(d)),
            "quantized": True,
            "dequantized_fnv1a64": {k: fnv1a64(v) for k, v in sorted(deq.items())}}
        print(name, variant, meta["checkpoints"][variant]["min_top2_gap"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/hf")
    ap.add_argument("--only", default="", help="comma-separated architectures to (re)make (default: all)")
    ap.add_argument("--gpu-shapes", action="store_true",
                    help="heads of 32 and widths of multiples of 64 for the CUDA tests (default --out tests/data/hf_gpu)")
    ap.add_argument("--quant-only", action="store_true",
                    help="remake only the quantized checkpoints, from the committed bf16 ones")
    args = ap.parse_args()
    if args.gpu_shapes and args.out == "tests/data/hf":
        args.out = "tests/data/hf_gpu"
    only = set(filter(None, args.only.split(",")))
    if args.quant_only:
        for name in QUANT_FIXTURES:
            if only and name not in only:
                continue
            root = os.path.join(args.out, name)
            with open(os.path.join(root, "golden.json")) as f:
                meta = json.load(f)
            make_quantized(name, MODELS[name][1], root, meta["tokens"], meta)
            with open(os.path.join(root, "golden.json"), "w") as f:
                json.dump(meta, f, indent=1)
                f.write("\n")
        return
    for i, (name, (cfg_cls, cls, extra)) in enumerate(MODELS.items()):
        if only and name not in only:
            continue
        if args.gpu_shapes:
            if name not in GPU_SHAPES:
                continue
            extra = {**extra, **GPU_COMMON, **GPU_SHAPES[name]}
        n_tokens = N_TOKENS_OF.get(name, N_TOKENS)
        ids = [int(x) for x in np.random.default_rng(8).integers(0, VOCAB, n_tokens)]
        root = os.path.join(args.out, name)
        shutil.rmtree(root, ignore_errors=True)
        torch.manual_seed(100 + i)
        model = cls(cfg_cls(**{**COMMON, **extra})).eval()
        if args.gpu_shapes:
            cfg = model.config
            hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            assert hd == 32 and cfg.hidden_size % 64 == 0, (name, hd, cfg.hidden_size)
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
        make_quantized(name, cls, root, ids, meta)
        if name == "gpt_oss" and not args.gpu_shapes:
            make_gpt_oss_mxfp4(root, cls, ids, meta)
            add_truncated_yarn_reference(root, cls, ids, meta)
        if name in (MTP_GPU if args.gpu_shapes else MTP):
            meta["mtp"] = add_mtp_head(root, os.path.join(root, "fp32"), cls, ids, 5000 + i)
        if name in GREEDY:
            meta["greedy"] = greedy_continuation(os.path.join(root, "fp32"), cls, ids, GREEDY[name])
        with open(os.path.join(root, "golden.json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        print(name, {k: v["min_top2_gap"] for k, v in meta["checkpoints"].items()})


if __name__ == "__main__":
    main()
