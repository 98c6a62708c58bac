// Qwen3.5 / Qwen3.6 text models, dense and MoE: a hybrid stack where most layers are
// Gated DeltaNet linear attention (a recurrent state per sequence) and every
// full_attention_interval-th layer is gated full attention (q projects to
// [query | gate] per head, sigmoid(gate) scales the attention output; q/k
// RMSNorm; NeoX RoPE on the first partial_rotary_factor of each head). Every
// RMSNorm but the DeltaNet output's scales by (1 + w) in checkpoints, which
// GGUF files store with the 1 added. The MoE sizes replace every FFN by
// routed experts (softmax, top-k, renormalised) plus a shared expert scaled
// by sigmoid(x · w) per token. transformers' Qwen3_5ForCausalLM /
// Qwen3_5MoeForCausalLM (model_type qwen3_5_text / qwen3_5_moe_text, or a
// wrapper's text_config); llama.cpp's qwen35 / qwen35moe.
//
// The multi-token-prediction head (checkpoints' mtp.*, llama.cpp's NextN
// block appended after the trunk, blk.{n_layer}.*) is one more full-attention
// decoder layer: at position p it reads RMSNorm(embed(x_{p+1})) and
// RMSNorm(h_p) — h_p the trunk's last hidden state after the output norm —
// concatenated in that order and projected back to n_embd (fc / eh_proj);
// its output, normed by its own norm, goes through the shared LM head and
// predicts x_{p+2} (vLLM's qwen3_next_mtp, llama.cpp's qwen35 graph_mtp).
#include <fmt/format.h>

#include <cmath>

#include "formats/gguf.h"
#include "model/arch/blocks.h"

