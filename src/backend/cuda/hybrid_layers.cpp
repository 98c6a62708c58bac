// The layers of hybrid programs on the GPU (BlockPlan's DeltaNet mixer,
// gated attention and shared experts): their weights, the recurrent state
// of the lone sequence and of the batch runner's slots, and their part of
// the decode step (one row, GEMVs) and of layer_rows (many rows, GEMMs).
//
// A DeltaNet layer, after the layer's RMSNorm:
//   [q|k|v], z, [b|a] = projections of the normed row(s)     GEMV ([q|k|v] and z: gemv_pair) / PrefillGemm
//   conv over the sequence's conv state, SiLU, q/k L2 norm   delta_conv (delta_rule.h)
//   gated delta rule over the sequence's state               delta_rule
//   y = RMSNorm per value head; g = SiLU(z) · y               gated_rms_norm_q8_1 (decode; heads of 32k ≤
//                                                             1024, else rms_norm_groups, swiglu_q8_1) /
//                                                             rms_norm_groups, glu_rows_bf16 (rows)
//   h = W_out · g                                            (the attention path's output projection)
// Gated attention multiplies the attention output by sigmoid(W_gate · x)
// before the output projection; a shared expert adds sigmoid(w · x) ·
// down(SiLU(gate · x) · up · x) to the routed experts' sum.
//
// The kernels read each sequence's rows and state from DeltaSeqs arrays in
// device memory, so the captured decode step and batch graphs replay with
// whatever the host uploaded before them (set_batch_delta).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/executor.h"
#include "core/error.h"

