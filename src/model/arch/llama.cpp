// The Llama family (Llama 1/2/3, Mistral, SmolLM): pre-norm decoder blocks of
// RMSNorm → GQA self-attention with RoPE → residual, RMSNorm → SwiGLU FFN →
// residual; final RMSNorm and an output projection (tied to the token
// embedding when output.weight is absent). Tensor names follow llama.cpp's GGUF
// convention (token_embd, blk.N.attn_q, ..., output_norm, output).
// The same blocks run Qwen2 (biases on the q/k/v projections:
// blk.N.attn_{q,k,v}.bias) and Qwen3 (RMSNorm of each query and key head
// before RoPE: blk.N.attn_{q,k}_norm.weight, head_dim floats), and Llama
// checkpoints with attention_bias (blk.N.attn_output.bias as well).
// Gemma 2 and Gemma 3 run the same loop with their differences switched on by
// the config (llama.cpp's build_gemma2 / build_gemma3; transformers'
// Gemma2DecoderLayer / Gemma3DecoderLayer): embeddings scaled by sqrt(n_embd),
// RMSNorm of the attention and FFN outputs before each residual add
// (blk.N.post_attention_norm, blk.N.post_ffw_norm), a GELU-tanh gated FFN,
// sliding-window attention with its own RoPE base on the local layers, the
// query scale query_pre_attn_scalar^-1/2, soft-capped attention scores and
// logits (Gemma 2) and per-head q/k RMSNorm (Gemma 3). Norm weights arrive
// with Gemma's (1 + w) already folded in (by llama.cpp's converter for GGUF
// files, by the Hugging Face loader for checkpoints).
// Phi-3 runs it too: its fused projections (blk.N.attn_qkv: q, k, v rows;
// blk.N.ffn_up: gate rows, then up rows) are bound as row-slice views, so the
// loop sees separate matrices. Mixture-of-experts layers (Mixtral, Qwen3-MoE:
// llama.cpp's build_moe_ffn with softmax gating; transformers'
// MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock) replace the FFN by a router
// (blk.N.ffn_gate_inp) and a bank of SwiGLU experts, stored as 3-D tensors
// (blk.N.ffn_{gate,up,down}_exps, one 2-D matrix per expert along ne[2]) or as
// one 2-D tensor per expert (blk.N.ffn_{gate,up,down}.E, older llama.cpp
// files and Hugging Face checkpoints); each expert is bound as a 2-D view.
#include <algorithm>
#include <cmath>
#include <deque>
#include <fmt/format.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/model.h"
#include "model/fp8_weights.h"
#include "model/moe.h"
#include "runtime/paged_kv.h"
#include "quant/traits.h"

namespace quern {

namespace {

struct Layer {
    const Tensor* attn_norm;
    const Tensor* wq;
    const Tensor* wk;
    const Tensor* wv;
    const Tensor* wo;
    const Tensor* ffn_norm;
    const Tensor* w_gate;
    const Tensor* w_up;
    const Tensor* w_down;
    // Present only when the config asks for them (null otherwise).
    const Tensor* bq = nullptr;
    const Tensor* bk = nullptr;
    const Tensor* bv = nullptr;
    const Tensor* bo = nullptr;
    const Tensor* q_norm = nullptr;
    const Tensor* k_norm = nullptr;
    const Tensor* post_attn_norm = nullptr;  // Gemma: RMSNorm of the attention output
    const Tensor* post_ffn_norm = nullptr;   // Gemma: RMSNorm of the FFN output
    // Mixture of experts: the router and each expert's matrices (w_gate/w_up/w_down null).
    const Tensor* gate_inp = nullptr;
    std::vector<const Tensor*> exp_gate, exp_up, exp_down;
};

/// y[r] += b for n rows of dim floats.
void add_bias(float* y, const Tensor* b, int64_t n, int64_t dim) {
    const float* bv = static_cast<const float*>(b->data);
    for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < dim; ++i) y[r * dim + i] += bv[i];
}

class LlamaModel final : public Model {
public:
    LlamaModel(const ModelConfig& cfg, WeightStore w) : Model(cfg, std::move(w)) { bind(); }

