// Prompts (eval with n >= kPrefillMinTokens, session.h) take the batched
// prefill path instead where the model allows it (prefill_supported_): the
// positions are processed prefill_chunk at a time, each chunk through every
// layer at once with matrix-matrix products (PrefillGemm, gemm.h: weights
// dequantized to BF16, cuBLASLt on the tensor cores) and the row-batched
// kernels of ops.h ("prefill"):
//
//   X[r] = token_embd[tokens[pos0 + r]] (· embd_scale)   get_rows
//   per layer:
//     XN = RMSNorm(X (+= HRES), attn_norm) in BF16        rms_norm_bf16, n rows
//     QKV = XN · W_qkvᵀ                                   PrefillGemm per piece
//     bias, q/k norm, RoPE; K, V -> cache rows pos0..     prefill_rope_kv_store
//     A = causal attention(Q, cache[0 .. pos0 + r])       prefill_attention (tensor cores: ops_flash.cu)
//     H = A · W_oᵀ (HRES = RMSNorm(H, post_attn_norm))    PrefillGemm (+ rms_norm_q8_1)
//     XN = RMSNorm(X += HRES, ffn_norm) in BF16           rms_norm_bf16
//     GU = XN · W_gate_upᵀ; F = SiLU|GELU(G) · U in BF16  PrefillGemm, glu_rows_bf16
//                                  (passes of <= 32 rows on bq layouts: bq_gemm_glu, one launch;
//                                  of <= 16 on the resident layout: qw_gemm_glu)
//     H = F · W_downᵀ (HRES = RMSNorm(H, post_ffn_norm))
//   last chunk, last row only: RMSNorm(x += h, output_norm), logits = W_out · xq
//   with the decode step's GEMV (and soft-capping).
// The KV cache then holds what the token-by-token path would have written
// (up to rounding: BF16 GEMM inputs instead of the Q8_1 activations of the
// GEMVs), so decoding continues from it with the captured step.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/executor.h"
#include "backend/cuda/qw_gemm.h"
#include "backend/cuda/tuning.h"
#include "core/error.h"
#include <vector>

#include "backend/cpu/moe_route.h"

