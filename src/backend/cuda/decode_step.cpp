// The decode step: one token of one sequence through a program's decoder
// blocks (BlockPlan, backend/block_plan.h), as one captured CUDA graph. A
// block's q/k/v biases, q/k norms, window and soft-cap are applied inside the
// attention kernel (AttentionExtras, ops.h); row slices of one fused matrix
// are uploaded as that matrix.
//
// One decode step, for the token in DecodeControl::cur at DecodeControl::pos
// (all kernels read both from device memory, so the step is captured once as
// a CUDA graph and replayed for every token):
//
//   x = token_embd[cur]                                   get_row
//   per layer:
//     xn, xq = RMSNorm(x (+= h), attn_norm)               rms_norm_q8_1 (residual folded in)
//     [q | k | v] = W_qkv · xq                            one GEMV per run of equal weight types
//     rotate q, k; store k, v at pos;                     decode_attention_rope (split-K with RoPE and
//     a, aq = attention(q, cache[0..pos]), Q8_1(a)          the KV write fused; quantizes in its combine,
//                                                           or in the split kernel when one split covers pos)
//     h = W_o · aq                                        gemv
//     xn, xq = RMSNorm(x += h, ffn_norm)                  rms_norm_q8_1
//     [gate | up] = W_gate_up · xq                        one GEMV when the types match
//     fq = Q8_1(SiLU(gate) · up)                          swiglu_q8_1
//     h = W_down · fq                                     gemv
//   (mixture-of-experts layers: in place of the FFN
//    above, with every expert id on the device)
//     r = W_router · xq                                   gemv (float or quantized router)
//     ids[k], w[k] = top-k of softmax(r), renormalised    moe_route (one warp, as the CPU's moe_route)
//     (a shared expert in the banks: ids[k] = n_expert,     moe_route, SharedExpertGate
//      w[k] = sigmoid(w_gate · xn); k + 1 slots below)
//     [g_s | u_s] = W_gate_up[ids[s]] · xq for each slot  gemv_indexed: one launch (grid.y = slot), the
//                                                           bank holding each expert's gate and up rows
//     fq = Q8_1(SiLU(g) · u) over the slots·n_ff_exp      swiglu_q8_1 (one row; slot s at s·n_ff_exp)
//     y_s = W_down[ids[s]] · fq_s                         gemv_indexed with per-slot activations
//     h = Σ_s w_s · y_s                                   in the next layer's norm (its weighted
//                                                           residual), else moe_weighted_sum
//     (a shared expert not in the banks: h += its own     step_shared_expert (hybrid_layers.cpp)
//      gated FFN)
//   xn, xq = RMSNorm(x += h, output_norm); logits = W_out · xq; sampled = argmax or sample_token
//   pos += 1; cur = next prompt token or sampled          advance_decode_position (greedy: in
//                                                           argmax's final launch, argmax_advance)
//   The sampled token also goes to mapped host memory, which the host reads
//   after the step; a step whose token the device fed back needs no upload.
//
// When every matrix reads the quantized activation (fuse_norm_; not F32 /
// F16 / BF16 / F8_E4M3_B32 matrices; never with expert layers), the RMSNorms
// have no launch of their own: the lookup (get_row_norm) and the output and
// down projections (gemv_residual_norm: x += W·a in their epilogue) leave the
// next norm's activation quantized without its scale and Σx² in partial
// sums, and the GEMVs that read that activation apply the scale
// (DeferredNormScale, gemv.h); h is unused. Most decode kernels trigger
// their successor's launch before their own PDL wait (launch.cuh).
//
// With precise activations (the default, as on the CPU) every quantized
// activation has two levels (gemv.h), keeping the logits within cosine
// ~0.9999 of a float reference; --fast-act uses one.
// Weight matrices that share an input and a type are concatenated at upload
// (Q|K|V, gate|up) so that one launch reads them all. Every weight type the
// CPU runs has a GEMV (FP8 / NVFP4 checkpoints' F8_E4M3_B32 and NVFP4
// included: the first reads the float activation, the second the quantized
// one, gemv_takes_quantized_activation); an embedding table of a type get_row
// lacks is dequantized to F16 at upload.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/executor.h"
#include "backend/cuda/tuning.h"
#include "core/error.h"