    void forward(const int32_t* tokens, int64_t n, KvCache& cache, float* logits, bool all_logits,
                 ThreadPool& pool) override;
    void forward_batch(const SeqBatch* seqs, int n_seqs, PagedKvPool& kv, ThreadPool& pool) override;

private:
    void bind();
    void ensure_scratch(int64_t nb);
    /// y = x · Wᵀ. With precise activations, x is split into its 8-bit
    /// quantization x8 and the residual x - x8 (quantized in turn), and both
    /// products are summed: activation error ~1/127² instead of ~1/127, for
    /// one extra activation row per row (free in memory-bound decode, twice
    /// the arithmetic in prefill). `same_input` reuses the split made by the
    /// previous call (Q/K/V and gate/up read the same activations).
    void mm(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool,
            bool same_input = false, cpu::MatmulPath path = cpu::MatmulPath::Auto);
    std::vector<float> kb_, vb_, lrows_, lout_;
    std::vector<cpu::PagedAttnSeq> attn_seqs_;
    std::vector<int32_t> toks_;

    /// The decoder blocks over nb rows of x_ (positions in pos_), shared by
    /// forward() and forward_batch():
    ///   mat(W, in, out, ld, same_input): out = in · Wᵀ for the nb rows;
    ///   attend(il): store layer il's new keys/values (kb_, vb_, after RoPE)
    ///     in the cache and write the attention of q_ into attn_;
    ///   after(il): called with the residual stream after layer il.
    template <class Mat, class Attend, class After>
    void run_layers(int64_t nb, Mat&& mat, Attend&& attend, After&& after);
    /// The mixture-of-experts FFN of layer L over nb rows of h (normed
    /// input; overwritten by the output): route every row, then for each
    /// expert with rows, gather them, run its SwiGLU FFN once for all of them
    /// and scatter the results; a row's output is the sum over its k slots
    /// (in slot order) of weight × expert output. Every row's arithmetic is
    /// independent of the others when `mat` is (MatmulPath::Gemm).
    template <class Mat>
    void moe_ffn(const Layer& L, int64_t nb, float* h, Mat& mat);
    std::vector<float> router_, selw_, xe_, ge_, ue_, ye_, eo_;
    std::vector<int32_t> sel_;
    std::vector<int64_t> moe_off_, moe_ent_;

    /// Rows [r0, r0 + rows) of matrix i2 of `t` (ne[2] index) as a 2-D view
    /// kept alive by the model.
    const Tensor* rows_view(const Tensor& t, int64_t i2, int64_t r0, int64_t rows, std::string name);
    std::deque<Tensor> views_;
    std::vector<float> xr_, yr_;
    DType xr_act_ = DType::F32;
    /// This pass rounds F8_E4M3_B32 products' activations to FP8
    /// (ModelOptions::fp8_activation_rows); set by run_layers.
    bool fp8_act_ = false;
    std::vector<float> xf8_;

    const Tensor* tok_embd_ = nullptr;
    const Tensor* out_norm_ = nullptr;
    const Tensor* output_ = nullptr;
    const Tensor* rope_freqs_ = nullptr;
    std::vector<Layer> layers_;

    int64_t scratch_rows_ = 0;
    std::vector<float> x_, h_, q_, attn_, gate_, up_;
    std::vector<int32_t> pos_;
    // LongRoPE: per row of the current call, 1 = the long factors (the row's
    // sequence reaches rope_orig_ctx within this call), 0 = the short ones.
    std::vector<uint8_t> rope_long_;

