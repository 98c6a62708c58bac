#!/usr/bin/env python3
"""Write a Hugging Face folder from a llama / qwen2 / gemma3 GGUF file, for checking
`quern quantize FOLDER` on real weights (bench/run_hf_quantize_cpu.sh): the
tensors dequantized to F16 (or F32) under transformers' names, q/k rows of a
llama model put back in the checkpoint order (GGUF files store them permuted
for interleaved RoPE), Gemma's RMSNorm weights as w − 1 (GGUF stores 1 + w),
config.json from the GGUF keys, and tokenizer.json /
tokenizer_config.json from tools/tok_gguf_to_tokenizer_json.py.

    python3 bench/gguf_to_hf_folder.py MODEL.gguf OUT_DIR [--dtype f16|f32]
"""
import argparse
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import tok_gguf_to_tokenizer_json  # noqa: E402

NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
GEMMA = dict(NAMES, ffn_norm="pre_feedforward_layernorm", post_attention_norm="post_attention_layernorm",
             post_ffw_norm="post_feedforward_layernorm", attn_q_norm="self_attn.q_norm", attn_k_norm="self_attn.k_norm")


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    v = f.parts[f.data[0]]
    return v.tobytes().decode() if f.types[0].name == "STRING" else v.item()


def unpermute(w, n_head):
    # GGUF row (h, i, j) of a head holds checkpoint row (h, j, i): pairs (2i, 2i+1) <- (i, i + d/2).
    d = w.shape[0] // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--dtype", default="f16", choices=["f16", "f32"])
    a = ap.parse_args()
    r = GGUFReader(a.gguf)
    arch = field(r, "general.architecture")
    if arch not in ("llama", "qwen2", "gemma3"):
        sys.exit(f"{arch}: only llama, qwen2 and gemma3 GGUF files are written back")
    names = GEMMA if arch == "gemma3" else NAMES
    p = arch + "."
    n_head, n_kv = field(r, p + "attention.head_count"), field(r, p + "attention.head_count_kv")
    dt = np.float16 if a.dtype == "f16" else np.float32
    tensors = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)]).astype(np.float32)
        parts = t.name.split(".")
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        elif parts[0] == "blk":
            name = f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"
            if arch == "llama" and parts[2] in ("attn_q", "attn_k"):
                w = unpermute(w, n_head if parts[2] == "attn_q" else n_kv)
        else:
            continue
        if arch == "gemma3" and t.name.endswith("norm.weight"):
            w = w - 1.0
        tensors[name] = np.ascontiguousarray(w.astype(np.float32 if w.ndim == 1 else dt))
    os.makedirs(a.out, exist_ok=True)
    save_file(tensors, os.path.join(a.out, "model.safetensors"))
    n_embd = field(r, p + "embedding_length")
    cfg = {"architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"],
           "model_type": arch, "hidden_size": n_embd, "num_hidden_layers": field(r, p + "block_count"),
           "num_attention_heads": n_head, "num_key_value_heads": n_kv,
           "intermediate_size": field(r, p + "feed_forward_length"),
           "rms_norm_eps": field(r, p + "attention.layer_norm_rms_epsilon"),
           "rope_theta": field(r, p + "rope.freq_base", 10000.0),
           "max_position_embeddings": field(r, p + "context_length"),
           "vocab_size": tensors["model.embed_tokens.weight"].shape[0],
           "tie_word_embeddings": "lm_head.weight" not in tensors, "hidden_act": "silu",
           "torch_dtype": "float16" if a.dtype == "f16" else "float32"}
    if arch == "qwen2":
        cfg["use_sliding_window"] = False
    if arch == "gemma3":
        cfg.update({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                    "head_dim": field(r, p + "attention.key_length"), "hidden_activation": "gelu_pytorch_tanh",
                    "query_pre_attn_scalar": field(r, p + "attention.key_length"),
                    "sliding_window": field(r, p + "attention.sliding_window"),
                    "sliding_window_pattern": field(r, p + "attention.sliding_window_pattern", 6),
                    "rope_local_base_freq": field(r, p + "rope.freq_base_swa", 10000.0),
                    "final_logit_softcapping": None, "attn_logit_softcapping": None})
        del cfg["hidden_act"]
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    tok, tok_cfg = tok_gguf_to_tokenizer_json.convert(a.gguf)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    tmpl = field(r, "tokenizer.chat_template")
    if tmpl:
        tok_cfg["chat_template"] = tmpl
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, ensure_ascii=False)
    print(f"{a.out}: {len(tensors)} tensors, {arch}")


if __name__ == "__main__":
    main()