namespace quern::cuda {

void CudaExecutor::mm(const Piece& p, const float* xf, QuantizedActivation& xq, float* y) {
    if (gemv_takes_quantized_activation(p.w.type))
        gemv(ctx_, p.w, xq, y + p.offset);
    else
        gemv(ctx_, p.w, xf, y + p.offset);
}

DeferredNormScale CudaExecutor::deferred_norm() const {
    return DeferredNormScale{ss_parts_.as<float>(), static_cast<int>(plan_.n_embd / 32), plan_.n_embd, plan_.rms_eps};
}

void CudaExecutor::mm_normed(const Piece& p, float* y, bool deferred) {
    if (deferred) gemv(ctx_, p.w, xq_embd_, y + p.offset, deferred_norm());
    else mm(p, xn_.as<float>(), xq_embd_, y);
}

bool CudaExecutor::skipped(const char* op) { return tuning().skip.find(op) != std::string::npos; }

void CudaExecutor::enqueue_step(Head head, const TraceFn* trace, bool short_ctx) {
    const auto& c = plan_;
    const cudaStream_t s = ctx_.stream();
    auto* ctl = ctl_.as<DecodeControl>();
    const int32_t* pos = &ctl->pos;
    float* x = x_.as<float>();
    float* h = h_.as<float>();
    float* xn = xn_.as<float>();
    float* gate = gu_.as<float>();
    float* up = gate + c.n_ff;
    const int nctx = static_cast<int>(n_ctx_);
    // The vector added to the residual stream: h, or (post-norms) its
    // normalized copy.
    float* hres = c.post_norms ? hpost_.as<float>() : h;
    // An expert layer's outputs whose weighted sum the next norm adds
    // (rms_norm_q8_1's weighted residual: no moe_weighted_sum launch), or 0.
    int moe_rows = 0;
    const auto norm = [&](const float* w, bool residual) {
        const int k = residual ? moe_rows : 0;
        rms_norm_q8_1(x, k ? moe_y_.as<float>() : residual ? hres : nullptr, w, xn, xq_embd_.q(), xq_embd_.info(), 1,
                      c.n_embd, c.rms_eps, s, xq_embd_.q2(), xq_embd_.info2(), k ? moe_w_.as<float>() : nullptr, k);
        if (residual) moe_rows = 0;
    };
    const bool fuse = fuse_norm_;
    const auto sk = [](const char* what) { return skipped(what); };
    mark("start");
    // Layer 0's RMSNorm deferred like the others' where the GEMVs defer it:
    // the lookup leaves the activation as gemv_residual_norm would.
    const bool norm0 = fuse && c.embd_scale <= 0.0f && c.n_layer > 0;
    if (norm0)
        get_row_norm(embd_type_, embd_, c.n_vocab, c.n_embd, &ctl->cur, x, layers_[0].attn_norm, xq_embd_.q(),
                     xq_embd_.info(), xq_embd_.q2(), xq_embd_.info2(), ss_parts_.as<float>(), s);
    else
        get_row(embd_type_, embd_, c.n_vocab, c.n_embd, &ctl->cur, x, s);
    if (c.embd_scale > 0.0f) scale_softcap(x, c.n_embd, c.embd_scale, 0.0f, s);
    mark("embed");
    for (int64_t il = 0; il < c.n_layer; ++il) {
        const LayerWeights& L = layers_[static_cast<size_t>(il)];
        const BlockPlanLayer& P = c.layers[static_cast<size_t>(il)];
        const bool deferred = fuse && (il > 0 || norm0);  // else layer 0's input comes from get_row
        if (!deferred && !sk("norm")) norm(L.attn_norm, il > 0);
        mark("norm");
        // The output projection's input: attention's (quantized by its
        // kernel), or a gate's (hybrid_layers.cpp).
        const float* mixed = attn_.as<float>();
        if (L.delta) {
            mixed = step_delta(L);
        } else {
            step_attention(L, P, deferred, short_ctx);
            if (!L.attn_gate.empty()) mixed = step_attn_gate(L);
        }
        QuantizedActivation& xo = L.delta ? xq_delta_ : xq_attn_;
        if (fuse) {  // x += W_o·a; the FFN norm's activation without its scale
            gemv_residual_norm(ctx_, L.wo.w, xo, x, L.ffn_norm, xq_embd_, ss_parts_.as<float>());
            mark("gemv_o");
        } else {
            if (!sk("wo")) mm(L.wo, mixed, xo, h);
            if (L.post_attn_norm)
                rms_norm_q8_1(h, nullptr, L.post_attn_norm, hres, nullptr, nullptr, 1, c.n_embd, c.rms_eps, s);
            if (P.attn_out_scale != 1.0f) scale_softcap(hres, c.n_embd, P.attn_out_scale, 0.0f, s);
            mark("gemv_o");
            if (!sk("norm")) norm(L.ffn_norm, true);
            mark("norm");
        }
        if (L.moe) {
            // Mixture of experts, all on the device (the CPU's moe_ffn for one
            // row): router logits, moe_route writes the k ids and weights,
            // the indexed GEMVs read the ids, h = Σ_j w_j · expert_j. A shared
            // expert kept in the banks is slot k (its weight the sigmoid gate).
            const int k = static_cast<int>(c.n_expert_used);
            const bool sh = shexp_in_banks_ && !sk("shexp");  // every expert layer has one then
            const int slots = k + (shexp_in_banks_ ? 1 : 0);  // the buffers' layout (xq_moe_ holds slots · F)
            const int64_t F = c.n_ff_exp;
            auto* ids = moe_ids_.as<int32_t>();
            // A row of [gate | up] (2F) per slot from one bank, or a row of
            // gates (slots · F) then one of ups from two.
            const auto banks = L.gate_up_banks(F);
            const bool one = banks.size() == 1;
            float* eg = gu_.as<float>();
            float* eu = one ? eg + F : eg + slots * F;
            const int64_t ld = one ? 2 * F : F;
            float* ef = ffh_.as<float>();
            if (!sk("router")) mm(L.router, xn, xq_embd_, moe_logits_.as<float>());
            if (!sk("topk"))
                moe_route(moe_logits_.as<float>(), static_cast<int>(c.n_expert), k, P.moe->renormalize, ids,
                          moe_w_.as<float>(), s, SharedExpertGate{xn, sh ? L.sh_gate : nullptr, c.n_embd});
            mark("moe_route");
            // Without the shared slot's weights (shexp skipped) its rows
            // still run, on whatever moe_w_ held: a timing switch only.
            if (!sk("gateup")) {
                for (const auto& b : banks) {
                    float* out = b.col == 0 ? eg : eu;
                    if (gemv_takes_quantized_activation(b.w->type))
                        gemv_indexed(ctx_, *b.w, b.rows, xq_embd_, false, ids, slots, out);
                    else
                        gemv_indexed(ctx_, *b.w, b.rows, xn, false, ids, slots, out);
                }
            }
            mark("gemv_gate_up");
            // One SwiGLU over the slots·F elements; quantized as one row whose
            // slot s is elements s·F .. (gemv_indexed's per-slot layout).
            const bool qd = gemv_takes_quantized_activation(L.exp_down.type);
            if (!sk("swiglu"))
                swiglu_q8_1(eg, eu, ef, qd ? xq_moe_.q() : nullptr, qd ? xq_moe_.info() : nullptr, slots * F, s,
                            qd ? xq_moe_.q2() : nullptr, qd ? xq_moe_.info2() : nullptr,
                            P.act == GluAct::GeluTanh ? kGateGelu : kGateSiLU, F, ld);
            mark("swiglu");
            float* ey = moe_y_.as<float>();
            if (!sk("down")) {
                if (qd) gemv_indexed(ctx_, L.exp_down, c.n_embd, xq_moe_, true, ids, slots, ey);
                else gemv_indexed(ctx_, L.exp_down, c.n_embd, ef, true, ids, slots, ey);
            }
            // The next layer's norm sums the slots where it adds them, unless
            // something must see h first (a shared expert of its own, a
            // post-norm or scale, the trace) or no layer follows.
            const bool own_shexp = !L.sh_gate_up.empty() && !shexp_in_banks_;
            const bool fold = !trace && !own_shexp && !L.post_ffn_norm && P.ffn_out_scale == 1.0f &&
                              il + 1 < c.n_layer && !sk("norm");
            if (fold) moe_rows = slots;
            else if (!sk("wsum")) moe_weighted_sum(ey, moe_w_.as<float>(), slots, c.n_embd, h, s);
            if (own_shexp && !sk("shexp")) step_shared_expert(L);
            if (L.post_ffn_norm)
                rms_norm_q8_1(h, nullptr, L.post_ffn_norm, hres, nullptr, nullptr, 1, c.n_embd, c.rms_eps, s);
            if (P.ffn_out_scale != 1.0f) scale_softcap(hres, c.n_embd, P.ffn_out_scale, 0.0f, s);
        } else {
            if (!sk("gateup"))
                for (const Piece& p : L.gate_up) mm_normed(p, gate, fuse);
            mark("gemv_gate_up");
            if (!sk("swiglu"))
                swiglu_q8_1(gate, up, ffh_.as<float>(), xq_ff_.q(), xq_ff_.info(), c.n_ff, s, xq_ff_.q2(),
                            xq_ff_.info2(), P.act == GluAct::GeluTanh);
            mark("swiglu");
            if (fuse) {  // x += W_down·f; the next norm's (next layer's or the output's) activation
                const float* next_norm =
                    il + 1 < c.n_layer ? layers_[static_cast<size_t>(il + 1)].attn_norm : out_norm_;
                gemv_residual_norm(ctx_, L.down.w, xq_ff_, x, next_norm, xq_embd_, ss_parts_.as<float>());
            } else if (!sk("down")) {
                mm(L.down, ffh_.as<float>(), xq_ff_, h);
                if (L.post_ffn_norm)
                    rms_norm_q8_1(h, nullptr, L.post_ffn_norm, hres, nullptr, nullptr, 1, c.n_embd, c.rms_eps, s);
                if (P.ffn_out_scale != 1.0f) scale_softcap(hres, c.n_embd, P.ffn_out_scale, 0.0f, s);
            }
        }
        mark("gemv_down");
        if (trace && !P.trace.empty()) {  // residual stream after the layer: x (+ h when the add is folded into the next norm)
            std::vector<float> hx(static_cast<size_t>(c.n_embd)), hh(hx.size());
            x_.download(hx.data(), hx.size() * 4, s);
            if (!fuse) {
                QUERN_CUDA_CHECK(cudaMemcpyAsync(hh.data(), hres, hh.size() * 4, cudaMemcpyDeviceToHost, s));
                QUERN_CUDA_CHECK(cudaStreamSynchronize(s));
            }
            for (size_t i = 0; i < hx.size(); ++i) hx[i] += hh[i];
            (*trace)(P.trace, hx.data(), c.n_embd);
        }
    }
    if (head) {
        if (!fuse) norm(out_norm_, true);
        mark("norm");
        mm_normed(output_, logits_.as<float>(), fuse);
        if (c.logit_scale != 1.0f || c.final_softcap > 0.0f)
            scale_softcap(logits_.as<float>(), c.n_vocab, c.logit_scale, c.final_softcap, s);
        mark("gemv_output");
        if (head == kSample) {
            sample_token(logits_.as<float>(), c.n_vocab, tokens_.as<int32_t>(), pos, nctx,
                         sampling_.as<DeviceSampling>(), &ctl->sampled, s);
            mark("sample");
        } else {  // argmax's final launch also ends the step
            argmax_advance(logits_.as<float>(), c.n_vocab, argmax_scratch_.data(), ctl, tokens_.as<int32_t>(), nctx,
                           host_out_dev_, s);
            mark("argmax");
            collect_profile(prof_decode_);
            return;
        }
    }
    advance_decode_position(ctl, tokens_.as<int32_t>(), nctx, s, host_out_dev_);
    mark("advance");
    collect_profile(prof_decode_);
}

void CudaExecutor::step_attention(const LayerWeights& L, const BlockPlanLayer& P, bool deferred, bool short_ctx) {
    const auto& c = plan_;
    const cudaStream_t s = ctx_.stream();
    const int32_t* pos = &ctl_.as<DecodeControl>()->pos;
    float* q = qkv_.as<float>();
    float* k = q + c.q_dim();
    float* v = k + c.kv_dim();
    const int nctx = static_cast<int>(n_ctx_);
    const DeferredNormScale dn = deferred_norm();
    const auto sk = [](const char* what) { return skipped(what); };
    const AttentionSpec& A = *P.attn;
    auto* kc = kv_.as<uint8_t>() + 2 * static_cast<size_t>(A.kv_layer) * kv_layer_bytes_;
    auto* vc = kc + kv_layer_bytes_;
    // Q|K and V of different types (Q4_K_M): one launch where a fused kernel exists.
    const bool pair = L.qkv.size() == 2 && gemv_takes_quantized_activation(L.qkv[0].w.type) &&
                      gemv_takes_quantized_activation(L.qkv[1].w.type);
    if (!sk("qkv") && pair)
        gemv_pair(ctx_, L.qkv[0].w, q + L.qkv[0].offset, L.qkv[1].w, q + L.qkv[1].offset, xq_embd_,
                  deferred ? &dn : nullptr);
    else if (!sk("qkv"))
        for (const Piece& p : L.qkv) mm_normed(p, q, deferred);
    mark("gemv_qkv");
    // RoPE, the KV-cache write and attention in one launch; it also
    // quantizes the output projection's activation.
    const bool qo = gemv_takes_quantized_activation(L.wo.w.type) && L.attn_gate.empty();
    AttentionExtras ex = attention_extras(L, P);
    ex.window = static_cast<int>(std::min<int64_t>(A.window, nctx));
    ex.softcap = A.softcap;
    ex.one_split = short_ctx ? 1 : 0;
    if (paged_step_) {
        ex.block_table = dtable_.as<int32_t>();
        ex.block_shift = block_shift_;
    }
    if (!sk("attn")) decode_attention_rope(q, k, v, kc, vc, kv_type_, pos, nctx, static_cast<int>(c.n_head),
                          static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim),
                          inv_freq_[static_cast<size_t>(&P - c.layers.data())], A.rope.dim, A.rope.neox, A.scale,
                          attn_scratch_.data(),
                          attn_.as<float>(), s, qo ? xq_attn_.q() : nullptr, qo ? xq_attn_.info() : nullptr,
                          qo ? xq_attn_.q2() : nullptr, qo ? xq_attn_.info2() : nullptr, ex);
    mark("attention");
}

