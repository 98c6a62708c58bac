#include "model/arch/blocks.h"

#include <fmt/format.h>

#include "core/error.h"
#include "formats/gguf.h"

namespace quern::arch {

std::string blk(int64_t il, const char* s) { return fmt::format("blk.{}.{}", il, s); }
std::string hf_layer(int64_t il, const char* s) { return fmt::format("model.layers.{}.{}", il, s); }

void table_embedding(const ModelConfig& c, TensorTable& t) {
    t.matrix("token_embd.weight", "model.embed_tokens.weight", {c.n_embd, c.n_vocab});
}

void table_head(const ModelConfig& c, TensorTable& t) {
    t.vector("output_norm.weight", "model.norm.weight", c.n_embd);
    t.matrix("output.weight", c.tie_embeddings ? "" : "lm_head.weight", {c.n_embd, c.n_vocab}).optional = true;
    t.vector("rope_freqs.weight", "", c.rope_dim / 2).optional = true;
}

void table_attention(const ModelConfig& c, TensorTable& t, int64_t il, bool fused_qkv) {
    const int64_t E = c.n_embd, Q = c.q_dim(), K = c.kv_dim();
    t.vector(blk(il, "attn_norm.weight"), hf_layer(il, "input_layernorm.weight"), E);
    if (fused_qkv) {
        t.matrix(blk(il, "attn_qkv.weight"), hf_layer(il, "self_attn.qkv_proj.weight"), {E, Q + 2 * K});
    } else {
        t.matrix(blk(il, "attn_q.weight"), hf_layer(il, "self_attn.q_proj.weight"), {E, Q});
        t.matrix(blk(il, "attn_k.weight"), hf_layer(il, "self_attn.k_proj.weight"), {E, K});
        t.matrix(blk(il, "attn_v.weight"), hf_layer(il, "self_attn.v_proj.weight"), {E, K});
    }
    if (c.qkv_bias) {
        t.vector(blk(il, "attn_q.bias"), hf_layer(il, "self_attn.q_proj.bias"), Q);
        t.vector(blk(il, "attn_k.bias"), hf_layer(il, "self_attn.k_proj.bias"), K);
        t.vector(blk(il, "attn_v.bias"), hf_layer(il, "self_attn.v_proj.bias"), K);
    }
    t.matrix(blk(il, "attn_output.weight"), hf_layer(il, "self_attn.o_proj.weight"), {Q, E});
    if (c.out_bias) t.vector(blk(il, "attn_output.bias"), hf_layer(il, "self_attn.o_proj.bias"), E);
    if (c.qk_norm) {
        t.vector(blk(il, "attn_q_norm.weight"), hf_layer(il, "self_attn.q_norm.weight"), c.head_dim);
        t.vector(blk(il, "attn_k_norm.weight"), hf_layer(il, "self_attn.k_norm.weight"), c.head_dim);
    }
}

void table_ffn(const ModelConfig& c, TensorTable& t, int64_t il, bool fused_gate_up) {
    const int64_t E = c.n_embd, F = c.n_ff;
    if (fused_gate_up) {
        t.matrix(blk(il, "ffn_up.weight"), hf_layer(il, "mlp.gate_up_proj.weight"), {E, 2 * F});
    } else {
        t.matrix(blk(il, "ffn_gate.weight"), hf_layer(il, "mlp.gate_proj.weight"), {E, F});
        t.matrix(blk(il, "ffn_up.weight"), hf_layer(il, "mlp.up_proj.weight"), {E, F});
    }
    t.matrix(blk(il, "ffn_down.weight"), hf_layer(il, "mlp.down_proj.weight"), {F, E});
}

void table_moe(const ModelConfig& c, TensorTable& t, int64_t il, const char* hf_block, const char* hf_router,
               const char* hf_gate, const char* hf_up, const char* hf_down) {
    const int64_t E = c.n_embd, F = c.n_ff_exp, X = c.n_expert;
    const std::string hb = hf_layer(il, hf_block);
    t.matrix(blk(il, "ffn_gate_inp.weight"), hb + hf_router, {E, X}).keep_float = true;
    const auto bank = [&](const char* name, const char* hf, std::vector<int64_t> shape) {
        t.experts(fmt::format("blk.{}.{}_exps.weight", il, name), fmt::format("blk.{}.{}.{{}}.weight", il, name),
                  hb + "experts.{}." + hf, std::move(shape), X);
    };
    bank("ffn_gate", hf_gate, {E, F});
    bank("ffn_up", hf_up, {E, F});
    bank("ffn_down", hf_down, {F, E});
}

void table_llama(const ModelConfig& c, TensorTable& t, const HfMoeNames& moe) {
    table_embedding(c, t);
    for (int64_t il = 0; il < c.n_layer; ++il) {
        table_attention(c, t, il);
        t.vector(blk(il, "ffn_norm.weight"), hf_layer(il, "post_attention_layernorm.weight"), c.n_embd);
        if (c.moe()) table_moe(c, t, il, moe.block, moe.router, moe.gate, moe.up, moe.down);
        else table_ffn(c, t, il);
    }
    table_head(c, t);
}

RopeSpec rope_spec(const ModelConfig& c, const BoundWeights& w, ProgramBuilder& b, int64_t il) {
    RopeSpec r;
    r.dim = static_cast<int>(c.rope_dim);
    r.neox = c.rope_neox;
    // Local (sliding-window) layers may turn at their own base, unscaled.
    const bool local = c.window(il) > 0;
    r.base = local && c.rope_base_local > 0.0f ? c.rope_base_local : c.rope_base;
    if (c.longrope()) {
        r.factors = b.constant(c.rope_factors_short);
        r.long_factors = b.constant(c.rope_factors_long);
        r.long_from = c.rope_orig_ctx;
    } else if (!(local && c.rope_factors_global_only)) {
        if (const Tensor* f = w.find("rope_freqs.weight")) r.factors = static_cast<const float*>(f->data);
        else if (!c.rope_freq_factors.empty()) r.factors = b.constant(c.rope_freq_factors);
    }
    return r;
}

AttentionSpec attention_spec(const ModelConfig& c, const BoundWeights& w, ProgramBuilder& b, int64_t il) {
    AttentionSpec s;
    s.kv_layer = static_cast<int>(il);
    s.n_head = static_cast<int>(c.n_head);
    s.n_head_kv = static_cast<int>(c.n_head_kv);
    s.head_dim = static_cast<int>(c.head_dim);
    s.scale = c.qk_scale();
    s.softcap = c.attn_softcap;
    s.window = c.window(il);
    s.rope = rope_spec(c, w, b, il);
    if (c.qk_norm) {
        s.q_norm = &w.get(blk(il, "attn_q_norm.weight"));
        s.k_norm = &w.get(blk(il, "attn_k_norm.weight"));
        s.norm_eps = c.rms_eps;
    }
    return s;
}

Value embed(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w) {
    Value x = b.embed(w.get("token_embd.weight"));
    return c.embd_scale > 0.0f ? b.scale(x, c.embd_scale) : x;
}

Value self_attention(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, int64_t il, Value h,
                     bool fused_qkv, const Tensor* sinks) {
    std::vector<LinearPiece> qkv;
    if (fused_qkv) {
        // One matrix of q, k then v rows, used as its three parts.
        const Tensor& f = w.get(blk(il, "attn_qkv.weight"));
        const int64_t Q = c.q_dim(), K = c.kv_dim();
        qkv = {{&b.rows_view(f, 0, 0, Q, f.name + "[q]")},
               {&b.rows_view(f, 0, Q, K, f.name + "[k]")},
               {&b.rows_view(f, 0, Q + K, K, f.name + "[v]")}};
    } else {
        for (const char* p : {"attn_q", "attn_k", "attn_v"})
            qkv.push_back({&w.get(blk(il, (std::string(p) + ".weight").c_str())),
                           c.qkv_bias ? &w.get(blk(il, (std::string(p) + ".bias").c_str())) : nullptr});
    }
    AttentionSpec spec = attention_spec(c, w, b, il);
    spec.sinks = sinks;
    Value a = b.attention(b.linear(h, std::move(qkv)), spec);
    return b.linear(a, w.get(blk(il, "attn_output.weight")), c.out_bias ? &w.get(blk(il, "attn_output.bias")) : nullptr);
}

Value gated_ffn(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, int64_t il, Value h, GluAct act,
                bool fused_gate_up) {
    std::vector<LinearPiece> gu;
    if (fused_gate_up) {
        const Tensor& f = w.get(blk(il, "ffn_up.weight"));
        gu = {{&b.rows_view(f, 0, 0, c.n_ff, f.name + "[gate]")}, {&b.rows_view(f, 0, c.n_ff, c.n_ff, f.name + "[up]")}};
    } else {
        gu = {{&w.get(blk(il, "ffn_gate.weight"))}, {&w.get(blk(il, "ffn_up.weight"))}};
    }
    return b.linear(b.glu(b.linear(h, std::move(gu)), act), w.get(blk(il, "ffn_down.weight")));
}

MoeSpec moe_spec(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, int64_t il, GluAct act) {
    MoeSpec s;
    s.router = &w.get(blk(il, "ffn_gate_inp.weight"));
    s.n_expert = static_cast<int>(c.n_expert);
    s.n_used = static_cast<int>(c.n_expert_used);
    s.n_ff = c.n_ff_exp;
    s.renormalize = c.expert_weights_norm;
    s.act = act;
    const auto bank = [&](const char* name, int64_t rows) {
        const BoundBank& bb = w.bank(fmt::format("blk.{}.{}_exps.weight", il, name));
        ExpertBank e;
        e.stacked = bb.stacked;
        e.experts = bb.experts;
        if (bb.stacked)  // one 3-D tensor: each expert a 2-D view of it
            for (int64_t x = 0; x < c.n_expert; ++x)
                e.experts.push_back(&b.rows_view(*bb.stacked, x, 0, rows, fmt::format("{}[{}]", bb.stacked->name, x)));
        return e;
    };
    s.gate = bank("ffn_gate", c.n_ff_exp);
    s.up = bank("ffn_up", c.n_ff_exp);
    s.down = bank("ffn_down", c.n_embd);
    return s;
}

Value moe_ffn(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, int64_t il, Value h, GluAct act) {
    return b.moe(h, moe_spec(b, c, w, il, act));
}

void trace_layer(ProgramBuilder& b, int64_t il, Value x) { b.trace(x, fmt::format("blk.{}", il)); }

Program output_head(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, Value x, float logit_scale) {
    b.set_layer(-1);
    // Rows are selected before the norm (it is per row): a pass norms only
    // the rows it wants logits of — unless every row is handed out.
    const Value all = c.hidden_rows ? b.rms_norm(x, w.get("output_norm.weight"), c.rms_eps) : Value{};
    Value h = c.hidden_rows ? b.select_rows(all) : b.rms_norm(b.select_rows(x), w.get("output_norm.weight"), c.rms_eps);
    const Tensor* out = w.find("output.weight");
    Value logits = b.linear(h, out ? *out : w.get("token_embd.weight"));  // tied embeddings
    if (logit_scale != 1.0f) logits = b.scale(logits, logit_scale);
    if (c.final_softcap > 0.0f) logits = b.softcap(logits, c.final_softcap);
    b.trace(logits, "logits");
    return b.finish(logits, all);
}

void hf_require_silu(const HfKeys& k) {
    const std::string act = k.get_string("hidden_act", "silu");
    if (act != "silu") fail("{}: hidden_act '{}' is not supported (quern computes silu)", k.where, act);
}

void hf_full_attention(const HfKeys& k) {
    // Qwen2/Qwen3 have the keys, off by default.
    if (k.get_bool("use_sliding_window", false))
        fail("{}: use_sliding_window = true is not supported (quern computes full attention)", k.where);
    if (k.has("layer_types")) {
        if (!k.j["layer_types"].is_array()) fail("{}: key 'layer_types' must be an array", k.where);
        for (const nlohmann::json& t : k.j["layer_types"])
            if (!t.is_string() || t.get<std::string>() != "full_attention")
                fail("{}: layer_types entry {} is not supported (quern computes full_attention layers)", k.where,
                     t.dump());
    }
}

void hf_uniform_window(const HfKeys& k, ModelConfig& c) {
    if (!k.has("sliding_window")) return;  // absent or null: none
    c.sliding_window = k.get_int("sliding_window");
    if (c.sliding_window <= 0) fail("{}: sliding_window must be positive or null, got {}", k.where, c.sliding_window);
    if (c.n_layer > 0 && c.n_layer <= (int64_t{1} << 20)) c.swa_layers.assign(static_cast<size_t>(c.n_layer), 1);
}

void hf_experts(const HfKeys& k, ModelConfig& c) {
    const char* ek = k.has("num_experts") ? "num_experts" : "num_local_experts";
    c.n_expert = k.get_int(ek);
    c.n_expert_used = k.get_int("num_experts_per_tok");
    if (c.n_expert <= 0 || c.n_expert_used <= 0 || c.n_expert_used > c.n_expert)
        fail("{}: {} = {} and num_experts_per_tok = {} must satisfy 0 < num_experts_per_tok <= {}", k.where, ek,
             c.n_expert, c.n_expert_used, ek);
    if (k.get_int("num_shared_experts", 0) != 0 || k.get_int("shared_expert_intermediate_size", 0) != 0)
        fail("{}: shared experts are not supported", k.where);
}

bool hf_layer_types(const HfKeys& k, ModelConfig& c) {
    if (!k.has("layer_types")) return false;
    const nlohmann::json& lt = k.j["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.n_layer)
        fail("{}: key 'layer_types' must be an array of num_hidden_layers ({}) strings", k.where, c.n_layer);
    c.swa_layers.assign(lt.size(), 0);
    for (size_t il = 0; il < lt.size(); ++il) {
        const std::string t = lt[il].is_string() ? lt[il].get<std::string>() : lt[il].dump();
        if (t != "sliding_attention" && t != "full_attention")
            fail("{}: layer_types entry '{}' is not supported (sliding_attention, full_attention)", k.where, t);
        c.swa_layers[il] = t == "sliding_attention";
    }
    return true;
}

void gguf_write_heads(const ModelConfig& c, GgufWriter& w, const std::string& a, bool key_length, bool rope_dim) {
    if (key_length || c.head_dim != c.n_embd / c.n_head) {
        w.set_u32(a + "attention.key_length", static_cast<uint32_t>(c.head_dim));
        w.set_u32(a + "attention.value_length", static_cast<uint32_t>(c.head_dim));
    }
    if (rope_dim) w.set_u32(a + "rope.dimension_count", static_cast<uint32_t>(c.rope_dim));
}

void gguf_write_llama(const ModelConfig& c, GgufWriter& w, const std::string& a) { gguf_write_heads(c, w, a); }

ProgramBuilder make_builder(const ModelConfig& c) {
    return ProgramBuilder(c.n_vocab, static_cast<int>(c.n_layer), c.kv_dim());
}

}  // namespace quern::arch