    static constexpr int64_t kBatch = 512;  // tokens per forward chunk
};

void LlamaModel::bind() {
    const auto& c = cfg_;
    const auto& mm = matmul_weight_types();
    const std::vector<DType> f32{DType::F32};
    tok_embd_ = &weights_.require("token_embd.weight", {c.n_embd, c.n_vocab}, mm);
    out_norm_ = &weights_.require("output_norm.weight", {c.n_embd}, f32);
    output_ = weights_.optional("output.weight", {c.n_embd, c.n_vocab}, mm);
    if (!output_) output_ = tok_embd_;  // tied embeddings
    rope_freqs_ = weights_.optional("rope_freqs.weight", {c.rope_dim / 2}, f32);
    layers_.resize(static_cast<size_t>(c.n_layer));
    for (int64_t i = 0; i < c.n_layer; ++i) {
        auto n = [&](const char* s) { return fmt::format("blk.{}.{}.weight", i, s); };
        Layer& L = layers_[static_cast<size_t>(i)];
        L.attn_norm = &weights_.require(n("attn_norm"), {c.n_embd}, f32);
        if (c.fused_qkv) {
            const Tensor& qkv = weights_.require(n("attn_qkv"), {c.n_embd, c.q_dim() + 2 * c.kv_dim()}, mm);
            L.wq = rows_view(qkv, 0, 0, c.q_dim(), n("attn_qkv") + "[q]");
            L.wk = rows_view(qkv, 0, c.q_dim(), c.kv_dim(), n("attn_qkv") + "[k]");
            L.wv = rows_view(qkv, 0, c.q_dim() + c.kv_dim(), c.kv_dim(), n("attn_qkv") + "[v]");
        } else {
            L.wq = &weights_.require(n("attn_q"), {c.n_embd, c.q_dim()}, mm);
            L.wk = &weights_.require(n("attn_k"), {c.n_embd, c.kv_dim()}, mm);
            L.wv = &weights_.require(n("attn_v"), {c.n_embd, c.kv_dim()}, mm);
        }
        L.wo = &weights_.require(n("attn_output"), {c.q_dim(), c.n_embd}, mm);
        L.ffn_norm = &weights_.require(n("ffn_norm"), {c.n_embd}, f32);
        if (c.moe()) {
            const int64_t X = c.n_expert, F = c.n_ff_exp;
            L.gate_inp = &weights_.require(n("ffn_gate_inp"), {c.n_embd, X}, mm);
            if (const Tensor* g3 = weights_.optional(n("ffn_gate_exps"), {c.n_embd, F, X}, mm)) {
                const Tensor& u3 = weights_.require(n("ffn_up_exps"), {c.n_embd, F, X}, mm);
                const Tensor& d3 = weights_.require(n("ffn_down_exps"), {F, c.n_embd, X}, mm);
                for (int64_t e = 0; e < X; ++e) {
                    L.exp_gate.push_back(rows_view(*g3, e, 0, F, fmt::format("{}[{}]", g3->name, e)));
                    L.exp_up.push_back(rows_view(u3, e, 0, F, fmt::format("{}[{}]", u3.name, e)));
                    L.exp_down.push_back(rows_view(d3, e, 0, c.n_embd, fmt::format("{}[{}]", d3.name, e)));
                }
            } else {
                auto ex = [&](const char* s, int64_t e) { return fmt::format("blk.{}.{}.{}.weight", i, s, e); };
                for (int64_t e = 0; e < X; ++e) {
                    L.exp_gate.push_back(&weights_.require(ex("ffn_gate", e), {c.n_embd, F}, mm));
                    L.exp_up.push_back(&weights_.require(ex("ffn_up", e), {c.n_embd, F}, mm));
                    L.exp_down.push_back(&weights_.require(ex("ffn_down", e), {F, c.n_embd}, mm));
                }
            }
        } else if (c.fused_gate_up) {
            const Tensor& gu = weights_.require(n("ffn_up"), {c.n_embd, 2 * c.n_ff}, mm);
            L.w_gate = rows_view(gu, 0, 0, c.n_ff, n("ffn_up") + "[gate]");
            L.w_up = rows_view(gu, 0, c.n_ff, c.n_ff, n("ffn_up") + "[up]");
            L.w_down = &weights_.require(n("ffn_down"), {c.n_ff, c.n_embd}, mm);
        } else {
            L.w_gate = &weights_.require(n("ffn_gate"), {c.n_embd, c.n_ff}, mm);
            L.w_up = &weights_.require(n("ffn_up"), {c.n_embd, c.n_ff}, mm);
            L.w_down = &weights_.require(n("ffn_down"), {c.n_ff, c.n_embd}, mm);
        }
        auto bias = [&](const char* s, int64_t dim) {
            return &weights_.require(fmt::format("blk.{}.{}.bias", i, s), {dim}, f32);
        };
        if (c.qkv_bias) {
            L.bq = bias("attn_q", c.q_dim());
            L.bk = bias("attn_k", c.kv_dim());
            L.bv = bias("attn_v", c.kv_dim());
        }
        if (c.out_bias) L.bo = bias("attn_output", c.n_embd);
        if (c.qk_norm) {
            L.q_norm = &weights_.require(n("attn_q_norm"), {c.head_dim}, f32);
            L.k_norm = &weights_.require(n("attn_k_norm"), {c.head_dim}, f32);
        }
        if (c.post_norms) {
            L.post_attn_norm = &weights_.require(n("post_attention_norm"), {c.n_embd}, f32);
            L.post_ffn_norm = &weights_.require(n("post_ffw_norm"), {c.n_embd}, f32);
        }
    }
}

const Tensor* LlamaModel::rows_view(const Tensor& t, int64_t i2, int64_t r0, int64_t rows, std::string name) {
    Tensor v = t;
    v.name = std::move(name);
    v.data = static_cast<uint8_t*>(t.data) + static_cast<size_t>(i2) * t.nb[2] + static_cast<size_t>(r0) * t.nb[1];
    v.ne = {t.ne[0], rows, 1, 1};
    v.nb[2] = v.nb[1] * static_cast<size_t>(rows);
    v.nb[3] = v.nb[2];
    views_.push_back(std::move(v));
    return &views_.back();
}

template <class Mat>
void LlamaModel::moe_ffn(const Layer& L, int64_t nb, float* h, Mat& mat) {
    const auto& c = cfg_;
    const int64_t X = c.n_expert, k = c.n_expert_used, E = c.n_embd, F = c.n_ff_exp;
    const auto sz = [](int64_t v) { return static_cast<size_t>(v); };
    router_.resize(sz(nb * X));
    mat(*L.gate_inp, h, nb, router_.data(), X, false);
    sel_.resize(sz(nb * k));
    selw_.resize(sz(nb * k));
    moe_route(router_.data(), nb, X, k, c.expert_weights_norm, sel_.data(), selw_.data());
    moe_group(sel_.data(), nb, k, X, moe_off_, moe_ent_);
    eo_.resize(sz(nb * k * E));
    xe_.resize(sz(nb * E));
    ye_.resize(sz(nb * E));
    ge_.resize(sz(nb * F));
    ue_.resize(sz(nb * F));
    for (int64_t x = 0; x < X; ++x) {
        const int64_t b = moe_off_[sz(x)], cnt = moe_off_[sz(x + 1)] - b;
        if (cnt == 0) continue;
        for (int64_t j = 0; j < cnt; ++j) {
            const int64_t row = moe_ent_[sz(b + j)] / k;
            std::copy_n(h + row * E, E, xe_.data() + j * E);
        }
        mat(*L.exp_gate[sz(x)], xe_.data(), cnt, ge_.data(), F, false);
        mat(*L.exp_up[sz(x)], xe_.data(), cnt, ue_.data(), F, true);
        cpu::swiglu(ge_.data(), ue_.data(), ge_.data(), cnt * F);
        mat(*L.exp_down[sz(x)], ge_.data(), cnt, ye_.data(), E, false);
        for (int64_t j = 0; j < cnt; ++j) std::copy_n(ye_.data() + j * E, E, eo_.data() + moe_ent_[sz(b + j)] * E);
    }
    for (int64_t r = 0; r < nb; ++r) {
        float* out = h + r * E;
        for (int64_t slot = 0; slot < k; ++slot) {
            const float w = selw_[sz(r * k + slot)];
            const float* y = eo_.data() + (r * k + slot) * E;
            if (slot == 0)
                for (int64_t i = 0; i < E; ++i) out[i] = w * y[i];
            else
                for (int64_t i = 0; i < E; ++i) out[i] += w * y[i];
        }
    }
}

void LlamaModel::ensure_scratch(int64_t nb) {
    if (nb <= scratch_rows_) return;
    const auto& c = cfg_;
    const auto sz = [nb](int64_t d) { return static_cast<size_t>(nb * d); };
    x_.resize(sz(c.n_embd));
    h_.resize(sz(c.n_embd));
    q_.resize(sz(c.q_dim()));
    attn_.resize(sz(c.q_dim()));
    gate_.resize(sz(c.moe() ? 0 : c.n_ff));  // expert layers use their own buffers (moe_ffn)
    up_.resize(sz(c.moe() ? 0 : c.n_ff));
    pos_.resize(static_cast<size_t>(nb));
    scratch_rows_ = nb;
}

void LlamaModel::mm(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool,
                    bool same_input, cpu::MatmulPath path) {
    const DType act = quant_traits(W.type).vec_dot_type;
    if (fp8_act_ && W.type == DType::F8_E4M3_B32) {
        const int64_t K = W.ne[0];
        xf8_.resize(static_cast<size_t>(n * K));
        pool.parallel_for(n, 1, [&](int64_t r0, int64_t r1, int) {
            round_fp8_activation_rows(x + r0 * K, r1 - r0, K, xf8_.data() + r0 * K);
        });
        return cpu::matmul(W, xf8_.data(), n, y, ldy, pool, path);
    }
    if (!opts_.precise_activations || act == DType::F32) return cpu::matmul(W, x, n, y, ldy, pool, path);
    const int64_t K = W.ne[0], M = W.ne[1];
    // The split and the sum are row by row; over the pool when there is
    // enough of them to pay for a parallel region.
    const auto rows = [&](int64_t width, auto&& fn) {
        const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(width, 1));
        pool.parallel_for(n, grain, [&](int64_t r0, int64_t r1, int) {
            for (int64_t i = r0; i < r1; ++i) fn(i);
        });
    };
    if (!same_input || xr_act_ != act || xr_.size() != static_cast<size_t>(2 * n * K)) {
        xr_.resize(static_cast<size_t>(2 * n * K));
        const size_t qb = row_size(act, K);
        std::copy(x, x + n * K, xr_.begin());
        rows(K, [&](int64_t i) {
            thread_local std::vector<uint8_t> q;
            q.resize(qb);
            cpu::quantize_act_with_residual(act, x + i * K, K, q.data(), xr_.data() + (n + i) * K);
        });
        xr_act_ = act;
    }
    yr_.resize(static_cast<size_t>(2 * n * M));
    cpu::matmul(W, xr_.data(), 2 * n, yr_.data(), M, pool, path);
    rows(M, [&](int64_t i) {
        const float* a = yr_.data() + i * M;
        const float* b = yr_.data() + (n + i) * M;
        for (int64_t j = 0; j < M; ++j) y[i * ldy + j] = a[j] + b[j];
    });
}