cudaGraph_t CudaExecutor::capture_step(Head head, bool short_ctx) {
    const cudaStream_t s = ctx_.stream();
    cudaGraph_t g = nullptr;
    QUERN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    try {
        enqueue_step(head, nullptr, short_ctx);
    } catch (...) {
        cudaStreamEndCapture(s, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        throw;
    }
    QUERN_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    return g;
}

void CudaExecutor::run_step(Head head, int64_t pos) {
    const cudaStream_t s = ctx_.stream();
    const bool sc = pos < short_ctx_;
    if (!opt_.cuda_graph || profile_) return enqueue_step(head, nullptr, sc);
    cudaGraphExec_t& ge = graph_[head][sc ? 1 : 0][paged_step_ ? 1 : 0];
    if (!ge) {
        cudaGraph_t g = capture_step(head, sc);
        const cudaError_t e = cudaGraphInstantiate(&ge, g, 0);
        cudaGraphDestroy(g);
        QUERN_CUDA_CHECK(e);
    }
    QUERN_CUDA_CHECK(cudaGraphLaunch(ge, s));
}

namespace {

/// A demangled kernel signature without its return type and parameter list
/// ("void ns::k<4>(float*, int)" -> "ns::k<4>"); "(anonymous namespace)"
/// inside the name stays.
std::string kernel_label(std::string k) {
    if (!k.empty() && k.back() == ')') {
        int depth = 0;
        for (size_t i = k.size(); i-- > 0;) {
            if (k[i] == ')') ++depth;
            if (k[i] == '(' && --depth == 0) {
                k.resize(i);
                break;
            }
        }
    }
    if (k.rfind("void ", 0) == 0) k.erase(0, 5);
    return k;
}

}  // namespace

std::vector<std::string> CudaExecutor::decode_kernels() {
    if (!kv_.data()) fail("decode_kernels: no KV storage (make_kv_storage first)");
    const bool prof = profile_;
    profile_ = false;  // no event marks in the listing
    cudaGraph_t g = nullptr;
    try {
        g = capture_step(kArgmax, false);
    } catch (...) {
        profile_ = prof;
        throw;
    }
    profile_ = prof;
    size_t n = 0, ne = 0;
    QUERN_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    QUERN_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
    QUERN_CUDA_CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &ne));
    std::vector<cudaGraphNode_t> from(ne), to(ne);
    std::vector<cudaGraphEdgeData> edge(ne);  // PDL edges carry data: asking without it is refused as lossy
    if (ne > 0) QUERN_CUDA_CHECK(cudaGraphGetEdges(g, from.data(), to.data(), edge.data(), &ne));
    // One stream: a chain. Stream order is the order of a topological walk
    // from the nodes without predecessors (Kahn's, ties by node order).
    std::map<cudaGraphNode_t, int> indeg;
    std::map<cudaGraphNode_t, std::vector<cudaGraphNode_t>> succ;
    for (auto* v : nodes) indeg[v] = 0;
    for (size_t i = 0; i < ne; ++i) ++indeg[to[i]], succ[from[i]].push_back(to[i]);
    std::vector<cudaGraphNode_t> ready;
    for (auto* v : nodes)
        if (indeg[v] == 0) ready.push_back(v);
    std::vector<std::string> out;
    for (size_t i = 0; i < ready.size(); ++i) {
        cudaGraphNode_t v = ready[i];
        cudaGraphNodeType type{};
        QUERN_CUDA_CHECK(cudaGraphNodeGetType(v, &type));
        if (type == cudaGraphNodeTypeKernel) {
            cudaKernelNodeParams kp{};
            QUERN_CUDA_CHECK(cudaGraphKernelNodeGetParams(v, &kp));
            const char* name = nullptr;
            QUERN_CUDA_CHECK(cudaFuncGetName(&name, kp.func));
            int st = 0;
            char* dm = abi::__cxa_demangle(name, nullptr, nullptr, &st);
            out.push_back(kernel_label(st == 0 && dm ? dm : name));
            std::free(dm);
        } else {
            out.push_back(type == cudaGraphNodeTypeMemcpy ? "memcpy" : type == cudaGraphNodeTypeMemset ? "memset" : "other");
        }
        for (auto* w : succ[v])
            if (--indeg[w] == 0) ready.push_back(w);
    }
    cudaGraphDestroy(g);
    return out;
}

