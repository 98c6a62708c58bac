// gpt-oss (OpenAI's gpt-oss-20b / gpt-oss-120b): pre-norm decoder blocks of
// RMSNorm → GQA self-attention (q/k/v/o biases, NeoX RoPE with YaRN scaling,
// a learned sink logit per head in the softmax, a 128-position sliding window
// on even layers and full attention on odd ones) → residual, RMSNorm → a
// top-k mixture of experts (router with a bias, softmax over the chosen
// logits, experts with biases and the clamped SwiGLU: GluAct::SwiGluOai) →
// residual; final RMSNorm and an untied output projection. llama.cpp's
// llm_build_openai_moe ("gpt-oss" GGUF files: ffn_gate_exps / ffn_up_exps /
// ffn_down_exps in MXFP4 with F32 bias tables, attn_sinks, post_attention_norm);
// transformers' GptOssForCausalLM. The Hugging Face experts are stacked
// tensors unlike the other families' (gate and up interleaved column by
// column, stored input-major, or as MXFP4 blocks and scales): hf_load below
// turns them into the GGUF banks.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cstring>
#include <set>

#include "core/fp16.h"
#include "formats/safetensors.h"
#include "model/arch/blocks.h"
#include "model/weights.h"
#include "quant/blocks.h"

namespace quern::arch {

namespace {

// llama.cpp's constants for the clamped SwiGLU of gpt-oss GGUF files
// (llm_graph_context::build_moe_ffn, LLM_FFN_SWIGLU_OAI_MOE); checkpoints
// give swiglu_alpha / swiglu_limit.
constexpr float kSwigluAlpha = 1.702f, kSwigluLimit = 7.0f;

void gguf_config(const GgufKeys& k, ModelConfig& c) {
    if (c.n_expert == 0) fail("gguf key '{}expert_count' is missing or 0 (a gpt-oss file needs experts)", k.prefix);
    c.n_ff_exp = k.get_int("expert_feed_forward_length");
    c.rope_neox = true;
    c.qkv_bias = c.out_bias = true;
    c.expert_weights_norm = true;  // the softmax of the chosen logits
    // llama.cpp: sliding-window layers in a pattern of 2 from layer 0.
    c.sliding_window = k.get_int("attention.sliding_window");
    if (c.sliding_window <= 0) fail("gguf key '{}attention.sliding_window' must be positive", k.prefix);
    if (c.n_layer > 0 && c.n_layer <= (int64_t{1} << 20)) {
        c.swa_layers.assign(static_cast<size_t>(c.n_layer), 0);
        for (int64_t il = 0; il < c.n_layer; il += 2) c.swa_layers[static_cast<size_t>(il)] = 1;
    }
    const double swa_base = k.get_float("rope.freq_base_swa", c.rope_base);
    if (swa_base != c.rope_base) c.rope_base_local = static_cast<float>(swa_base);
    c.extra["swiglu_alpha"] = kSwigluAlpha;
    c.extra["swiglu_limit"] = kSwigluLimit;
}

void hf_config(const HfKeys& k, const std::string&, ModelConfig& c) {
    // GptOssConfig: num_local_experts experts of width intermediate_size.
    hf_experts(k, c);
    c.n_ff_exp = c.n_ff;
    c.rope_neox = true;
    c.qkv_bias = c.out_bias = k.get_bool("attention_bias", true);
    c.expert_weights_norm = true;
    const std::string act = k.get_string("hidden_act", "silu");
    if (act != "silu") fail("{}: hidden_act '{}' is not supported (gpt-oss's experts use the clamped SwiGLU)", k.where, act);
    c.sliding_window = k.get_int("sliding_window", 128);
    if (c.sliding_window <= 0) fail("{}: sliding_window must be positive, got {}", k.where, c.sliding_window);
    if (c.n_layer > 0 && c.n_layer <= (int64_t{1} << 20)) {
        c.swa_layers.assign(static_cast<size_t>(c.n_layer), 0);
        if (!hf_layer_types(k, c))  // GptOssConfig's default: sliding from layer 0, every other layer
            for (int64_t il = 0; il < c.n_layer; il += 2) c.swa_layers[static_cast<size_t>(il)] = 1;
    }
    c.extra["swiglu_alpha"] = static_cast<float>(k.get_float("swiglu_alpha", kSwigluAlpha));
    c.extra["swiglu_limit"] = static_cast<float>(k.get_float("swiglu_limit", kSwigluLimit));
    if (!(c.extra["swiglu_alpha"] > 0.0f) || !(c.extra["swiglu_limit"] > 0.0f))
        fail("{}: swiglu_alpha and swiglu_limit must be positive", k.where);
}

/// The three expert banks' GGUF names: "blk.N.ffn_gate_exps" + ".weight" / ".bias".
std::string bank_name(int64_t il, const char* which, const char* suffix) {
    return fmt::format("blk.{}.ffn_{}_exps.{}", il, which, suffix);
}

void tensors(const ModelConfig& c, TensorTable& t) {
    const int64_t E = c.n_embd, F = c.n_ff_exp, X = c.n_expert;
    table_embedding(c, t);
    for (int64_t il = 0; il < c.n_layer; ++il) {
        table_attention(c, t, il);
        t.vector(blk(il, "attn_sinks.weight"), hf_layer(il, "self_attn.sinks"), c.n_head);
        t.vector(blk(il, "post_attention_norm.weight"), hf_layer(il, "post_attention_layernorm.weight"), E);
        t.matrix(blk(il, "ffn_gate_inp.weight"), hf_layer(il, "mlp.router.weight"), {E, X}).keep_float = true;
        t.vector(blk(il, "ffn_gate_inp.bias"), hf_layer(il, "mlp.router.bias"), X);
        // Checkpoints stack each bank in one tensor of their own layout: hf_load.
        for (const char* which : {"gate", "up", "down"}) {
            const bool down = which[0] == 'd';
            t.experts(bank_name(il, which, "weight"), fmt::format("blk.{}.ffn_{}.{{}}.weight", il, which), "",
                      {down ? F : E, down ? E : F}, X);
            t.floats(bank_name(il, which, "bias"), "", {down ? E : F, X});
        }
    }
    table_head(c, t);
}

Program build(const ModelConfig& c, const BoundWeights& w) {
    ProgramBuilder b = make_builder(c);
    Value x = embed(b, c, w);
    for (int64_t il = 0; il < c.n_layer; ++il) {
        b.set_layer(static_cast<int>(il));
        Value h = b.rms_norm(x, w.get(blk(il, "attn_norm.weight")), c.rms_eps);
        // q/k/v/o biases come with the config (qkv_bias, out_bias)
        x = b.add(x, self_attention(b, c, w, il, h, false, &w.get(blk(il, "attn_sinks.weight"))));
        h = b.rms_norm(x, w.get(blk(il, "post_attention_norm.weight")), c.rms_eps);
        MoeSpec m = moe_spec(b, c, w, il, GluAct::SwiGluOai);
        m.router_bias = &w.get(blk(il, "ffn_gate_inp.bias"));
        m.gate.bias = &w.get(bank_name(il, "gate", "bias"));
        m.up.bias = &w.get(bank_name(il, "up", "bias"));
        m.down.bias = &w.get(bank_name(il, "down", "bias"));
        m.glu_alpha = c.extra.at("swiglu_alpha");
        m.glu_limit = c.extra.at("swiglu_limit");
        x = b.add(x, b.moe(h, std::move(m)));
        trace_layer(b, il, x);
    }
    return output_head(b, c, w, x);
}

void gguf_write(const ModelConfig& c, GgufWriter& w, const std::string& a) {
    gguf_write_heads(c, w, a, /*key_length=*/true);
    w.set_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(c.n_ff_exp));
}

// ---------------------------------------------------------------- Hugging Face experts

/// A buffer-backed tensor added to the store.
void add_owned(WeightStore& w, DType type, std::array<int64_t, 3> ne, std::vector<uint8_t> bytes, const std::string& name) {
    auto buf = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
    w.add(Tensor::contiguous(type, {ne[0], ne[1], ne[2], 1}, buf->data(), name), std::shared_ptr<const void>(buf, buf->data()));
}

const SafetensorsModel::Entry& need(const SafetensorsModel& st, const std::string& name, std::vector<int64_t> shape,
                                    std::set<std::string>& used) {
    const SafetensorsModel::Entry* e = st.find(name);
    if (!e) fail("tensor '{}' is missing from the checkpoint (model_type gpt_oss)", name);
    if (e->info->shape != shape)
        fail("tensor '{}' in {} has shape [{}], expected [{}]", name, e->file->path(), fmt::join(e->info->shape, ", "),
             fmt::join(shape, ", "));
    used.insert(name);
    return *e;
}

float read_float(const SafetensorsModel::Entry& e, int64_t i) {
    const uint8_t* p = e.file->data(*e.info);
    if (e.info->type == DType::F32) {
        float f;
        std::memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    return e.info->type == DType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
}

void require_float(const SafetensorsModel::Entry& e) {
    if (e.info->type != DType::F32 && e.info->type != DType::F16 && e.info->type != DType::BF16)
        fail("tensor '{}' in {} has dtype {}; expected F32, F16 or BF16 (or MXFP4 _blocks / _scales)", e.info->name,
             e.file->path(), e.info->dtype);
}

/// Output rows [first, first + stride·n) step `stride` of an MXFP4 bank in
/// the checkpoint's layout (blocks [X, R, K/32, 16]: element 2i in the low
/// nibble of byte i; scales [X, R, K/32] E8M0) as GGUF MXFP4 {K, n, X}.
std::vector<uint8_t> mxfp4_rows(const SafetensorsModel::Entry& blocks, const SafetensorsModel::Entry& scales, int64_t X,
                                int64_t R, int64_t K, int64_t first, int64_t stride, int64_t n) {
    const int64_t nb = K / QK_MXFP4;
    const uint8_t* bq = blocks.file->data(*blocks.info);
    const uint8_t* sc = scales.file->data(*scales.info);
    std::vector<uint8_t> out(static_cast<size_t>(X * n * nb) * sizeof(block_mxfp4));
    uint8_t* o = out.data();
    for (int64_t x = 0; x < X; ++x)
        for (int64_t r = 0; r < n; ++r) {
            const int64_t row = x * R + first + r * stride;
            for (int64_t j = 0; j < nb; ++j, o += sizeof(block_mxfp4)) {
                const uint8_t* q = bq + (row * nb + j) * 16;
                o[0] = sc[row * nb + j];
                // element e of the block: checkpoint byte e / 2 (low nibble when even);
                // GGUF byte i holds elements i (low) and i + 16 (high)
                for (int i = 0; i < 16; ++i) {
                    const auto nib = [&](int e) { return e % 2 ? q[e / 2] >> 4 : q[e / 2] & 0xF; };
                    o[1 + i] = static_cast<uint8_t>(nib(i) | (nib(i + 16) << 4));
                }
            }
        }
    return out;
}

/// The same rows of a float bank stored input-major ([X, K, R], as
/// GptOssExperts holds gate_up_proj and down_proj), transposed to {K, n, X}
/// in the checkpoint's dtype.
std::vector<uint8_t> float_rows(const SafetensorsModel::Entry& e, int64_t X, int64_t K, int64_t R, int64_t first,
                                int64_t stride, int64_t n) {
    const size_t es = static_cast<size_t>(dtype_info(e.info->type).type_size);
    const uint8_t* src = e.file->data(*e.info);
    std::vector<uint8_t> out(static_cast<size_t>(X * n * K) * es);
    for (int64_t x = 0; x < X; ++x)
        for (int64_t r = 0; r < n; ++r)
            for (int64_t k = 0; k < K; ++k)
                std::memcpy(out.data() + static_cast<size_t>((x * n + r) * K + k) * es,
                            src + static_cast<size_t>((x * K + k) * R + first + r * stride) * es, es);
    return out;
}

/// Columns [first, first + stride·n) step `stride` of a [X, R] bias table as F32 {n, X}.
std::vector<uint8_t> bias_rows(const SafetensorsModel::Entry& e, int64_t X, int64_t R, int64_t first, int64_t stride,
                               int64_t n) {
    std::vector<uint8_t> out(static_cast<size_t>(X * n) * 4);
    for (int64_t x = 0; x < X; ++x)
        for (int64_t r = 0; r < n; ++r) {
            const float v = read_float(e, x * R + first + r * stride);
            std::memcpy(out.data() + static_cast<size_t>(x * n + r) * 4, &v, 4);
        }
    return out;
}

/// Layer il's expert banks from GptOssExperts' tensors: gate_up_proj
/// ([X, E, 2F], gate in even columns, up in odd ones) or its MXFP4
/// gate_up_proj_blocks / _scales ([X, 2F, E/32, 16] / [X, 2F, E/32]),
/// gate_up_proj_bias [X, 2F]; down_proj [X, F, E] or down_proj_blocks /
/// _scales, down_proj_bias [X, E]. MXFP4 stays MXFP4 (repacked into GGML's
/// block layout, as llama.cpp's converter does), float banks keep their dtype.
void hf_load(const ModelConfig& c, const SafetensorsModel& st, WeightStore& w, std::set<std::string>& used) {
    const int64_t E = c.n_embd, F = c.n_ff_exp, X = c.n_expert;
    for (int64_t il = 0; il < c.n_layer; ++il) {
        const std::string p = hf_layer(il, "mlp.experts.");
        for (const bool down : {false, true}) {
            const std::string base = p + (down ? "down_proj" : "gate_up_proj");
            const int64_t K = down ? F : E, R = down ? E : 2 * F;  // input width, output rows
            // gate: rows 0, 2, 4, ...; up: 1, 3, 5, ...; down: every row
            const std::vector<std::pair<const char*, int64_t>> parts =
                down ? std::vector<std::pair<const char*, int64_t>>{{"down", 0}}
                     : std::vector<std::pair<const char*, int64_t>>{{"gate", 0}, {"up", 1}};
            const int64_t stride = down ? 1 : 2, n = R / stride;
            if (st.find(base + "_blocks")) {
                if (K % QK_MXFP4 != 0) fail("tensor '{}_blocks': {} input columns are not whole MXFP4 blocks", base, K);
                const auto& bq = need(st, base + "_blocks", {X, R, K / QK_MXFP4, 16}, used);
                const auto& sc = need(st, base + "_scales", {X, R, K / QK_MXFP4}, used);
                if (bq.info->type != DType::U8 || sc.info->type != DType::U8)
                    fail("tensors '{}_blocks' and '{}_scales' must be U8 (MXFP4 codes and E8M0 scales)", base, base);
                for (const auto& [which, first] : parts)
                    add_owned(w, DType::MXFP4, {K, n, X}, mxfp4_rows(bq, sc, X, R, K, first, stride, n),
                              bank_name(il, which, "weight"));
            } else {
                const auto& e = need(st, base, {X, K, R}, used);
                require_float(e);
                for (const auto& [which, first] : parts)
                    add_owned(w, e.info->type, {K, n, X}, float_rows(e, X, K, R, first, stride, n),
                              bank_name(il, which, "weight"));
            }
            const auto& bias = need(st, base + "_bias", {X, R}, used);
            require_float(bias);
            for (const auto& [which, first] : parts)
                add_owned(w, DType::F32, {n, X, 1}, bias_rows(bias, X, R, first, stride, n), bank_name(il, which, "bias"));
        }
    }
}

}  // namespace

extern const ArchDef kGptOss{"gpt-oss", {"gpt_oss"}, gguf_config, HfDefaults{.tie_embeddings = false},
                             hf_config, {}, tensors, build, gguf_write, nullptr, false, hf_load};

}  // namespace quern::arch