template <class Mat, class Attend, class After>
void LlamaModel::run_layers(int64_t nb, Mat&& mat, Attend&& attend, After&& after) {
    fp8_act_ = opts_.fp8_activation_rows > 0 && nb >= opts_.fp8_activation_rows;
    const auto& c = cfg_;
    const int64_t kvd = c.kv_dim();
    const float* ff = rope_freqs_ ? static_cast<const float*>(rope_freqs_->data) : nullptr;
    kb_.resize(static_cast<size_t>(nb * kvd));
    vb_.resize(static_cast<size_t>(nb * kvd));
    float* x = x_.data();
    float* h = h_.data();
    for (int64_t il = 0; il < c.n_layer; ++il) {
        const Layer& L = layers_[static_cast<size_t>(il)];
        cpu::rms_norm(x, static_cast<const float*>(L.attn_norm->data), h, nb, c.n_embd, c.rms_eps);
        mat(*L.wq, h, nb, q_.data(), c.q_dim(), false);
        mat(*L.wk, h, nb, kb_.data(), kvd, true);
        mat(*L.wv, h, nb, vb_.data(), kvd, true);
        if (L.bq) {
            add_bias(q_.data(), L.bq, nb, c.q_dim());
            add_bias(kb_.data(), L.bk, nb, kvd);
            add_bias(vb_.data(), L.bv, nb, kvd);
        }
        if (L.q_norm) {
            cpu::rms_norm(q_.data(), static_cast<const float*>(L.q_norm->data), q_.data(), nb * c.n_head, c.head_dim,
                          c.rms_eps);
            cpu::rms_norm(kb_.data(), static_cast<const float*>(L.k_norm->data), kb_.data(), nb * c.n_head_kv,
                          c.head_dim, c.rms_eps);
        }
        // Local (sliding-window) layers may turn at their own base, unscaled.
        const bool local = c.window(il) > 0;
        const float base = local && c.rope_base_local > 0.0f ? c.rope_base_local : c.rope_base;
        const float* lff = local && c.rope_factors_global_only ? nullptr : ff;
        // Rows in runs of one factor set (LongRoPE picks short or long per sequence).
        for (int64_t r0 = 0; r0 < nb;) {
            int64_t r1 = r0 + 1;
            const float* rff = lff;
            if (c.longrope()) {
                const uint8_t lg = rope_long_[static_cast<size_t>(r0)];
                while (r1 < nb && rope_long_[static_cast<size_t>(r1)] == lg) ++r1;
                rff = (lg ? c.rope_factors_long : c.rope_factors_short).data();
            } else {
                r1 = nb;
            }
            cpu::rope(q_.data() + r0 * c.q_dim(), pos_.data() + r0, r1 - r0, static_cast<int>(c.n_head),
                      static_cast<int>(c.head_dim), static_cast<int>(c.rope_dim), base, c.rope_neox, rff);
            cpu::rope(kb_.data() + r0 * kvd, pos_.data() + r0, r1 - r0, static_cast<int>(c.n_head_kv),
                      static_cast<int>(c.head_dim), static_cast<int>(c.rope_dim), base, c.rope_neox, rff);
            r0 = r1;
        }
        attend(il);
        mat(*L.wo, attn_.data(), nb, h, c.n_embd, false);
        if (L.bo) add_bias(h, L.bo, nb, c.n_embd);
        if (L.post_attn_norm)
            cpu::rms_norm(h, static_cast<const float*>(L.post_attn_norm->data), h, nb, c.n_embd, c.rms_eps);
        cpu::add_inplace(x, h, nb * c.n_embd);

        cpu::rms_norm(x, static_cast<const float*>(L.ffn_norm->data), h, nb, c.n_embd, c.rms_eps);
        if (L.gate_inp) {
            moe_ffn(L, nb, h, mat);
        } else {
            mat(*L.w_gate, h, nb, gate_.data(), c.n_ff, false);
            mat(*L.w_up, h, nb, up_.data(), c.n_ff, true);
            if (c.gelu_ffn) cpu::geglu_tanh(gate_.data(), up_.data(), gate_.data(), nb * c.n_ff);
            else cpu::swiglu(gate_.data(), up_.data(), gate_.data(), nb * c.n_ff);
            mat(*L.w_down, gate_.data(), nb, h, c.n_embd, false);
        }
        if (L.post_ffn_norm)
            cpu::rms_norm(h, static_cast<const float*>(L.post_ffn_norm->data), h, nb, c.n_embd, c.rms_eps);
        cpu::add_inplace(x, h, nb * c.n_embd);
        after(il);
    }
}