void CudaExecutor::select_rope(int64_t last) {
    if (rope_live_) {  // the call's last position decides, as the CPU forward pass
        const bool lg = (rope_call_last_ >= 0 ? rope_call_last_ : last) >= rope_long_from_;
        if (lg != rope_long_live_) {
            QUERN_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(rope_live_), lg ? rope_long_ : rope_short_,
                                             static_cast<size_t>(rope_long_dim_ / 2) * sizeof(float),
                                             cudaMemcpyDeviceToDevice, ctx_.stream()));
            rope_long_live_ = lg;
        }
    }
}

void CudaExecutor::begin(const int32_t* tokens, int64_t n) {
    fed_ = false;
    select_rope(n_past_ + n - 1);
    auto* ht = host_tokens_.as<int32_t>();
    std::memcpy(ht, tokens, static_cast<size_t>(n) * sizeof(int32_t));
    const cudaStream_t s = ctx_.stream();
    QUERN_CUDA_CHECK(cudaMemcpyAsync(tokens_.as<int32_t>() + n_past_, ht, static_cast<size_t>(n) * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, s));
    auto* hc = host_ctl_.as<DecodeControl>();
    *hc = DecodeControl{static_cast<int32_t>(n_past_), tokens[0], static_cast<int32_t>(n_past_ + n), 0};
    QUERN_CUDA_CHECK(cudaMemcpyAsync(ctl_.data(), hc, sizeof(DecodeControl), cudaMemcpyHostToDevice, s));
}