namespace quern::cuda {

bool CudaExecutor::use_prefill(int64_t n) const { return prefill_supported_ && n >= kPrefillMinTokens; }

bool CudaExecutor::ensure_prefill_scratch() {
    if (gemm_) return true;
    try {
        const auto& c = plan_;
        // (65535: the prefill kernels' grid.y limit on rows.)
        // Tuning::prefill_chunk overrides the rows per chunk (for measuring).
        int64_t chunk = opt_.prefill_chunk;
        if (tuning().prefill_chunk > 0) chunk = tuning().prefill_chunk;
        // A batch runner's passes hold many sequences: its own (unused) cache
        // does not bound them.
        const int64_t R = std::min<int64_t>({chunk, batch_runner_ ? chunk : n_ctx_, 65535});
        const auto fb = [&](int64_t cols) { return DeviceBuffer(static_cast<size_t>(R * cols) * sizeof(float)); };
        px_ = fb(c.n_embd);
        ph_ = fb(c.n_embd);
        if (c.post_norms) phpost_ = fb(c.n_embd);
        const DeltaNetSpec* d = c.delta;
        pqkv_ = fb(std::max(c.q_dim() + 2 * c.kv_dim(), d ? d->conv_dim() : 0));
        pattn_ = fb(c.q_dim());
        pgu_ = fb(2 * std::max(c.n_ff, c.n_ff_shexp));
        if (d) {
            pxc_ = fb(d->conv_dim());
            pzy_ = fb(2 * d->value_dim());
            py_ = fb(d->value_dim());
            pba_ = fb(2 * d->n_v_heads);
        }
        if (c.gates) pga_ = fb(2 * c.q_dim());
        phout_ = fb(c.n_embd);
        if (c.draft()) {
            phin_ = fb(c.n_embd);
            phin_.fill_bytes(0, ctx_.stream());
        }
        if (c.n_ff_shexp > 0) {
            psh_g_ = DeviceBuffer(static_cast<size_t>(R * c.n_ff_shexp) * 2);
            psh_y_ = fb(c.n_embd);
        }
        if (c.moe) {
            const int64_t m = R * c.n_expert_used + 16;
            pmoe_logits_ = fb(c.n_expert);
            pmoe_xg_ = DeviceBuffer(static_cast<size_t>(m * c.n_embd) * 2);
            pmoe_gu_ = DeviceBuffer(static_cast<size_t>(m * 2 * c.n_ff_exp) * sizeof(float));
            pmoe_g_ = DeviceBuffer(static_cast<size_t>(m * c.n_ff_exp) * 2);
            pmoe_y_ = DeviceBuffer(static_cast<size_t>(m * c.n_embd) * sizeof(float));
            pmoe_route_ = DeviceBuffer(static_cast<size_t>(4 * m + c.n_expert + 1) * 4);
            // Rows past a chunk's own are read by the padded expert GEMMs
            // (their outputs are never used): zeros rather than whatever
            // the allocation held.
            pmoe_xg_.fill_bytes(0, ctx_.stream());
            pmoe_g_.fill_bytes(0, ctx_.stream());
            hmoe_logits_ = PinnedBuffer(static_cast<size_t>(R * c.n_expert) * sizeof(float));
            hmoe_route_ = PinnedBuffer(static_cast<size_t>(3 * m) * 4);
        }
        // Weight tiles big enough for a whole layer matrix up to 64·2^20
        // elements (two tiles of 128 MB at most): one GEMM per matrix rather
        // than one per 16·2^20-element tile (H200, llama3-8b Q4_K_M pp512:
        // 19.6k tok/s with 16·2^20, 21.9k with 64·2^20).
        // Tuning::prefill_tile: tiles of M·2^20 elements (for measuring).
        const int64_t VD = d ? d->value_dim() : 0;
        const int64_t max_k = std::max({c.n_embd * (c.draft() ? 2 : 1), c.q_dim(), c.n_ff, c.n_ff_exp, c.n_ff_shexp, VD});
        const int64_t max_rows = std::max(
            {c.q_dim() + 2 * c.kv_dim(), c.n_embd, c.n_ff, c.n_ff_exp, c.n_ff_shexp, d ? d->conv_dim() : 0});
        int64_t tile = std::min(int64_t{64} << 20, (max_rows + 255) / 256 * 256 * max_k);
        if (tuning().prefill_tile > 0) tile = tuning().prefill_tile << 20;
        gemm_ = std::make_unique<PrefillGemm>(R, max_k, std::max(tile, max_k));
        if (profile_) gemm_->set_phase_hook([this](const char* phase) { mark(phase); });
        gemm_->set_verbose(opt_.verbose);
        prefill_rows_ = R;
    } catch (const Error& e) {
        // Out of device memory (e.g. --gpu-mem gave it all to the KV cache):
        // prompts go token by token, as before.
        cudaGetLastError();
        gemm_.reset();
        px_ = DeviceBuffer(), ph_ = DeviceBuffer(), phpost_ = DeviceBuffer();
        pqkv_ = DeviceBuffer(), pattn_ = DeviceBuffer(), pgu_ = DeviceBuffer();
        phin_ = DeviceBuffer(), phout_ = DeviceBuffer();
        pxc_ = DeviceBuffer(), pzy_ = DeviceBuffer(), py_ = DeviceBuffer(), pba_ = DeviceBuffer();
        pga_ = DeviceBuffer(), psh_g_ = DeviceBuffer(), psh_y_ = DeviceBuffer();
        pmoe_logits_ = DeviceBuffer(), pmoe_xg_ = DeviceBuffer(), pmoe_gu_ = DeviceBuffer(), pmoe_g_ = DeviceBuffer();
        pmoe_y_ = DeviceBuffer(), pmoe_route_ = DeviceBuffer();
        hmoe_logits_ = PinnedBuffer(), hmoe_route_ = PinnedBuffer();
        prefill_supported_ = false;
        if (opt_.verbose)
            std::fprintf(stderr, "quern: no GPU memory for the batched prefill (%s); prompts run token by token\n",
                         e.what());
        return false;
    }
    return true;
}

AttentionExtras CudaExecutor::attention_extras(const LayerWeights& L, const BlockPlanLayer& P) const {
    const auto& c = plan_;
    AttentionExtras ex;
    if (L.qkv_bias) {
        ex.q_bias = L.qkv_bias;
        ex.k_bias = L.qkv_bias + c.q_dim();
        ex.v_bias = L.qkv_bias + c.q_dim() + c.kv_dim();
    }
    ex.q_norm = L.q_norm;
    ex.k_norm = L.k_norm;
    ex.norm_eps = P.attn->norm_eps;
    return ex;
}

void CudaExecutor::prefill_chunk(int64_t pos0, int64_t n, bool head, const RowsOut* out) {
    if (plan_.hybrid()) {  // the lone sequence's DeltaSeqs, with this chunk's rows
        const auto rows = static_cast<int32_t>(n);
        QUERN_CUDA_CHECK(cudaMemcpyAsync(dlone_.as<int32_t>() + 2, &rows, 4, cudaMemcpyHostToDevice, ctx_.stream()));
        rows_delta_ = rows_snap_ ? lone_snap_delta_.data() : lone_rows_delta_.data();
    }
    layer_rows(tokens_.as<int32_t>() + pos0, n, pos0, nullptr);
    const auto& c = plan_;
    const cudaStream_t s = ctx_.stream();
    const int64_t E = c.n_embd;
    float* X = px_.as<float>();
    const float* HRES = c.post_norms ? phpost_.as<float>() : ph_.as<float>();
    if (out && (out->hidden || out->logits)) {
        rows_outputs(n, out->hidden, out->logits, out->logits ? 0 : head ? n - 1 : n);
        mark("head");
    } else if (head) {  // the last row only, through the decode step's output GEMV
        float* xl = X + (n - 1) * E;
        const float* hl = HRES + (n - 1) * E;
        rms_norm_q8_1(xl, hl, out_norm_, xn_.as<float>(), xq_embd_.q(), xq_embd_.info(), 1, E, c.rms_eps, s,
                      xq_embd_.q2(), xq_embd_.info2());
        mm(output_, xn_.as<float>(), xq_embd_, logits_.as<float>());
        if (c.logit_scale != 1.0f || c.final_softcap > 0.0f)
            scale_softcap(logits_.as<float>(), c.n_vocab, c.logit_scale, c.final_softcap, s);
        mark("head");
    }
    if (profile_) {
        collect_profile(prof_prefill_);
        prof_prefill_.rows += n;
    }
}

void CudaExecutor::rows_outputs(int64_t n, float* hidden, float* logits, int64_t from) {
    const auto& c = plan_;
    const cudaStream_t s = ctx_.stream();
    const int64_t E = c.n_embd, V = c.n_vocab;
    const float* HRES = c.post_norms ? phpost_.as<float>() : ph_.as<float>();
    float* HN = phout_.as<float>();
    rms_norm_q8_1(px_.as<float>(), HRES, out_norm_, HN, nullptr, nullptr, n, E, c.rms_eps, s);
    if (hidden)
        QUERN_CUDA_CHECK(cudaMemcpyAsync(hidden, HN, static_cast<size_t>(n * E) * sizeof(float), cudaMemcpyDeviceToHost, s));
    // Each row through the decode step's output GEMV (its quantized
    // activation and rounding): a verification row's logits are computed as
    // the step that would otherwise have produced them.
    for (int64_t r = from; r < n; ++r) {
        quantize_activation(ctx_, HN + r * E, xq_embd_);
        mm(output_, HN + r * E, xq_embd_, logits_.as<float>());
        if (c.logit_scale != 1.0f || c.final_softcap > 0.0f)
            scale_softcap(logits_.as<float>(), V, c.logit_scale, c.final_softcap, s);
        if (logits)
            QUERN_CUDA_CHECK(cudaMemcpyAsync(logits + r * V, logits_.data(), static_cast<size_t>(V) * sizeof(float),
                                             cudaMemcpyDeviceToHost, s));
    }
}

void CudaExecutor::eval_rows(const SeqBatch& q) {
    if (!prefill_supported_ || !ensure_prefill_scratch())
        fail("this model has no batched GPU path (a weight type without a GPU GEMM, or no GPU memory for its scratch), "
             "which per-row logits, hidden rows and draft heads take; use --device cpu");
    const auto& c = plan_;
    if (c.draft() && !q.hidden_in) fail("forward: a draft head's pass needs the model's hidden rows (SeqBatch::hidden_in)");
    if (!c.draft() && q.hidden_in) fail("forward: this program reads no given rows");
    const int64_t E = c.n_embd, V = c.n_vocab, n = q.n;
    // A sequence that hands out hidden rows or reads them is speculating:
    // verification passes of a few rows every few tokens, a draft head's
    // passes of one row every token. Their matrices' bq layouts make such a
    // pass cost about a decode step rather than a dequantization of every
    // matrix (memory permitting); made on its first pass (the prompt's).
    if (q.all_logits || q.hidden || c.draft()) make_small_layouts();
    snap_n_ = 0;
    if (q.row_states && c.hybrid()) {
        if (n > kMaxRowStateRows || n > prefill_rows_)
            fail("forward: a pass keeping its rows' recurrent states takes at most {} rows (got {})", kMaxRowStateRows, n);
        ensure_row_states(n - 1);
        snap_pos_ = n_past_;
        snap_n_ = n;
    }
    rows_snap_ = snap_n_ > 0;
    fed_ = false;
    begin(q.tokens, n);
    for (int64_t c0 = 0; c0 < n; c0 += prefill_rows_) {
        const int64_t m = std::min(prefill_rows_, n - c0);
        if (q.hidden_in)
            QUERN_CUDA_CHECK(cudaMemcpyAsync(phin_.data(), q.hidden_in + c0 * E, static_cast<size_t>(m * E) * sizeof(float),
                                             cudaMemcpyHostToDevice, ctx_.stream()));
        RowsOut out;
        out.hidden = q.hidden ? q.hidden + c0 * E : nullptr;
        out.logits = q.all_logits && q.logits ? q.logits + c0 * V : nullptr;
        prefill_chunk(n_past_ + c0, m, (q.logits || q.next) && !q.all_logits && c0 + m == n, &out);
    }
    rows_snap_ = false;
    n_past_ += n;
    if (q.logits && !q.all_logits)
        QUERN_CUDA_CHECK(cudaMemcpyAsync(q.logits, logits_.data(), static_cast<size_t>(V) * sizeof(float),
                                         cudaMemcpyDeviceToHost, ctx_.stream()));
    ctx_.synchronize();
}

void CudaExecutor::layer_rows(const int32_t* dtokens, int64_t n, int64_t pos0, const PagedRows* paged) {
    const auto& c = plan_;
    const cudaStream_t s = ctx_.stream();
    const int64_t E = c.n_embd, FF = c.n_ff;
    float* X = px_.as<float>();
    float* H = ph_.as<float>();
    float* HRES = c.post_norms ? phpost_.as<float>() : H;  // what is added to the residual stream
    float* GU = pgu_.as<float>();

    mark("start");
    if (c.draft()) {
        rows_nextn_prologue(dtokens, n, X);
    } else {
        get_rows(embd_type_, embd_, c.n_vocab, E, dtokens, n, X, s);
        if (c.embd_scale > 0.0f) scale_softcap(X, n * E, c.embd_scale, 0.0f, s);
    }
    mark("embed");
    for (int64_t il = 0; il < c.n_layer; ++il) {
        const LayerWeights& L = layers_[static_cast<size_t>(il)];
        const BlockPlanLayer& P = c.layers[static_cast<size_t>(il)];
        const bool gelu = P.act == GluAct::GeluTanh;
        const auto fused = [&](const DeviceWeight& f, const std::vector<Piece>& ps) { return use_fused(f, ps, n, false); };
        // Layer 0 reads the embeddings; later layers add the previous FFN output first.
        // The norms write the GEMM input in BF16 themselves (one rounding for
        // all Q|K|V or gate|up pieces), and so does the FFN gating.
        uint16_t* xb = gemm_->act_bf16();
        rms_norm_bf16(X, il > 0 ? HRES : nullptr, L.attn_norm, xb, n, E, c.rms_eps, s);
        mark("norm");
        if (L.delta) rows_delta(L, n, xb, H);
        else rows_attention(L, P, n, pos0, paged, xb, H);
        if (L.post_attn_norm) rms_norm_q8_1(H, nullptr, L.post_attn_norm, HRES, nullptr, nullptr, n, E, c.rms_eps, s);
        if (P.attn_out_scale != 1.0f) scale_softcap(HRES, n * E, P.attn_out_scale, 0.0f, s);
        rms_norm_bf16(X, HRES, L.ffn_norm, xb, n, E, c.rms_eps, s);
        mark("norm");
        if (L.moe) {
            prefill_moe(L, *P.moe, xb, n, H);
            if (!L.sh_gate_up.empty()) rows_shared_expert(L, n, xb, H);
        } else {
            // Gate and up on bq_gemm (a [gate | up] piece, or two pieces of
            // one bq width): the gated values come out of that launch, in
            // GU's memory as the down projection's BF16 input.
            // Or on the resident layout (qw_gemm_glu), likewise.
            const std::vector<Piece>& gu = L.gate_up;
            const bool pair = !fused(L.gate_up_bf16, gu) && ((gu.size() == 1 && gu[0].w.N == 2 * FF) ||
                                                            (gu.size() == 2 && gu[0].w.N == FF && gu[1].w.N == FF));
            const auto all = [&](bool (*uses)(const DeviceWeight&, int64_t)) {
                return std::all_of(gu.begin(), gu.end(), [&](const Piece& p) { return uses(p.w, n); });
            };
            const bool glu_bq = pair && (gu.size() == 2 || FF % 16 == 0) && all(PrefillGemm::uses_bq) &&
                                bq_glu_supported(gu.front().w, gu.back().w, n);
            const bool glu_qw = !glu_bq && pair && all(PrefillGemm::uses_qw) && qw_glu_supported(gu.front().w, gu.back().w, n);
            if (glu_bq || glu_qw) {
                auto* hb = reinterpret_cast<uint16_t*>(GU);
                const int64_t up0 = gu.size() == 1 ? FF : 0;
                if (glu_bq) bq_gemm_glu(gu.front().w, 0, gu.back().w, up0, FF, xb, n, hb, FF, gelu, s);
                else qw_gemm_glu(gu.front().w, 0, gu.back().w, up0, FF, xb, n, hb, FF, gelu, s);
                mark("glu");
                gemm_->run_bf16(L.down.w, hb, n, H, E, s);
            } else {
                if (fused(L.gate_up_bf16, gu)) gemm_->run_bf16(L.gate_up_bf16, xb, n, GU, 2 * FF, s);
                else run_pieces(gu, xb, n, GU, 2 * FF);
                glu_rows_bf16(GU, 2 * FF, n, FF, xb, gelu, s);
                mark("glu");
                gemm_->run_bf16(L.down.w, xb, n, H, E, s);
            }
        }
        if (L.post_ffn_norm) rms_norm_q8_1(H, nullptr, L.post_ffn_norm, HRES, nullptr, nullptr, n, E, c.rms_eps, s);
        if (P.ffn_out_scale != 1.0f) scale_softcap(HRES, n * E, P.ffn_out_scale, 0.0f, s);
        mark("norm");
    }
}

void CudaExecutor::rows_nextn_prologue(const int32_t* dtokens, int64_t n, float* X) {
    const auto& c = plan_;
    const cudaStream_t s = ctx_.stream();
    const int64_t E = c.n_embd;
    get_rows(embd_type_, embd_, c.n_vocab, E, dtokens, n, X, s);
    // The two norms in BF16 side by side in phout_ (n rows of E each), then
    // interleaved row by row into the GEMM's [e | h] input of 2·E.
    auto* eb = phout_.as<uint16_t>();
    uint16_t* hb = eb + n * E;
    rms_norm_bf16(X, nullptr, nextn_enorm_, eb, n, E, c.rms_eps, s);
    rms_norm_bf16(phin_.as<float>(), nullptr, nextn_hnorm_, hb, n, E, c.rms_eps, s);
    uint16_t* cat = gemm_->act_bf16();
    const size_t row = static_cast<size_t>(E) * 2;
    QUERN_CUDA_CHECK(cudaMemcpy2DAsync(cat, 2 * row, eb, row, row, static_cast<size_t>(n), cudaMemcpyDeviceToDevice, s));
    QUERN_CUDA_CHECK(cudaMemcpy2DAsync(cat + E, 2 * row, hb, row, row, static_cast<size_t>(n), cudaMemcpyDeviceToDevice, s));
    gemm_->run_bf16(eh_proj_.w, cat, n, X, E, s);
}

void CudaExecutor::rows_attention(const LayerWeights& L, const BlockPlanLayer& P, int64_t n, int64_t pos0,
                                  const PagedRows* paged, uint16_t* xb, float* H) {
    const auto& c = plan_;
    const cudaStream_t s = ctx_.stream();
    const int64_t E = c.n_embd, QD = c.q_dim(), LQ = c.q_dim() + 2 * c.kv_dim();
    float* QKV = pqkv_.as<float>();
    const int nctx = static_cast<int>(n_ctx_);
    const int rows = static_cast<int>(n);
    const bool fused = use_fused(L.qkv_bf16, L.qkv, n, true);
    // A gated output: [gate | attention] per row (GA), the gate's sigmoid
    // times the attention in BF16 as the output projection's input.
    const bool gated = !L.attn_gate.empty();
    float* ATT = gated ? pga_.as<float>() + QD : pattn_.as<float>();
    const int64_t LA = gated ? 2 * QD : QD;
    if (fused) gemm_->run_bf16(L.qkv_bf16, xb, n, QKV, LQ, s);
    else run_pieces(L.qkv, xb, n, QKV, LQ);
    const AttentionSpec& A = *P.attn;
    auto* kc = kv_.as<uint8_t>() + 2 * static_cast<size_t>(A.kv_layer) * kv_layer_bytes_;
    auto* vc = kc + kv_layer_bytes_;
    AttentionExtras ex = attention_extras(L, P);
    const float* inv_freq = inv_freq_[static_cast<size_t>(&P - c.layers.data())];
    const int rope_dim = A.rope.dim;
    const bool neox = A.rope.neox;
    const int window = static_cast<int>(A.window);
    if (paged && A.rope.long_factors) inv_freq = rope_short_;  // rows with pr.rope_long set take rope_long_
    // The paged attention leaves its output in BF16 as the output
    // projection's input (no separate rounding pass).
    PagedRows pr = paged ? *paged : PagedRows{};
    pr.out_bf16 = gated ? nullptr : xb;
    if (gated)
        for (const Piece& p : L.attn_gate) gemm_->run_bf16(p.w, xb, n, pga_.as<float>() + p.offset, LA, s);
    if (paged && paged->one_row_per_seq) {
        // Decode rows: RoPE, the KV write and the attention in one launch.
        paged_rope_attention(QKV, LQ, kc, vc, KvType::F16, rows, pr, static_cast<int>(c.n_head),
                             static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim), A.scale, window,
                             A.softcap, inv_freq, rope_dim, neox, ex, ATT, LA, s);
    } else if (paged) {
        paged_rope_kv_store(QKV, LQ, rows, *paged, kc, vc, KvType::F16, static_cast<int>(c.n_head),
                            static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim), inv_freq,
                            rope_dim, neox, ex, s);
        mark("rope_kv");
        paged_attention(QKV, LQ, kc, vc, KvType::F16, rows, pr, static_cast<int>(c.n_head),
                        static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim), A.scale,
                        window, A.softcap, ATT, LA, s);
    } else {
        prefill_rope_kv_store(QKV, LQ, rows, static_cast<int>(pos0), kc, vc, kv_type_, nctx,
                              static_cast<int>(c.n_head), static_cast<int>(c.n_head_kv),
                              static_cast<int>(c.head_dim), inv_freq, rope_dim, neox,
                              ex, s);
        mark("rope_kv");
        prefill_attention(QKV, LQ, kc, vc, kv_type_, rows, static_cast<int>(pos0), nctx,
                          static_cast<int>(c.n_head), static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim),
                          A.scale, static_cast<int>(std::min<int64_t>(A.window, nctx)), A.softcap,
                          ATT, LA, s);
    }
    mark("attention");
    if (gated) {
        glu_rows_bf16(pga_.as<float>(), LA, n, QD, xb, kGateSigmoid, s);
        mark("gate");
        gemm_->run_bf16(L.wo.w, xb, n, H, E, s);
    } else if (paged) {
        gemm_->run_bf16(L.wo.w, xb, n, H, E, s);
    } else {
        gemm_->run(L.wo.w, ATT, QD, n, H, E, s);
    }
}