void LlamaModel::forward(const int32_t* tokens, int64_t n, KvCache& cache, float* logits, bool all_logits,
                         ThreadPool& pool) {
    const auto& c = cfg_;
    if (n <= 0) return;
    if (cache.kv_dim() != c.kv_dim()) fail("KV cache row size {} does not match the model ({})", cache.kv_dim(), c.kv_dim());
    if (cache.size() + n > cache.n_ctx())
        fail("context is full: {} tokens in the cache + {} new > context size {} (raise -c)", cache.size(), n,
             cache.n_ctx());
    for (int64_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= c.n_vocab)
            fail("token id {} is outside the vocabulary [0, {})", tokens[i], c.n_vocab);

    const float scale = c.qk_scale();
    const int64_t kvd = c.kv_dim();
    const int64_t last_pos = cache.size() + n - 1;

    for (int64_t b0 = 0; b0 < n; b0 += kBatch) {
        const int64_t nb = std::min(kBatch, n - b0);
        ensure_scratch(nb);
        const int64_t p0 = cache.size();
        for (int64_t i = 0; i < nb; ++i) pos_[static_cast<size_t>(i)] = static_cast<int32_t>(p0 + i);
        // LongRoPE decides once per call, from the call's last position.
        rope_long_.assign(static_cast<size_t>(nb), c.longrope() && last_pos >= c.rope_orig_ctx ? 1 : 0);
        float* x = x_.data();
        float* h = h_.data();
        cpu::get_rows(*tok_embd_, tokens + b0, nb, x);
        if (c.embd_scale > 0.0f) cpu::scale(x, nb * c.n_embd, c.embd_scale);
        run_layers(
            nb,
            [&](const Tensor& W, const float* in, int64_t rows, float* out, int64_t ld, bool same) {
                mm(W, in, rows, out, ld, pool, same);
            },
            [&](int64_t il) {
                std::copy_n(kb_.data(), nb * kvd, cache.k(il, p0));
                std::copy_n(vb_.data(), nb * kvd, cache.v(il, p0));
                cpu::attention(q_.data(), cache.k(il), cache.v(il), kvd, pos_.data(), nb, static_cast<int>(c.n_head),
                               static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim), scale, attn_.data(),
                               pool, c.window(il), c.attn_softcap);
            },
            [&](int64_t il) {
                if (trace_ && b0 + nb == n) trace_(fmt::format("blk.{}", il), x + (nb - 1) * c.n_embd, c.n_embd);
            });
        cache.set_size(p0 + nb);

        const float* onw = static_cast<const float*>(out_norm_->data);
        if (all_logits) {
            cpu::rms_norm(x, onw, h, nb, c.n_embd, c.rms_eps);
            mm(*output_, h, nb, logits + b0 * c.n_vocab, c.n_vocab, pool);
            if (c.final_softcap > 0.0f) cpu::softcap(logits + b0 * c.n_vocab, nb * c.n_vocab, c.final_softcap);
        } else if (b0 + nb == n) {
            cpu::rms_norm(x + (nb - 1) * c.n_embd, onw, h, 1, c.n_embd, c.rms_eps);
            mm(*output_, h, 1, logits, c.n_vocab, pool);
            if (c.final_softcap > 0.0f) cpu::softcap(logits, c.n_vocab, c.final_softcap);
        }
        if (trace_ && b0 + nb == n)
            trace_("logits", all_logits ? logits + (n - 1) * c.n_vocab : logits, c.n_vocab);
    }
}