namespace quern::arch {

namespace {

/// Whether layer il is linear attention when every interval-th is full.
std::vector<uint8_t> interval_layers(int64_t n_layer, int64_t interval) {
    std::vector<uint8_t> r(static_cast<size_t>(n_layer));
    for (int64_t il = 0; il < n_layer; ++il) r[static_cast<size_t>(il)] = (il + 1) % interval != 0;
    return r;
}

void gguf_config(const GgufKeys& k, ModelConfig& c) {
    c.rope_neox = true;
    c.qk_norm = true;
    c.ssm_conv_kernel = k.get_int("ssm.conv_kernel");
    c.ssm_state_size = k.get_int("ssm.state_size");
    c.ssm_group_count = k.get_int("ssm.group_count");
    c.ssm_time_step_rank = k.get_int("ssm.time_step_rank");
    c.ssm_inner_size = k.get_int("ssm.inner_size");
    // llama.cpp counts the MTP (NextN) blocks appended after the trunk in
    // block_count.
    const int64_t n_blocks = c.n_layer;
    c.n_nextn = k.get_int("nextn_predict_layers", 0);
    c.n_layer -= c.n_nextn;
    if (c.n_layer < 1) fail("GGUF: {}nextn_predict_layers leaves no trunk layers of {}", k.prefix, n_blocks);
    // The converter writes the mask when config.json lists layer_types (one
    // entry per block, false for the NextN ones); the interval otherwise.
    const std::string mask_key = k.prefix + "attention.recurrent_layers";
    if (k.f.find(mask_key)) {
        const std::vector<bool> mask = k.f.get_bool_array(mask_key);
        if (static_cast<int64_t>(mask.size()) != n_blocks)
            fail("GGUF: {} has {} entries for {} blocks", mask_key, mask.size(), n_blocks);
        c.recurrent_layers.assign(mask.begin(), mask.begin() + c.n_layer);
    } else {
        c.recurrent_layers = interval_layers(c.n_layer, k.get_int("full_attention_interval", 4));
    }
    c.extra["v_heads_tiled"] = 1;  // the converter reorders value heads: head h reads key head h % n_k
    // A file converted with --no-mtp (or stripped) has no NextN block; one
    // with several: the first drafts (llama.cpp uses only that one too).
    if (c.n_nextn > 0 && !k.has_tensor(blk(c.n_layer, "nextn.eh_proj.weight"))) c.n_nextn = 0;
    c.n_nextn = std::min<int64_t>(c.n_nextn, 1);
    if (c.moe()) {
        c.n_ff_exp = k.get_int("expert_feed_forward_length");
        c.n_ff = k.get_int("expert_shared_feed_forward_length");
        c.expert_weights_norm = true;
    }
}

void hf_config(const HfKeys& k, const std::string& model_type, ModelConfig& c) {
    hf_require_silu(k);
    if (model_type == "qwen3_5_moe_text") {
        c.n_expert = k.get_int("num_experts");
        c.n_expert_used = k.get_int("num_experts_per_tok");
        c.n_ff_exp = k.get_int("moe_intermediate_size");
        c.n_ff = k.get_int("shared_expert_intermediate_size");  // n_ff: the shared expert's width
        c.expert_weights_norm = true;                            // Qwen3_5MoeTopKRouter always renormalises
    }
    c.qk_norm = true;
    // The checkpoint may lack the head (load_hf_model then sets 0); only
    // the first of several drafts.
    c.n_nextn = std::min<int64_t>(k.get_int("mtp_num_hidden_layers", 0), 1);
    c.ssm_conv_kernel = k.get_int("linear_conv_kernel_dim", 4);
    c.ssm_state_size = k.get_int("linear_key_head_dim", 128);
    c.ssm_group_count = k.get_int("linear_num_key_heads", 16);
    c.ssm_time_step_rank = k.get_int("linear_num_value_heads", 32);
    c.ssm_inner_size = k.get_int("linear_value_head_dim", 128) * c.ssm_time_step_rank;
    if (k.has("layer_types")) {
        const auto& lt = k.j["layer_types"];
        if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.n_layer)
            fail("{}: key 'layer_types' must list {} layer types", k.where, c.n_layer);
        for (const auto& t : lt) {
            const std::string s = t.is_string() ? t.get<std::string>() : "";
            if (s != "linear_attention" && s != "full_attention")
                fail("{}: layer type '{}' (linear_attention or full_attention)", k.where, t.dump());
            c.recurrent_layers.push_back(s == "linear_attention");
        }
    } else {
        c.recurrent_layers = interval_layers(c.n_layer, k.get_int("full_attention_interval", 4));
    }
}

/// Decoder layer il's tensors: a DeltaNet or a gated-attention mixer, then the FFN.
void layer_tensors(const ModelConfig& c, TensorTable& t, int64_t il, bool recurrent) {
    const int64_t E = c.n_embd, Q = c.q_dim(), K = c.kv_dim(), nv = c.ssm_time_step_rank;
    const int64_t CD = 2 * c.ssm_group_count * c.ssm_state_size + c.ssm_inner_size, VD = c.ssm_inner_size;
    {
        t.vector(blk(il, "attn_norm.weight"), hf_layer(il, "input_layernorm.weight"), E).hf_add_one = true;
        t.vector(blk(il, "post_attention_norm.weight"), hf_layer(il, "post_attention_layernorm.weight"), E)
            .hf_add_one = true;
        if (recurrent) {
            t.matrix(blk(il, "attn_qkv.weight"), hf_layer(il, "linear_attn.in_proj_qkv.weight"), {E, CD});
            t.matrix(blk(il, "attn_gate.weight"), hf_layer(il, "linear_attn.in_proj_z.weight"), {E, VD});
            t.matrix(blk(il, "ssm_beta.weight"), hf_layer(il, "linear_attn.in_proj_b.weight"), {E, nv});
            t.matrix(blk(il, "ssm_alpha.weight"), hf_layer(il, "linear_attn.in_proj_a.weight"), {E, nv});
            t.floats(blk(il, "ssm_conv1d.weight"), hf_layer(il, "linear_attn.conv1d.weight"), {c.ssm_conv_kernel, CD})
                .hf_shape = {CD, 1, c.ssm_conv_kernel};
            t.vector(blk(il, "ssm_dt.bias"), hf_layer(il, "linear_attn.dt_bias"), nv);
            t.vector(blk(il, "ssm_a"), hf_layer(il, "linear_attn.A_log"), nv).hf_neg_exp = true;
            t.vector(blk(il, "ssm_norm.weight"), hf_layer(il, "linear_attn.norm.weight"), VD / nv);
            t.matrix(blk(il, "ssm_out.weight"), hf_layer(il, "linear_attn.out_proj.weight"), {VD, E});
        } else {
            t.matrix(blk(il, "attn_q.weight"), hf_layer(il, "self_attn.q_proj.weight"), {E, 2 * Q});
            t.matrix(blk(il, "attn_k.weight"), hf_layer(il, "self_attn.k_proj.weight"), {E, K});
            t.matrix(blk(il, "attn_v.weight"), hf_layer(il, "self_attn.v_proj.weight"), {E, K});
            t.matrix(blk(il, "attn_output.weight"), hf_layer(il, "self_attn.o_proj.weight"), {Q, E});
            t.vector(blk(il, "attn_q_norm.weight"), hf_layer(il, "self_attn.q_norm.weight"), c.head_dim).hf_add_one = true;
            t.vector(blk(il, "attn_k_norm.weight"), hf_layer(il, "self_attn.k_norm.weight"), c.head_dim).hf_add_one = true;
        }
        if (c.moe()) {
            table_moe(c, t, il, "mlp.", "gate.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight");
            t.matrix(blk(il, "ffn_gate_shexp.weight"), hf_layer(il, "mlp.shared_expert.gate_proj.weight"), {E, c.n_ff});
            t.matrix(blk(il, "ffn_up_shexp.weight"), hf_layer(il, "mlp.shared_expert.up_proj.weight"), {E, c.n_ff});
            t.matrix(blk(il, "ffn_down_shexp.weight"), hf_layer(il, "mlp.shared_expert.down_proj.weight"), {c.n_ff, E});
            t.matrix(blk(il, "ffn_gate_inp_shexp.weight"), hf_layer(il, "mlp.shared_expert_gate.weight"), {E, 1})
                .keep_float = true;
        } else {
            t.matrix(blk(il, "ffn_gate.weight"), hf_layer(il, "mlp.gate_proj.weight"), {E, c.n_ff});
            t.matrix(blk(il, "ffn_up.weight"), hf_layer(il, "mlp.up_proj.weight"), {E, c.n_ff});
            t.matrix(blk(il, "ffn_down.weight"), hf_layer(il, "mlp.down_proj.weight"), {c.n_ff, E});
        }
    }
}

/// The NextN block: a full-attention layer at index n_layer (checkpoints:
/// mtp.layers.0.*) and its input projection and norms.
void draft_tensors(const ModelConfig& c, TensorTable& t) {
    const int64_t L = c.n_layer, E = c.n_embd;
    const size_t first = t.entries().size();
    layer_tensors(c, t, L, /*recurrent=*/false);
    const std::string trunk = hf_layer(L, ""), mtp = "mtp.layers.0.";
    for (size_t i = first; i < t.entries().size(); ++i) {
        std::string& hf = t.entries()[i].hf;
        if (hf.starts_with(trunk)) hf = mtp + hf.substr(trunk.size());
    }
    t.matrix(blk(L, "nextn.eh_proj.weight"), "mtp.fc.weight", {2 * E, E});
    t.vector(blk(L, "nextn.enorm.weight"), "mtp.pre_fc_norm_embedding.weight", E).hf_add_one = true;
    t.vector(blk(L, "nextn.hnorm.weight"), "mtp.pre_fc_norm_hidden.weight", E).hf_add_one = true;
    t.vector(blk(L, "nextn.shared_head_norm.weight"), "mtp.norm.weight", E).hf_add_one = true;
}

void tensors(const ModelConfig& c, TensorTable& t) {
    table_embedding(c, t);
    for (int64_t il = 0; il < c.n_layer; ++il) layer_tensors(c, t, il, c.recurrent(il));
    if (c.n_nextn > 0) draft_tensors(c, t);
    table_head(c, t);
    for (TensorEntry& e : t.entries())
        if (e.gguf == "output_norm.weight") e.hf_add_one = true;
}

/// Layer il's Gated DeltaNet mixer over the normed input h.
Value linear_attention(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, int64_t il, Value h) {
    DeltaNetSpec s;
    s.state_layer = -1;  // the next slot
    s.n_k_heads = static_cast<int>(c.ssm_group_count);
    s.n_v_heads = static_cast<int>(c.ssm_time_step_rank);
    s.head_k = static_cast<int>(c.ssm_state_size);
    s.head_v = static_cast<int>(c.ssm_inner_size / c.ssm_time_step_rank);
    s.conv_kernel = static_cast<int>(c.ssm_conv_kernel);
    s.kv_tiled = c.extra.count("v_heads_tiled") && c.extra.at("v_heads_tiled") != 0.0f;
    s.conv = &w.get(blk(il, "ssm_conv1d.weight"));
    s.a_coef = &w.get(blk(il, "ssm_a"));
    s.dt_bias = &w.get(blk(il, "ssm_dt.bias"));
    const Value qkv = b.linear(h, w.get(blk(il, "attn_qkv.weight")));
    const Value z = b.linear(h, w.get(blk(il, "attn_gate.weight")));
    const Value ba = b.linear(h, {{&w.get(blk(il, "ssm_beta.weight"))}, {&w.get(blk(il, "ssm_alpha.weight"))}});
    Value o = b.delta_net(qkv, ba, s);
    o = b.rms_norm(o, w.get(blk(il, "ssm_norm.weight")), c.rms_eps, s.head_v);  // per value head
    o = b.gate(o, z, GluAct::SiLU);
    return b.linear(o, w.get(blk(il, "ssm_out.weight")));
}

/// Layer il's gated full attention over h, writing KV-cache layer kv_layer.
Value gated_attention(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, int64_t il, int kv_layer,
                      Value h) {
    const Tensor& q = w.get(blk(il, "attn_q.weight"));  // per head: head_dim query rows, then head_dim gate rows
    const int64_t hd = c.head_dim;
    std::vector<LinearPiece> qkv, gate;
    for (int64_t hh = 0; hh < c.n_head; ++hh) {
        qkv.push_back({&b.rows_view(q, 0, 2 * hh * hd, hd, fmt::format("{}[q{}]", q.name, hh))});
        gate.push_back({&b.rows_view(q, 0, 2 * hh * hd + hd, hd, fmt::format("{}[gate{}]", q.name, hh))});
    }
    qkv.push_back({&w.get(blk(il, "attn_k.weight"))});
    qkv.push_back({&w.get(blk(il, "attn_v.weight"))});
    AttentionSpec s = attention_spec(c, w, b, il);
    s.kv_layer = kv_layer;
    Value a = b.attention(b.linear(h, std::move(qkv)), s);
    a = b.gate(a, b.linear(h, std::move(gate)), GluAct::Sigmoid);
    return b.linear(a, w.get(blk(il, "attn_output.weight")));
}

/// Layer il's FFN over h: SwiGLU, or routed experts plus the gated shared expert.
Value ffn(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, int64_t il, Value h) {
    if (!c.moe()) return gated_ffn(b, c, w, il, h, GluAct::SiLU);
    const Value routed = moe_ffn(b, c, w, il, h, GluAct::SiLU);
    Value shared = b.glu(b.linear(h, {{&w.get(blk(il, "ffn_gate_shexp.weight"))}, {&w.get(blk(il, "ffn_up_shexp.weight"))}}),
                         GluAct::SiLU);
    shared = b.linear(shared, w.get(blk(il, "ffn_down_shexp.weight")));
    shared = b.gate(shared, b.linear(h, w.get(blk(il, "ffn_gate_inp_shexp.weight"))), GluAct::Sigmoid);
    return b.add(routed, shared);
}

/// Decoder layer il over the residual stream x (kv: its KV-cache layer when
/// full attention).
Value decoder_layer(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, int64_t il, bool recurrent,
                    int kv, Value x) {
    b.set_layer(static_cast<int>(il));
    const Value h = b.rms_norm(x, w.get(blk(il, "attn_norm.weight")), c.rms_eps);
    x = b.add(x, recurrent ? linear_attention(b, c, w, il, h) : gated_attention(b, c, w, il, kv, h));
    const Value h2 = b.rms_norm(x, w.get(blk(il, "post_attention_norm.weight")), c.rms_eps);
    x = b.add(x, ffn(b, c, w, il, h2));
    trace_layer(b, il, x);
    return x;
}

/// The LM head over x normed by `norm` on every row: those rows are the
/// program's hidden rows, which the NextN head reads (the norm is per row,
/// so the logits are those of output_head's select-then-norm order).
Program head_with_hidden(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, Value x,
                         const Tensor& norm) {
    b.set_layer(-1);
    const Value h = b.rms_norm(x, norm, c.rms_eps);
    const Tensor* out = w.find("output.weight");
    const Value logits = b.linear(b.select_rows(h), out ? *out : w.get("token_embd.weight"));
    b.trace(logits, "logits");
    return b.finish(logits, h);
}

Program build(const ModelConfig& c, const BoundWeights& w) {
    int n_full = 0;
    for (int64_t il = 0; il < c.n_layer; ++il) n_full += !c.recurrent(il);
    ProgramBuilder b(c.n_vocab, n_full, c.kv_dim());
    Value x = embed(b, c, w);
    int kv = 0;
    for (int64_t il = 0; il < c.n_layer; ++il)
        x = decoder_layer(b, c, w, il, c.recurrent(il), c.recurrent(il) ? -1 : kv++, x);
    if (c.n_nextn > 0) return head_with_hidden(b, c, w, x, w.get("output_norm.weight"));
    b.set_layer(-1);
    return output_head(b, c, w, x);
}

Program build_draft(const ModelConfig& c, const BoundWeights& w) {
    const int64_t L = c.n_layer;
    ProgramBuilder b(c.n_vocab, 1, c.kv_dim());
    b.set_layer(static_cast<int>(L));
    const Value e = b.rms_norm(b.embed(w.get("token_embd.weight")), w.get(blk(L, "nextn.enorm.weight")), c.rms_eps);
    const Value h = b.rms_norm(b.input(c.n_embd), w.get(blk(L, "nextn.hnorm.weight")), c.rms_eps);
    Value x = b.linear(b.concat(e, h), w.get(blk(L, "nextn.eh_proj.weight")));
    x = decoder_layer(b, c, w, L, /*recurrent=*/false, /*kv=*/0, x);
    return head_with_hidden(b, c, w, x, w.get(blk(L, "nextn.shared_head_norm.weight")));
}

void gguf_write(const ModelConfig& c, GgufWriter& w, const std::string& a) {
    gguf_write_heads(c, w, a, /*key_length=*/true);
    // Multimodal RoPE sections (pairs rotated by the text / height / width
    // positions): a text model's positions are one, so any split of the
    // rotated pairs computes the same; llama.cpp needs the key. Split as the
    // released models' [11, 11, 10] of 32 pairs.
    const int32_t pairs = static_cast<int32_t>(c.rope_dim / 2);
    w.set_i32_array(a + "rope.dimension_sections", {(pairs + 2) / 3, (pairs + 1) / 3, pairs / 3, 0});
    w.set_u32(a + "ssm.conv_kernel", static_cast<uint32_t>(c.ssm_conv_kernel));
    w.set_u32(a + "ssm.state_size", static_cast<uint32_t>(c.ssm_state_size));
    w.set_u32(a + "ssm.group_count", static_cast<uint32_t>(c.ssm_group_count));
    w.set_u32(a + "ssm.time_step_rank", static_cast<uint32_t>(c.ssm_time_step_rank));
    w.set_u32(a + "ssm.inner_size", static_cast<uint32_t>(c.ssm_inner_size));
    int64_t interval = 0;
    for (int64_t il = 0; il < c.n_layer && interval == 0; ++il)
        if (!c.recurrent(il)) interval = il + 1;
    w.set_u32(a + "full_attention_interval", static_cast<uint32_t>(interval > 0 ? interval : c.n_layer + 1));
    std::vector<bool> mask(c.recurrent_layers.begin(), c.recurrent_layers.end());
    mask.resize(static_cast<size_t>(c.n_layer + c.n_nextn), false);  // the NextN blocks: full attention
    w.set_bool_array(a + "attention.recurrent_layers", mask);
    if (c.n_nextn > 0) w.set_u32(a + "nextn_predict_layers", static_cast<uint32_t>(c.n_nextn));
    if (c.moe()) {
        w.set_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(c.n_ff_exp));
        w.set_u32(a + "expert_shared_feed_forward_length", static_cast<uint32_t>(c.n_ff));
    }
}

constexpr HfDefaults kHf{.head_dim = 256, .n_ctx = 32768, .partial_rotary = 0.25};
constexpr HfDefaults kMoeHf{.head_dim = 256, .n_ctx = 32768, .partial_rotary = 0.25, .no_intermediate = true};

}  // namespace

extern const ArchDef kQwen35{"qwen35",  {"qwen3_5_text"}, gguf_config, kHf,       hf_config,
                             {},        tensors,          build,       gguf_write, build_draft};
extern const ArchDef kQwen35Moe{"qwen35moe", {"qwen3_5_moe_text"}, gguf_config, kMoeHf,     hf_config,
                                {},          tensors,              build,       gguf_write, build_draft};

}  // namespace quern::arch