void CudaExecutor::run_pieces(const std::vector<Piece>& ps, const uint16_t* xb, int64_t n, float* y, int64_t ldy) {
    constexpr size_t kMost = 8;  // pieces of one layer's product: at most 3 today
    if (ps.size() > kMost) {
        for (const Piece& p : ps) gemm_->run_bf16(p.w, xb, n, y + p.offset, ldy, ctx_.stream());
        return;
    }
    std::array<const DeviceWeight*, kMost> ws{};
    std::array<int64_t, kMost> cols{};
    for (size_t i = 0; i < ps.size(); ++i) {
        ws[i] = &ps[i].w;
        cols[i] = ps[i].offset;
    }
    gemm_->run_bf16_pieces(ws.data(), cols.data(), static_cast<int>(ps.size()), xb, n, y, ldy, ctx_.stream());
}

bool CudaExecutor::use_fused(const DeviceWeight& f, const std::vector<Piece>& ps, int64_t n, bool qkv) {
    // The fused copy unless the pieces go through bq_gemm at this size; for
    // Q|K|V past 16 rows also when a piece is under 8k rows (one GEMM on the
    // 6k-row copy beats three bq products there; H200: ~17 against ~30 us
    // for Llama-3-8B at 32 rows).
    if (!f.bf16) return false;
    const auto bq = [&](const Piece& p) { return PrefillGemm::uses_bq(p.w, n); };
    const auto small = [](const Piece& p) { return p.w.N < 8192; };
    return !std::any_of(ps.begin(), ps.end(), bq) || (qkv && n > 16 && std::any_of(ps.begin(), ps.end(), small));
}