void CudaExecutor::eval(const int32_t* tokens, int64_t n, float* logits) {
    if (n == 0) return;
    fed_ = false;
    if (use_prefill(n) && ensure_prefill_scratch()) return prefill(tokens, n, logits);
    begin(tokens, n);
    for (int64_t i = 0; i < n; ++i) run_step(i == n - 1 ? kArgmax : kNoHead, n_past_ + i);
    n_past_ += n;
    if (logits) {
        QUERN_CUDA_CHECK(cudaMemcpyAsync(logits, logits_.data(), static_cast<size_t>(plan_.n_vocab) * sizeof(float),
                                         cudaMemcpyDeviceToHost, ctx_.stream()));
    }
    ctx_.synchronize();
}

void CudaExecutor::begin_one(int32_t token) {
    if (fed_ && fed_pos_ == n_past_ && fed_tok_ == token) {
        select_rope(n_past_);
        return;
    }
    begin(&token, 1);
}

int32_t CudaExecutor::eval_greedy(int32_t token) {
    begin_one(token);
    const int64_t p = n_past_;
    run_step(kArgmax, p);
    n_past_ = p + 1;
    ctx_.synchronize();
    return took_step(p);
}

int32_t CudaExecutor::took_step(int64_t p) {
    const int32_t t = *reinterpret_cast<volatile int32_t*>(host_out_.as<int32_t>() + (p & 1));
    fed_ = true;
    fed_pos_ = n_past_;
    fed_tok_ = t;
    return t;
}