void LlamaModel::forward_batch(const SeqBatch* seqs, int n_seqs, PagedKvPool& kv, ThreadPool& pool) {
    const auto& c = cfg_;
    if (n_seqs <= 0) return;
    if (kv.kv_dim() != c.kv_dim() || kv.n_layer() != c.n_layer)
        fail("paged KV cache shape ({} layers × {}) does not match the model ({} × {})", kv.n_layer(), kv.kv_dim(),
             c.n_layer, c.kv_dim());
    // Validate everything before evaluating anything.
    int64_t T = 0;
    for (int s = 0; s < n_seqs; ++s) {
        const SeqBatch& b = seqs[s];
        if (b.n <= 0 || !b.tokens || !b.block_table || b.n_past < 0) fail("forward_batch: entry {} is empty", s);
        for (int64_t i = 0; i < b.n; ++i)
            if (b.tokens[i] < 0 || b.tokens[i] >= c.n_vocab)
                fail("token id {} is outside the vocabulary [0, {})", b.tokens[i], c.n_vocab);
        T += b.n;
    }
    ensure_scratch(T);
    const int64_t kvd = c.kv_dim(), qd = c.q_dim();
    toks_.resize(static_cast<size_t>(T));
    {
        int64_t r = 0;
        for (int s = 0; s < n_seqs; ++s)
            for (int64_t i = 0; i < seqs[s].n; ++i, ++r) {
                toks_[static_cast<size_t>(r)] = seqs[s].tokens[i];
                pos_[static_cast<size_t>(r)] = static_cast<int32_t>(seqs[s].n_past + i);
            }
        // LongRoPE: per sequence, from its last position in this call.
        rope_long_.resize(static_cast<size_t>(T));
        r = 0;
        for (int s = 0; s < n_seqs; ++s) {
            const bool lg = c.longrope() && seqs[s].n_past + seqs[s].n - 1 >= c.rope_orig_ctx;
            for (int64_t i = 0; i < seqs[s].n; ++i, ++r) rope_long_[static_cast<size_t>(r)] = lg ? 1 : 0;
        }
    }
    const float scale = c.qk_scale();
    float* x = x_.data();
    cpu::get_rows(*tok_embd_, toks_.data(), T, x);
    if (c.embd_scale > 0.0f) cpu::scale(x, T * c.n_embd, c.embd_scale);
    // Every row, generated token or prompt token, through the GEMM family
    // (cpu::MatmulPath::Gemm), whose kernels compute each row alike whatever
    // the batch: a token's keys, values and logits depend only on its sequence.
    run_layers(
        T,
        [&](const Tensor& W, const float* in, int64_t rows, float* out, int64_t ld, bool same) {
            mm(W, in, rows, out, ld, pool, same, cpu::MatmulPath::Gemm);
        },
        [&](int64_t il) {
            attn_seqs_.clear();
            int64_t r = 0;
            for (int s = 0; s < n_seqs; ++s) {
                const SeqBatch& b = seqs[s];
                for (int64_t i = 0; i < b.n; ++i) {
                    std::copy_n(kb_.data() + (r + i) * kvd, kvd, kv.k_row(il, b.block_table, b.n_past + i));
                    std::copy_n(vb_.data() + (r + i) * kvd, kvd, kv.v_row(il, b.block_table, b.n_past + i));
                }
                attn_seqs_.push_back(cpu::PagedAttnSeq{q_.data() + r * qd, kv.view(il, b.block_table),
                                                       pos_.data() + r, b.n, attn_.data() + r * qd});
                r += b.n;
            }
            // One parallel region for every sequence's rows.
            cpu::attention_paged_batch(attn_seqs_.data(), n_seqs, static_cast<int>(c.n_head),
                                       static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim), scale, pool,
                                       c.window(il), c.attn_softcap);
        },
        [](int64_t) {});
    // Logits of the last row of every entry that asks for them.
    std::vector<int> want;
    {
        int64_t r = 0;
        for (int s = 0; s < n_seqs; ++s) {
            r += seqs[s].n;
            if (seqs[s].logits) want.push_back(static_cast<int>(r - 1));
        }
    }
    if (want.empty()) return;
    const int64_t m = static_cast<int64_t>(want.size());
    lrows_.resize(static_cast<size_t>(m * c.n_embd));
    for (int64_t i = 0; i < m; ++i)
        cpu::rms_norm(x + want[static_cast<size_t>(i)] * c.n_embd, static_cast<const float*>(out_norm_->data),
                      lrows_.data() + i * c.n_embd, 1, c.n_embd, c.rms_eps);
    lout_.resize(static_cast<size_t>(m * c.n_vocab));
    mm(*output_, lrows_.data(), m, lout_.data(), c.n_vocab, pool, false, cpu::MatmulPath::Gemm);
    if (c.final_softcap > 0.0f) cpu::softcap(lout_.data(), m * c.n_vocab, c.final_softcap);
    int64_t i = 0;
    for (int s = 0; s < n_seqs; ++s)
        if (seqs[s].logits) {
            std::copy(lout_.begin() + i * c.n_vocab, lout_.begin() + (i + 1) * c.n_vocab, seqs[s].logits);
            ++i;
        }
}

}  // namespace

std::unique_ptr<Model> make_llama(const ModelConfig& cfg, WeightStore w) {
    return std::make_unique<LlamaModel>(cfg, std::move(w));
}

}  // namespace quern