bool CudaExecutor::moe_on_device(const LayerWeights& L) const {
    const auto grouped = [](const DeviceWeight& b) { return b.bq || dq_grouped_supported(b.type, b.K); };
    bool ok = grouped(L.exp_down);
    for (const auto& b : L.gate_up_banks(plan_.n_ff_exp)) ok = ok && grouped(*b.w);
    return ok;
}

void CudaExecutor::prefill_moe(const LayerWeights& L, const MoeSpec& spec, const uint16_t* xb, int64_t n,
                                   float* out) {
    const auto& c = plan_;
    const cudaStream_t s = ctx_.stream();
    const int k = static_cast<int>(c.n_expert_used);
    const int64_t NE = c.n_expert, F = c.n_ff_exp, E = c.n_embd, m = n * k;
    float* logits = pmoe_logits_.as<float>();
    gemm_->run_bf16(L.router.w, xb, n, logits, NE, s);
    // Route arrays on the device: [pos (m) | src (m) | weights (m floats) |
    // offsets (NE + 1) | ids (m)].
    auto* dr = pmoe_route_.as<int32_t>();
    int32_t* dpos = dr;
    int32_t* dsrc = dr + m;
    auto* dw = reinterpret_cast<float*>(dr + 2 * m);
    int32_t* doff = dr + 3 * m;
    auto* xg = pmoe_xg_.as<uint16_t>();
    float* gu = pmoe_gu_.as<float>();
    auto* g = pmoe_g_.as<uint16_t>();
    float* y = pmoe_y_.as<float>();
    // Every expert of a bank is multiplied in one launch and the tokens are
    // routed and grouped on the device: no host round trip. A bank with a bq
    // layout (the 4- to 6-bit types) multiplies it (bq_gemm_grouped), any
    // other bank decodes its resident layout to BF16 tile by tile
    // (dq_gemm_grouped). On an H200, qwen3-30b-a3b Q4_K_M: pp512 21.7k tok/s,
    // pp2048 26.5k, against 3.8k and 7.1k with one GEMM per expert and host
    // routing. The groups' sizes stay on the device, so the grid covers the
    // largest possible group (n rows); blocks past a group's end leave at
    // once.
    if (moe_on_device(L)) {
        const auto grouped = [&](const DeviceWeight& b, int64_t rows, const uint16_t* x, float* yo, int64_t ldy) {
            if (b.bq) bq_gemm_grouped(b, rows, doff, NE, n, x, yo, ldy, s);
            else dq_gemm_grouped(b, rows, doff, NE, n, (m + NE - 1) / NE, x, yo, ldy, s);
        };
        int32_t* ids = doff + NE + 1;
        moe_route_rows(logits, n, static_cast<int>(NE), k, spec.renormalize, ids, dw, s);
        moe_group_rows(ids, n, k, static_cast<int>(NE), dpos, dsrc, doff, s);
        gather_rows_bf16(xb, E, dsrc, m, xg, s);
        mark("moe_route");
        for (const auto& b : L.gate_up_banks(F)) grouped(*b.w, b.rows, xg, gu + b.col, 2 * F);
        glu_rows_bf16(gu, 2 * F, m, F, g, spec.act == GluAct::GeluTanh, s);
        grouped(L.exp_down, E, g, y, E);
        moe_weighted_sum_rows(y, dpos, dw, n, k, E, out, s);
        mark("moe_experts");
        return;
    }
    // Otherwise (a float bank with rows of K %
    // 32 != 0) one GEMM per expert, whose sizes the host needs: the router
    // logits go to the host and are routed and grouped there by the CPU's own
    // moe_route / moe_group (one synchronisation per layer).
    auto* hl = hmoe_logits_.as<float>();
    QUERN_CUDA_CHECK(cudaMemcpyAsync(hl, logits, static_cast<size_t>(n * NE) * sizeof(float), cudaMemcpyDeviceToHost, s));
    ctx_.synchronize();
    mark("moe_router");
    std::vector<int32_t> ids(static_cast<size_t>(m));
    auto* hr = hmoe_route_.as<int32_t>();  // [pos (m) | src (m) | weights (m floats)]
    auto* hw = reinterpret_cast<float*>(hr + 2 * m);
    quern::moe_route(hl, n, NE, k, spec.renormalize, ids.data(), hw);
    std::vector<int64_t> offsets, entries;
    quern::moe_group(ids.data(), n, k, NE, offsets, entries);
    for (int64_t x = 0; x < m; ++x) {
        const int64_t e = entries[static_cast<size_t>(x)];
        hr[e] = static_cast<int32_t>(x);          // entry (row, slot) -> its grouped row
        hr[m + x] = static_cast<int32_t>(e / k);  // grouped row -> the activation row it reads
    }
    QUERN_CUDA_CHECK(cudaMemcpyAsync(dr, hr, static_cast<size_t>(3 * m) * 4, cudaMemcpyHostToDevice, s));
    gather_rows_bf16(xb, E, dsrc, m, xg, s);
    mark("moe_route");
    // Each expert's rows, rounded up to a multiple of 16 (fewer distinct GEMM
    // shapes to plan): the extra rows belong to the next experts, whose own
    // GEMMs overwrite them later in stream order, or to the 16 rows of
    // padding; rows never mix in a GEMM, so they cannot disturb the others.
    const auto rows_of = [&](int64_t x) {
        return std::min<int64_t>((offsets[static_cast<size_t>(x) + 1] - offsets[static_cast<size_t>(x)] + 15) / 16 * 16,
                                 prefill_rows_);
    };
    for (int64_t x = 0; x < NE; ++x) {
        const int64_t o = offsets[static_cast<size_t>(x)];
        if (offsets[static_cast<size_t>(x) + 1] == o) continue;
        const int64_t r = rows_of(x);
        for (const auto& b : L.gate_up_banks(F))
            gemm_->run_bf16_rows(*b.w, x * b.rows, b.rows, xg + o * E, r, gu + o * 2 * F + b.col, 2 * F, s);
    }
    glu_rows_bf16(gu, 2 * F, m, F, g, spec.act == GluAct::GeluTanh, s);
    for (int64_t x = 0; x < NE; ++x) {
        const int64_t o = offsets[static_cast<size_t>(x)];
        if (offsets[static_cast<size_t>(x) + 1] == o) continue;
        gemm_->run_bf16_rows(L.exp_down, x * E, E, g + o * F, rows_of(x), y + o * E, E, s);
    }
    moe_weighted_sum_rows(y, dpos, dw, n, k, E, out, s);
    mark("moe_experts");
}

void CudaExecutor::prefill(const int32_t* tokens, int64_t n, float* logits) {
    rows_snap_ = false;
    begin(tokens, n);  // the ids on the device (get_row reads them; the sampler's penalties later)
    for (int64_t c0 = 0; c0 < n; c0 += prefill_rows_) {
        const int64_t m = std::min(prefill_rows_, n - c0);
        prefill_chunk(n_past_ + c0, m, logits != nullptr && c0 + m == n);
    }
    n_past_ += n;
    if (logits) {
        QUERN_CUDA_CHECK(cudaMemcpyAsync(logits, logits_.data(), static_cast<size_t>(plan_.n_vocab) * sizeof(float),
                                         cudaMemcpyDeviceToHost, ctx_.stream()));
    }
    ctx_.synchronize();
}

}  // namespace quern::cuda