bool CudaExecutor::takes_paged_step(const ForwardBatch& fb) const {
    if (fb.n_seqs != 1 || !fb.invariant || fb.trace || block_shift_ < 0 || plan_.draft()) return false;
    const SeqBatch& q = fb.seqs[0];
    return q.n == 1 && q.n_past < n_ctx_ && !q.all_logits && !q.hidden && !q.hidden_in && !q.sampling &&
           !q.row_states;
}

void CudaExecutor::point_step_state(int32_t slot) {
    if (slot == step_slot_) return;
    const size_t per = static_cast<size_t>(state_floats_) * sizeof(float);
    float* base = slot < 0 ? lone_state_.as<float>()
                           : reinterpret_cast<float*>(slots_.as<uint8_t>() + per * static_cast<size_t>(slot));
    std::vector<float*> ptrs;
    for (const LayerWeights& L : layers_)
        if (L.delta) ptrs.push_back(base + L.state_offset);
    // dlone_: [row0 0 | 1 | chunk rows | pad | a pointer per DeltaNet layer];
    // the copy is synchronous: the host vector goes out of scope.
    QUERN_CUDA_CHECK(cudaMemcpyAsync(dlone_.as<uint8_t>() + 16, ptrs.data(), ptrs.size() * sizeof(float*),
                                     cudaMemcpyHostToDevice, ctx_.stream()));
    ctx_.synchronize();
    step_slot_ = slot;
}