namespace quern::cuda {

void CudaExecutor::upload_hybrid(const BlockPlanLayer& P, LayerWeights& L) {
    if (!P.attn_gate.empty()) L.attn_gate = upload_group(P.attn_gate);
    if (const DeltaNetSpec* d = P.delta) {
        L.delta = true;
        // [b | a | z]: the three input projections besides [q|k|v] as one
        // matrix where they share a type, so that a decode step reads all
        // four in one launch (gemv_pair with [q|k|v]).
        std::vector<const Tensor*> baz;
        for (const LinearPiece& p : P.delta_ba) baz.push_back(p.w);
        baz.push_back(P.delta_z);
        L.delta_baz = upload_group(baz);
        L.delta_norm = upload_f32(*P.delta_norm);
        L.dl = DeltaLayer{d->n_k_heads,         d->n_v_heads,         d->head_k,
                          d->head_v,            d->conv_kernel,       d->kv_tiled,
                          upload_f32(*d->conv), upload_f32(*d->a_coef), upload_f32(*d->dt_bias)};
    }
    if (P.shared_expert()) {
        L.sh_gate_up = upload_group(P.shexp_gate_up);
        L.sh_down.w = upload_weight(ctx_, *P.shexp_down);
        L.sh_gate = upload_f32(*P.shexp_gate);
    }
}

void CudaExecutor::make_lone_state(const Program& program) {
    const auto& c = plan_;
    state_floats_ = program.state_floats();
    if (!c.hybrid()) return;
    std::vector<int64_t> offsets;
    for (size_t il = 0; il < layers_.size(); ++il) {
        LayerWeights& L = layers_[il];
        if (!L.delta) continue;
        L.delta_index = n_delta_++;
        L.state_offset = program.state_offset(c.layers[il].delta->state_layer);
        offsets.push_back(L.state_offset);
    }
    const size_t bytes = static_cast<size_t>(state_floats_) * sizeof(float);
    lone_state_ = DeviceBuffer(bytes);
    lone_saved_ = DeviceBuffer(bytes);
    lone_state_.fill_bytes(0, ctx_.stream());
    // [row0 0 | 1 | chunk rows | pad | state pointers]
    dlone_ = DeviceBuffer(16 + offsets.size() * sizeof(float*));
    std::vector<uint8_t> host(dlone_.size());
    const int32_t head[4] = {0, 1, 1, 0};
    std::memcpy(host.data(), head, 16);
    for (size_t j = 0; j < offsets.size(); ++j) {
        float* p = lone_state_.as<float>() + offsets[j];
        std::memcpy(host.data() + 16 + j * sizeof(float*), &p, sizeof p);
    }
    dlone_.upload(host.data(), host.size(), ctx_.stream());
    ctx_.synchronize();
    const auto* d = dlone_.as<int32_t>();
    auto* const* ptrs = reinterpret_cast<float* const*>(dlone_.as<uint8_t>() + 16);
    for (int j = 0; j < n_delta_; ++j) {
        step_delta_.push_back(DeltaSeqs{d, d + 1, ptrs + j, 1});
        lone_rows_delta_.push_back(DeltaSeqs{d, d + 2, ptrs + j, 1});
    }
}

void CudaExecutor::make_state_slots(int64_t n) {
    if (n <= 0) return;
    if (!plan_.hybrid()) fail("make_state_slots: the program keeps no recurrent state");
    const size_t per = static_cast<size_t>(state_floats_) * sizeof(float);
    point_step_state(-1);  // the decode step's pointers leave the old slots
    slots_ = DeviceBuffer();
    try {
        slots_ = DeviceBuffer(per * static_cast<size_t>(n + 1));  // + the padding rows' spare slot
    } catch (const Error&) {
        cudaGetLastError();
        fail("the recurrent state of {} sequences needs {:.2f} GiB of GPU memory (lower --parallel)", n,
             gib(static_cast<double>(per) * static_cast<double>(n + 1)));
    }
    slots_.fill_bytes(0, ctx_.stream());
    n_slots_ = n;
}

void CudaExecutor::copy_state_slot(int32_t from, int32_t to) {
    if (from < 0 || to < 0 || from >= n_slots_ || to >= n_slots_)
        fail("copy_state_slot: slots {} -> {} outside the {} made", from, to, n_slots_);
    const size_t per = static_cast<size_t>(state_floats_) * sizeof(float);
    QUERN_CUDA_CHECK(cudaMemcpyAsync(slots_.as<uint8_t>() + per * static_cast<size_t>(to),
                                     slots_.as<uint8_t>() + per * static_cast<size_t>(from), per,
                                     cudaMemcpyDeviceToDevice, ctx_.stream()));
}

void CudaExecutor::save_lone_state() {
    if (!plan_.hybrid()) fail("this program keeps no recurrent state to save");
    QUERN_CUDA_CHECK(cudaMemcpyAsync(lone_saved_.data(), lone_state_.data(), lone_state_.size(),
                                     cudaMemcpyDeviceToDevice, ctx_.stream()));
}

void CudaExecutor::restore_lone_state() {
    if (!plan_.hybrid()) fail("this program keeps no recurrent state to restore");
    QUERN_CUDA_CHECK(cudaMemcpyAsync(lone_state_.data(), lone_saved_.data(), lone_state_.size(),
                                     cudaMemcpyDeviceToDevice, ctx_.stream()));
    fed_ = false;
}

void CudaExecutor::ensure_row_states(int64_t rows) {
    if (rows <= snap_rows_) return;
    const size_t per = static_cast<size_t>(state_floats_) * sizeof(float);
    snap_ = DeviceBuffer();
    snap_rows_ = 0;
    try {
        snap_ = DeviceBuffer(per * static_cast<size_t>(rows));
    } catch (const Error&) {
        cudaGetLastError();
        fail("keeping the recurrent state of {} verified rows needs {:.2f} GiB of GPU memory (lower --spec-draft)", rows,
             gib(static_cast<double>(per) * static_cast<double>(rows)));
    }
    snap_rows_ = rows;
    // Per DeltaNet layer its part of snapshot row 0 (rows follow every
    // state_floats_), beside the lone state's pointers of lone_rows_delta_.
    std::vector<float*> ptrs;
    for (const LayerWeights& L : layers_)
        if (L.delta) ptrs.push_back(snap_.as<float>() + L.state_offset);
    if (!dsnap_.data()) dsnap_ = DeviceBuffer(ptrs.size() * sizeof(float*));
    dsnap_.upload(ptrs.data(), ptrs.size() * sizeof(float*), ctx_.stream());
    lone_snap_delta_ = lone_rows_delta_;
    auto* const* dp = dsnap_.as<float* const>();
    for (size_t j = 0; j < lone_snap_delta_.size(); ++j) {
        lone_snap_delta_[j].snap = dp + j;
        lone_snap_delta_[j].snap_stride = state_floats_;
    }
}

void CudaExecutor::keep_lone_rows(int64_t m) {
    if (snap_n_ <= 0 || n_past_ != snap_pos_ + snap_n_ || m < 1 || m > snap_n_)
        fail("keep_lone_rows: {} rows of a pass that kept no per-row state (or of {} rows)", m, snap_n_);
    if (m < snap_n_) {
        const size_t per = static_cast<size_t>(state_floats_) * sizeof(float);
        QUERN_CUDA_CHECK(cudaMemcpyAsync(lone_state_.data(), snap_.as<uint8_t>() + per * static_cast<size_t>(m - 1), per,
                                         cudaMemcpyDeviceToDevice, ctx_.stream()));
        n_past_ = snap_pos_ + m;
        fed_ = false;
    }
    snap_n_ = 0;
}

void CudaExecutor::set_batch_delta(const SeqBatch* seqs, const std::vector<BatchSegment>& segs, int64_t n_pad) {
    // Sequences: one per segment, then one per padding row (one row each,
    // on the spare slot, which make_state_slots zeroed: what padding rows
    // leave there stays finite — the decay is below 1 and k unit-length — and
    // they read nothing else, so it needs no zeroing per pass).
    const auto S = static_cast<int64_t>(segs.size()) + n_pad;
    const size_t per = static_cast<size_t>(state_floats_) * sizeof(float);
    auto* base = slots_.as<uint8_t>();
    const auto slot_ptr = [&](int64_t i) {
        const int64_t slot = i < static_cast<int64_t>(segs.size()) ? seqs[segs[static_cast<size_t>(i)].seq].state_slot
                                                                   : n_slots_;
        return base + per * static_cast<size_t>(slot);
    };
    const cudaStream_t s = ctx_.stream();
    for (size_t i = 0; i < segs.size(); ++i) {
        const SeqBatch& q = seqs[segs[i].seq];
        if (q.n_past + segs[i].off == 0) QUERN_CUDA_CHECK(cudaMemsetAsync(slot_ptr(static_cast<int64_t>(i)), 0, per, s));
    }
    // [row0 (S) | n_rows (S) | per DeltaNet layer S state pointers]
    const size_t bytes = static_cast<size_t>(S) * (8 + sizeof(float*) * static_cast<size_t>(n_delta_));
    if (bdelta_.size() < bytes) fail("a batch pass of {} sequences exceeds the DeltaNet arrays", S);
    bdelta_host_.resize((bytes + 3) / 4);
    auto* h = bdelta_host_.data();
    int32_t r0 = 0;
    for (int64_t i = 0; i < S; ++i) {
        const auto rows = static_cast<int32_t>(i < static_cast<int64_t>(segs.size()) ? segs[static_cast<size_t>(i)].n : 1);
        h[i] = r0;
        h[S + i] = rows;
        r0 += rows;
    }
    auto* hp = reinterpret_cast<uint8_t*>(h) + 8 * S;
    batch_delta_.clear();
    const auto* d = bdelta_.as<int32_t>();
    auto* const* dp = reinterpret_cast<float* const*>(bdelta_.as<uint8_t>() + 8 * S);
    for (const LayerWeights& L : layers_) {
        if (!L.delta) continue;
        for (int64_t i = 0; i < S; ++i) {
            auto* p = reinterpret_cast<float*>(slot_ptr(i)) + L.state_offset;
            std::memcpy(hp + (static_cast<size_t>(L.delta_index) * S + i) * sizeof(float*), &p, sizeof p);
        }
        batch_delta_.push_back(DeltaSeqs{d, d + S, dp + static_cast<int64_t>(L.delta_index) * S, static_cast<int>(S)});
    }
    rows_delta_ = batch_delta_.data();
    QUERN_CUDA_CHECK(cudaMemcpyAsync(bdelta_.data(), h, bytes, cudaMemcpyHostToDevice, s));
}

const float* CudaExecutor::step_delta(const LayerWeights& L) {
    const auto& c = plan_;
    const cudaStream_t s = ctx_.stream();
    const DeltaLayer& D = L.dl;
    const int64_t VD = int64_t{D.n_v_heads} * D.head_v;
    const auto q8 = [](const std::vector<Piece>& ps) {
        return ps.size() == 1 && gemv_takes_quantized_activation(ps[0].w.type);
    };
    float* ba = sbaz_.as<float>();  // [b | a | z]
    float* z = ba + 2 * D.n_v_heads;
    if (q8(L.qkv) && q8(L.delta_baz)) {
        // One launch where gemv_pair has a kernel for the two types: Q4_K
        // first (Q4_K_M gives [q|k|v] Q6_K on some layers, attn_v's rule).
        const DeviceWeight &Wq = L.qkv[0].w, &Wb = L.delta_baz[0].w;
        if (Wq.type == DType::Q6_K) gemv_pair(ctx_, Wb, ba, Wq, sqkv_.as<float>(), xq_embd_);
        else gemv_pair(ctx_, Wq, sqkv_.as<float>(), Wb, ba, xq_embd_);
    } else {
        const float* xn = xn_.as<float>();
        for (const Piece& p : L.qkv) mm(p, xn, xq_embd_, sqkv_.as<float>());
        for (const Piece& p : L.delta_baz) mm(p, xn, xq_embd_, ba);
    }
    mark("gemv_qkv");
    const DeltaSeqs& q = step_delta_[static_cast<size_t>(L.delta_index)];
    if (!skipped("delta")) {
        delta_conv(sqkv_.as<float>(), sxc_.as<float>(), 1, q, D, s);
        delta_rule(sxc_.as<float>(), ba, sy_.as<float>(), 1, q, D, s);
    }
    mark("delta_rule");
    // QUERN_CUDA_SKIP=dnorm (timing only) leaves the gate's output as the last step left it.
    const bool one_launch = D.head_v % 32 == 0 && D.head_v <= 1024;
    if (!skipped("dnorm") && one_launch) {
        gated_rms_norm_q8_1(sy_.as<float>(), L.delta_norm, z, sgated_.as<float>(), xq_delta_.q(),
                            xq_delta_.info(), xq_delta_.q2(), xq_delta_.info2(), VD, D.head_v, c.rms_eps, s);
    } else if (!skipped("dnorm")) {
        rms_norm_groups(sy_.as<float>(), L.delta_norm, syn_.as<float>(), VD, 1, VD, D.head_v, c.rms_eps, s);
        swiglu_q8_1(z, syn_.as<float>(), sgated_.as<float>(), xq_delta_.q(), xq_delta_.info(), VD, s,
                    xq_delta_.q2(), xq_delta_.info2(), kGateSiLU);
    }
    mark("gate");
    return sgated_.as<float>();
}

const float* CudaExecutor::step_attn_gate(const LayerWeights& L) {
    const cudaStream_t s = ctx_.stream();
    for (const Piece& p : L.attn_gate) mm(p, xn_.as<float>(), xq_embd_, sgate_.as<float>());
    swiglu_q8_1(sgate_.as<float>(), attn_.as<float>(), sgated_.as<float>(), xq_attn_.q(), xq_attn_.info(),
                plan_.q_dim(), s, xq_attn_.q2(), xq_attn_.info2(), kGateSigmoid);
    mark("gate");
    return sgated_.as<float>();
}

void CudaExecutor::step_shared_expert(const LayerWeights& L) {
    const auto& c = plan_;
    const cudaStream_t s = ctx_.stream();
    const int64_t F = c.n_ff_shexp;
    float* g = gu_.as<float>();
    for (const Piece& p : L.sh_gate_up) mm(p, xn_.as<float>(), xq_embd_, g);
    swiglu_q8_1(g, g + F, ffh_.as<float>(), xq_ff_.q(), xq_ff_.info(), F, s, xq_ff_.q2(), xq_ff_.info2(), kGateSiLU);
    mm(L.sh_down, ffh_.as<float>(), xq_ff_, sshared_.as<float>());
    add_sigmoid_gated(xn_.as<float>(), L.sh_gate, sshared_.as<float>(), h_.as<float>(), 1, c.n_embd, s);
    mark("shared_expert");
}

void CudaExecutor::rows_delta(const LayerWeights& L, int64_t n, uint16_t* xb, float* H) {
    const auto& c = plan_;
    const cudaStream_t s = ctx_.stream();
    const DeltaLayer& D = L.dl;
    const int64_t C = D.conv_dim(), VD = int64_t{D.n_v_heads} * D.head_v, BA = 2 * int64_t{D.n_v_heads};
    float* QKV = pqkv_.as<float>();
    float* ZY = pzy_.as<float>();  // [z | normed y] per row
    for (const Piece& p : L.qkv) gemm_->run_bf16(p.w, xb, n, QKV + p.offset, C, s);
    // Each piece's outputs of the [b | a | z] row: its b|a rows into pba_,
    // its z rows into ZY's z half.
    for (const Piece& p : L.delta_baz) {
        const int64_t end = p.offset + p.w.N, ba_end = std::min(end, BA);
        if (p.offset < BA)
            gemm_->run_bf16_rows(p.w, 0, ba_end - p.offset, xb, n, pba_.as<float>() + p.offset, BA, s);
        const int64_t z0 = std::max(p.offset, BA);
        if (end > z0) gemm_->run_bf16_rows(p.w, z0 - p.offset, end - z0, xb, n, ZY + (z0 - BA), 2 * VD, s);
    }
    mark("gemm_qkv");
    const DeltaSeqs& q = rows_delta_[L.delta_index];
    delta_conv(QKV, pxc_.as<float>(), n, q, D, s);
    delta_rule(pxc_.as<float>(), pba_.as<float>(), py_.as<float>(), n, q, D, s);
    mark("delta_rule");
    rms_norm_groups(py_.as<float>(), L.delta_norm, ZY + VD, 2 * VD, n, VD, D.head_v, c.rms_eps, s);
    glu_rows_bf16(ZY, 2 * VD, n, VD, xb, kGateSiLU, s);
    mark("gate");
    gemm_->run_bf16(L.wo.w, xb, n, H, c.n_embd, s);
}

void CudaExecutor::rows_shared_expert(const LayerWeights& L, int64_t n, const uint16_t* xb, float* H) {
    const auto& c = plan_;
    const cudaStream_t s = ctx_.stream();
    const int64_t F = c.n_ff_shexp;
    float* GU = pgu_.as<float>();
    for (const Piece& p : L.sh_gate_up) gemm_->run_bf16(p.w, xb, n, GU + p.offset, 2 * F, s);
    glu_rows_bf16(GU, 2 * F, n, F, psh_g_.as<uint16_t>(), kGateSiLU, s);
    gemm_->run_bf16(L.sh_down.w, psh_g_.as<uint16_t>(), n, psh_y_.as<float>(), c.n_embd, s);
    add_sigmoid_gated(xb, L.sh_gate, psh_y_.as<float>(), H, n, c.n_embd, s);
    mark("shared_expert");
}

}  // namespace quern::cuda