void CudaExecutor::forward_paged_step(const SeqBatch& q) {
    const cudaStream_t s = ctx_.stream();
    const int64_t p = q.n_past;
    // The table up to position p (the host stage is free: every step ends
    // synchronized).
    const auto entries = static_cast<size_t>((p >> block_shift_) + 1);
    std::memcpy(htable_.as<int32_t>(), q.block_table, entries * sizeof(int32_t));
    QUERN_CUDA_CHECK(cudaMemcpyAsync(dtable_.data(), htable_.as<int32_t>(), entries * sizeof(int32_t), cudaMemcpyHostToDevice, s));
    if (plan_.hybrid()) {
        point_step_state(q.state_slot);
        if (p == 0) {  // a new sequence starts from zeros, as in batch passes
            const size_t per = static_cast<size_t>(state_floats_) * sizeof(float);
            QUERN_CUDA_CHECK(cudaMemsetAsync(slots_.as<uint8_t>() + per * static_cast<size_t>(q.state_slot), 0, per, s));
        }
    }
    const int64_t lone_past = n_past_;
    n_past_ = p;
    paged_step_ = true;
    try {
        begin(q.tokens, 1);
        run_step(kArgmax, p);
    } catch (...) {
        paged_step_ = false;
        n_past_ = lone_past;
        fed_ = false;
        cudaStreamSynchronize(s);  // the staged copies above finish before the host buffers are reused
        cudaGetLastError();
        throw;
    }
    paged_step_ = false;
    served_paged_ = true;
    n_past_ = lone_past;
    fed_ = false;
    if (q.logits)
        QUERN_CUDA_CHECK(cudaMemcpyAsync(q.logits, logits_.data(), static_cast<size_t>(plan_.n_vocab) * sizeof(float),
                                         cudaMemcpyDeviceToHost, s));
    ctx_.synchronize();
    if (q.next) *q.next = *reinterpret_cast<volatile int32_t*>(host_out_.as<int32_t>() + (p & 1));
    if (opt_.cuda_graph && !profile_) ++graph_replays_;
}

bool CudaExecutor::samples_on_device(const SamplingSpec& sp) const {
    const bool pen = sp.repeat_penalty != 1.0f || sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f;
    // Else (top-k off or too large, or a long penalty window) the host samples.
    return device_sampling_supported(sp.top_k, sp.repeat_last_n, pen);
}

int32_t CudaExecutor::eval_sample(int32_t token, const SamplingSpec& sp) {
    auto* hp = host_sampling_.as<DeviceSampling>();
    *hp = DeviceSampling{sp.temperature,      sp.top_k,          sp.top_p,
                         sp.min_p,            sp.repeat_penalty, sp.presence_penalty,
                         sp.frequency_penalty, sp.repeat_last_n, sp.u};
    const cudaStream_t s = ctx_.stream();
    QUERN_CUDA_CHECK(cudaMemcpyAsync(sampling_.data(), hp, sizeof(DeviceSampling), cudaMemcpyHostToDevice, s));
    begin_one(token);
    const int64_t p = n_past_;
    run_step(kSample, p);
    n_past_ = p + 1;
    ctx_.synchronize();
    return took_step(p);
}

void CudaExecutor::eval_traced(const int32_t* tokens, int64_t n, float* logits, const TraceFn& trace) {
    if (n == 0) return;
    rope_call_last_ = n_past_ + n - 1;  // LongRoPE: one choice for the whole call, as the CPU
    try {
        if (n > 1) eval(tokens, n - 1, nullptr);
        begin(tokens + n - 1, 1);
    } catch (...) {
        rope_call_last_ = -1;
        throw;
    }
    rope_call_last_ = -1;
    enqueue_step(kArgmax, &trace);
    n_past_ += 1;
    std::vector<float> host(static_cast<size_t>(plan_.n_vocab));
    logits_.download(host.data(), host.size() * sizeof(float), ctx_.stream());
    if (!plan_.logits_trace.empty()) trace(plan_.logits_trace, host.data(), plan_.n_vocab);
    if (logits) std::copy(host.begin(), host.end(), logits);
}

}  // namespace quern::cuda
