// CudaExecutor set-up (executor.h): the plan's weights uploaded and kept
// resident (Q|K|V and gate|up runs of one type concatenated so that one
// launch reads them; an embedding table of a type get_row lacks dequantized
// to F16), RoPE tables, FP8 conversion (--gpu-weights fp8), expert bq
// layouts, the profile, and the factories of session.h.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/executor.h"
#include "core/error.h"
#include <tuple>

#include "backend/cpu/ops.h"
#include "core/fp16.h"
#include "quant/reference.h"

namespace quern::cuda {
namespace {

/// The weight type of an expert bank (its 3-D tensor's, or its first expert's).
DType bank_type(const ExpertBank& b) { return b.stacked ? b.stacked->type : b.experts[0]->type; }

}  // namespace

int device_count() { return CudaContext::device_count(); }

void CudaExecutor::mark(const char* what) {
    if (!profile_) return;
    cudaEvent_t e;
    QUERN_CUDA_CHECK(cudaEventCreate(&e));
    QUERN_CUDA_CHECK(cudaEventRecord(e, ctx_.stream()));
    marks_.emplace_back(what, e);
}

void CudaExecutor::collect_profile(Profile& prof) {
    if (marks_.empty()) return;
    QUERN_CUDA_CHECK(cudaEventSynchronize(marks_.back().second));
    for (size_t i = 1; i < marks_.size(); ++i) {
        float ms = 0;
        QUERN_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second));
        const std::string name = marks_[i].first;
        auto it = std::find_if(prof.ms.begin(), prof.ms.end(), [&](const auto& p) { return p.first == name; });
        if (it == prof.ms.end()) prof.ms.emplace_back(name, ms);
        else it->second += ms;
    }
    for (auto& m : marks_) cudaEventDestroy(m.second);
    marks_.clear();
    ++prof.count;
}

void CudaExecutor::print_profile(const Profile& p, const char* what) {
    if (p.count == 0) return;
    double total = 0;
    for (const auto& e : p.ms) total += e.second;
    std::fprintf(stderr, "quern: CUDA profile over %lld %s (kernel time between events, us per %s):\n",
                 static_cast<long long>(p.count), what, what);
    for (const auto& e : p.ms)
        std::fprintf(stderr, "  %-12s %9.1f us  %5.1f%%\n", e.first.c_str(), 1000.0 * e.second / p.count,
                     100.0 * e.second / total);
    std::fprintf(stderr, "  %-12s %9.1f us\n", "total", 1000.0 * total / p.count);
    if (p.rows > 0)
        std::fprintf(stderr, "  %lld positions: %.1f tok/s of kernel time\n", static_cast<long long>(p.rows),
                     p.rows / (total / 1000.0));
}

CudaExecutor::CudaExecutor(const Program& program, const SessionOptions& opt) : opt_(opt), ctx_(opt.device) {
    if (const std::string why = cuda_unsupported(program); !why.empty())
        fail("the CUDA backend does not compute {} yet (use --device cpu)", why);
    plan_ = plan_blocks(program);
    const auto& c = plan_;
    if (c.head_dim == 256 && !opt.f16_kv) fail("the CUDA decode attention needs an f16 KV cache for heads of 256");
    levels_ = opt.precise_activations ? 2 : 1;
    profile_ = opt.profile;
    short_ctx_ = std::max<int64_t>(0, opt.short_ctx);
    kv_type_ = opt.f16_kv ? KvType::F16 : KvType::F32;

    size_t free_before = 0, free_after = 0, total_b = 0;
    QUERN_CUDA_CHECK(cudaMemGetInfo(&free_before, &total_b));
    upload_weights();
    QUERN_CUDA_CHECK(cudaMemGetInfo(&free_after, &total_b));
    weight_bytes_ = free_before > free_after ? free_before - free_after : 0;
    make_rope_tables();
    make_lone_state(program);
    if (opt.fp8_weights) {
        // FP8 with per-channel scales (--gpu-weights fp8), converted on the
        // device one matrix at a time.
        // A matrix that does not fit twice (old and new during its
        // conversion) stays as it is, with a note.
        bool kept = false;
        size_t free_fp8 = 0;
        QUERN_CUDA_CHECK(cudaMemGetInfo(&free_fp8, &total_b));
        const auto fp8 = [&](DeviceWeight& w) {
            if (!w.q || !gemm_weight_type_supported(w.type) || w.K % 32 != 0) return;
            try {
                w = to_fp8_rows(w, ctx_.stream());
            } catch (const Error&) {
                cudaGetLastError();
                if (!kept && opt.verbose)
                    std::fprintf(stderr, "quern: not enough GPU memory to convert every matrix to FP8; some keep "
                                         "their own type\n");
                kept = true;
            }
        };
        for_each_layer_matrix(fp8, /*experts=*/true);
        // The weights as held: FP8 codes and scales (about 1.1 bytes a
        // weight) in place of the file's blocks.
        QUERN_CUDA_CHECK(cudaMemGetInfo(&free_after, &total_b));
        weight_bytes_ = weight_bytes_ + free_fp8 > free_after ? weight_bytes_ + free_fp8 - free_after : 0;
    }
    if (c.moe) make_expert_bq();

    // Activations and scratch.
    const auto fbuf = [](int64_t n) { return DeviceBuffer(static_cast<size_t>(n) * sizeof(float)); };
    x_ = fbuf(c.n_embd);
    h_ = fbuf(c.n_embd);
    if (c.post_norms) hpost_ = fbuf(c.n_embd);
    xn_ = fbuf(c.n_embd);
    qkv_ = fbuf(c.q_dim() + 2 * c.kv_dim());
    attn_ = fbuf(c.q_dim());
    // The decode step's expert slots: the chosen experts, then the shared
    // one where the banks hold it.
    const int64_t slots = c.moe ? c.n_expert_used + (shexp_in_banks_ ? 1 : 0) : 0;
    const int64_t moe_ff = slots * c.n_ff_exp;  // gate (or up) of every slot
    const int64_t ff = std::max(c.n_ff, c.n_ff_shexp);
    gu_ = fbuf(2 * std::max(moe_ff, ff));
    ffh_ = fbuf(std::max(moe_ff, ff));
    const int64_t VD = c.delta ? c.delta->value_dim() : 0;
    if (c.delta) {
        sqkv_ = fbuf(c.delta->conv_dim());
        sxc_ = fbuf(c.delta->conv_dim());
        sbaz_ = fbuf(2 * c.delta->n_v_heads + VD);  // [b | a | z]
        sy_ = fbuf(VD);
        syn_ = fbuf(VD);
    }
    if (c.gates) sgate_ = fbuf(c.q_dim());
    if (c.delta || c.gates) sgated_ = fbuf(std::max(c.q_dim(), VD));
    if (c.n_ff_shexp > 0) sshared_ = fbuf(c.n_embd);
    if (c.moe) {
        moe_logits_ = fbuf(c.n_expert);
        moe_ids_ = DeviceBuffer(static_cast<size_t>(slots) * sizeof(int32_t));
        moe_w_ = fbuf(slots);
        moe_y_ = fbuf(slots * c.n_embd);
        xq_moe_ = QuantizedActivation(moe_ff, levels_);
    }
    logits_ = fbuf(c.n_vocab);
    argmax_scratch_ = DeviceBuffer(argmax_scratch_bytes(c.n_vocab));
    xq_embd_ = QuantizedActivation(c.n_embd, levels_);
    // The output projection's input, quantized at its own width: attention's
    // q_dim, a DeltaNet's value_dim (the GEMV checks the width).
    xq_attn_ = QuantizedActivation(c.q_dim(), levels_);
    if (VD > 0) xq_delta_ = QuantizedActivation(VD, levels_);
    if (ff > 0) xq_ff_ = QuantizedActivation(ff, levels_);
    {
        // Every GEMV must read the quantized activation (F8_E4M3_B32, like
        // the float types, reads floats: FP8 models keep the norm launches).
        const auto q8 = [](const Piece& p) { return gemv_takes_quantized_activation(p.w.type); };
        bool all_q = q8(output_);
        for (const auto& L : layers_) {
            for (const auto* ps : {&L.qkv, &L.gate_up})
                for (const Piece& p : *ps) all_q = all_q && q8(p);
            all_q = all_q && q8(L.wo) && q8(L.down);
        }
        // Post-norms normalize a branch's output before its residual
        // add, which the GEMV epilogue cannot do, nor scale it: those
        // models keep the launches. So do expert layers, whose output is a weighted sum of
        // several GEMVs (moe_weighted_sum) rather than one GEMV's epilogue.
        // Gated and DeltaNet layers keep them too: on the 27B hybrid (width
        // 5120: gemv_residual_norm's 160 blocks of 32 rows on 132 SMs) the
        // folded step measured 5 % slower (bench/qwen35-cuda.md).
        fuse_norm_ = all_q && !c.post_norms && !c.branch_scales && !c.moe && !c.gates && !c.hybrid();
        ss_parts_ = fbuf(c.n_embd / 32);
    }
    ctl_ = DeviceBuffer(sizeof(DecodeControl));
    host_ctl_ = PinnedBuffer(sizeof(DecodeControl));
    host_out_ = PinnedBuffer(2 * sizeof(int32_t), cudaHostAllocMapped);
    QUERN_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_out_dev_), host_out_.as<void>(), 0));
    {
        // Batched prefill needs a prefill GEMM for every layer matrix (the
        // output head stays a GEMV: one row) and a head size the prefill
        // attention takes; other models evaluate prompts token by token.
        // Expert layers group their rows by expert (prefill_moe).
        const auto g = [](const Piece& p) { return gemm_weight_type_supported(p.w.type); };
        bool ok = opt.batched_prefill && prefill_attention_head_dim_supported(static_cast<int>(c.head_dim)) &&
                  opt.prefill_chunk >= 1;
        for (const auto& L : layers_) {
            for (const auto* ps : {&L.qkv, &L.attn_gate, &L.delta_baz, &L.sh_gate_up})
                for (const Piece& p : *ps) ok = ok && g(p);
            ok = ok && g(L.wo) && (L.sh_gate_up.empty() || g(L.sh_down));
            if (L.moe) {
                ok = ok && g(L.router) && gemm_weight_type_supported(L.exp_down.type);
                for (const auto& b : L.gate_up_banks(c.n_ff_exp)) ok = ok && gemm_weight_type_supported(b.w->type);
            } else {
                for (const Piece& p : L.gate_up) ok = ok && g(p);
                ok = ok && g(L.down);
            }
        }
        // A draft head's passes all read given rows: its prologue exists only
        // on the rows path.
        if (c.draft()) ok = ok && g(eh_proj_);
        prefill_supported_ = ok;
    }

    sampling_ = DeviceBuffer(sizeof(DeviceSampling));
    host_sampling_ = PinnedBuffer(sizeof(DeviceSampling));
}

int64_t CudaExecutor::make_kv_storage(int64_t n_blocks, int64_t block_size, const char* flag) {
    const auto& c = plan_;
    if (n_blocks < 1 || block_size < 1 || n_blocks * block_size > (int64_t{1} << 30))
        fail("KV cache of {} blocks of {} positions out of range (lower {})", n_blocks, block_size, flag);
    const size_t row = static_cast<size_t>(c.kv_dim()) * (kv_type_ == KvType::F16 ? 2 : 4);
    // The graphs and scratch name the old storage; its memory goes first
    // (engines made in turn on one executor).
    drop_step_graphs();
    clear_batch_graphs();
    kv_ = DeviceBuffer();
    attn_scratch_ = DeviceBuffer();
    n_past_ = 0;
    fed_ = false;
    served_paged_ = false;
    size_t free_b = 0, total_b = 0;
    QUERN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    // Decode attention's partials grow with the context too (bounded by 128
    // splits): counted at their largest.
    KvMemory mem;
    mem.total = static_cast<double>(total_b);
    mem.free = static_cast<double>(free_b);
    mem.weights = static_cast<double>(weight_bytes_);
    mem.layouts = static_cast<double>(batch_copy_bytes_);
    mem.block = 2.0 * static_cast<double>(c.n_kv_layers) * static_cast<double>(block_size) *
                static_cast<double>(row);  // K and V of every layer
    mem.block_positions = static_cast<double>(block_size);
    mem.scratch = static_cast<double>(
        decode_attention_scratch_bytes(1 << 20, static_cast<int>(c.n_head), static_cast<int>(c.head_dim)));
    KvRequest req{n_blocks, opt_.gpu_mem_fraction, opt_.kv_fill, (int64_t{1} << 30) / block_size - 1, flag};
    n_blocks = kv_blocks_to_make(mem, req);
    const size_t layer = static_cast<size_t>((n_blocks + 1) * block_size) * row;
    try {
        kv_ = DeviceBuffer(2 * static_cast<size_t>(c.n_kv_layers) * layer);
    } catch (const Error&) {
        cudaGetLastError();  // what the budget let through still did not fit: say so with its numbers
        throw Error(kv_refusal(mem, n_blocks, flag));
    }
    kv_layer_bytes_ = layer;
    kv_blocks_ = n_blocks;
    kv_block_size_ = block_size;
    n_ctx_ = std::min(n_blocks * block_size, int64_t{1} << 24);  // a lone sequence's positions are int32 on the device
    attn_scratch_ = DeviceBuffer(
        decode_attention_scratch_bytes(static_cast<int>(n_ctx_), static_cast<int>(c.n_head), static_cast<int>(c.head_dim)));
    tokens_ = DeviceBuffer(static_cast<size_t>(n_ctx_ + 1) * sizeof(int32_t));
    host_tokens_ = PinnedBuffer(static_cast<size_t>(n_ctx_ + 1) * sizeof(int32_t));
    // A paged decode step's block table (positions 0 .. n_ctx_ − 1).
    block_shift_ = -1;
    for (int sh = 0; sh <= 24; ++sh)
        if (int64_t{1} << sh == block_size) block_shift_ = sh;
    if (block_shift_ >= 0) {
        const size_t entries = static_cast<size_t>((n_ctx_ >> block_shift_) + 1);
        dtable_ = DeviceBuffer(entries * sizeof(int32_t));
        htable_ = PinnedBuffer(entries * sizeof(int32_t));
    }
    if (opt_.verbose) {
        size_t left = 0;
        QUERN_CUDA_CHECK(cudaMemGetInfo(&left, &total_b));
        std::fprintf(stderr, "quern: CUDA %s: %s\n", ctx_.name().c_str(),
                     kv_budget_summary(mem, n_blocks, static_cast<double>(left), kv_type_ == KvType::F16 ? "f16" : "f32")
                         .c_str());
    }
    return n_blocks;
}

void CudaExecutor::forward(const ForwardBatch& fb) {
    if (!kv_.data()) fail("forward: no KV storage (make_kv_storage first)");
    const auto& c = plan_;
    const int64_t bs = kv_block_size_;
    // Everything is checked before anything runs (as on the CPU).
    bool zero_based = fb.n_seqs == 1;
    for (int i = 0; i < fb.n_seqs; ++i) {
        const SeqBatch& q = fb.seqs[i];
        if (q.n < 1 || !q.tokens || !q.block_table || q.n_past < 0) fail("forward: sequence {} is empty", i);
        for (int64_t j = 0; j < q.n; ++j)
            if (q.tokens[j] < 0 || q.tokens[j] >= c.n_vocab)
                fail("token id {} is outside the vocabulary [0, {})", q.tokens[j], c.n_vocab);
        for (int64_t b = 0; b < (q.n_past + q.n + bs - 1) / bs; ++b) {
            if (q.block_table[b] < 0 || q.block_table[b] >= kv_blocks_)
                fail("forward: sequence {} names block {} of {}", i, q.block_table[b], kv_blocks_);
            zero_based = zero_based && q.block_table[b] == b;
        }
    }
    if (fb.n_seqs == 1 && !fb.invariant && zero_based) return forward_lone(fb.seqs[0], fb.trace);
    for (int i = 0; i < fb.n_seqs; ++i)
        if (c.draft() != (fb.seqs[i].hidden_in != nullptr)) {
            if (c.draft()) fail("forward: sequence {} brings no hidden rows for the draft head", i);
            fail("forward: sequence {} brings given rows this program does not read", i);
        }
    if (c.hybrid())
        for (int i = 0; i < fb.n_seqs; ++i)
            if (fb.seqs[i].state_slot < 0 || fb.seqs[i].state_slot >= n_slots_)
                fail("forward: sequence {} names recurrent-state slot {} of {}", i, fb.seqs[i].state_slot, n_slots_);
    if (fb.trace) fail("forward: a trace needs a lone sequence over blocks 0, 1, 2, ...");
    for (int i = 0; i < fb.n_seqs; ++i)
        if (fb.seqs[i].sampling) fail("forward: device sampling needs a lone sequence over blocks 0, 1, 2, ...");
    if (!batches_ready_) fail("forward: this executor runs one sequence (make it with SessionOptions::batches)");
    if (kv_type_ != KvType::F16) fail("forward: batched passes need an f16 KV cache");
    if (takes_paged_step(fb)) return forward_paged_step(fb.seqs[0]);
    forward_batch(fb.seqs, fb.n_seqs);
}

void CudaExecutor::forward_lone(const SeqBatch& q, const TraceFn* trace) {
    if (served_paged_)
        fail("forward: this executor runs the serving engine's passes; a lone sequence needs an executor of its own");
    if (q.n_past + q.n > n_ctx_)
        fail("context is full: {} tokens in the cache + {} new > context size {} (raise -c)", q.n_past, q.n, n_ctx_);
    if (q.sampling && (q.logits || q.n != 1 || trace))
        fail("forward: device sampling takes one row and returns only the token");
    if (q.n_past != n_past_) {  // the caller truncated (or another pass wrote) the sequence
        n_past_ = q.n_past;
        fed_ = false;
    }
    if (plan_.hybrid()) point_step_state(-1);
    if (q.n_past == 0 && lone_state_.data()) lone_state_.fill_bytes(0, ctx_.stream());  // a new sequence
    float* logits = q.logits;
    if (q.next && !logits && (q.n != 1 || trace || q.hidden || q.hidden_in)) {
        host_logits_.resize(static_cast<size_t>(plan_.n_vocab));
        logits = host_logits_.data();
    }
    if (q.all_logits || q.hidden || q.hidden_in || plan_.draft()) {
        if (trace || q.sampling) fail("forward: a pass with per-row outputs or given rows takes no trace or device sampling");
        SeqBatch r = q;
        r.logits = logits;
        r.all_logits = q.all_logits && q.logits;
        eval_rows(r);
        if (q.next) {
            const float* last = logits + (r.all_logits ? (q.n - 1) * plan_.n_vocab : 0);
            *q.next = static_cast<int32_t>(std::max_element(last, last + plan_.n_vocab) - last);
        }
        return;
    }
    if (trace) {
        eval_traced(q.tokens, q.n, logits, *trace);
    } else if (q.n == 1 && q.next) {
        *q.next = q.sampling ? eval_sample(q.tokens[0], *q.sampling) : eval_greedy(q.tokens[0]);
        if (logits) logits_.download(logits, static_cast<size_t>(plan_.n_vocab) * sizeof(float), ctx_.stream());
        return;
    } else {
        eval(q.tokens, q.n, logits);
    }
    if (q.next) *q.next = static_cast<int32_t>(std::max_element(logits, logits + plan_.n_vocab) - logits);
}

void CudaExecutor::drop_step_graphs() {
    for (auto& by_ctx : graph_)
        for (auto& by_paged : by_ctx)
            for (auto& g : by_paged)
                if (g) cudaGraphExecDestroy(g), g = nullptr;
}

CudaExecutor::~CudaExecutor() {
    drop_step_graphs();
    clear_batch_graphs();
    if (profile_) {
        print_profile(prof_decode_, "step");
        print_profile(prof_prefill_, "chunk");
        print_profile(prof_batch_, "decode batch pass");
        print_profile(prof_batch_prompt_, "prompt batch pass");
        if (prof_batch_.count > 0)
            std::fprintf(stderr, "  host wall time %.1f us per decode batch pass\n", 1000.0 * batch_wall_ms_ / prof_batch_.count);
    }
}

std::vector<Piece> CudaExecutor::upload_group(const std::vector<const Tensor*>& ts) {
    // Runs of consecutive matrices of one type become one concatenated matrix.
    std::vector<Piece> out;
    int64_t offset = 0;
    for (size_t i = 0; i < ts.size();) {
        size_t j = i + 1;
        while (j < ts.size() && ts[j]->type == ts[i]->type && ts[j]->ne[0] == ts[i]->ne[0]) ++j;
        Piece p;
        p.offset = offset;
        if (j == i + 1) {
            p.w = upload_weight(ctx_, *ts[i]);
        } else {
            int64_t rows = 0;
            for (size_t k = i; k < j; ++k) rows += ts[k]->nrows();
            const size_t rb = ts[i]->row_bytes();
            std::vector<uint8_t> cat(rb * static_cast<size_t>(rows));
            size_t at = 0;
            std::string name;
            for (size_t k = i; k < j; ++k) {
                for (int64_t r = 0; r < ts[k]->nrows(); ++r, at += rb) std::memcpy(cat.data() + at, ts[k]->row(r), rb);
                name += (name.empty() ? "" : "+") + ts[k]->name;
            }
            p.w = upload_weight(ctx_, Tensor::contiguous(ts[i]->type, {ts[i]->ne[0], rows, 1, 1}, cat.data(), name));
        }
        offset += p.w.N;
        out.push_back(std::move(p));
        i = j;
    }
    return out;
}

DeviceWeight CudaExecutor::upload_bank(const ExpertBank& b, const Tensor* shared, int64_t il, const char* what) {
    std::vector<const Tensor*> parts = b.stacked ? std::vector<const Tensor*>{b.stacked} : b.experts;
    for (const Tensor* t : parts)
        if (t->type != parts[0]->type)
            fail("layer {}: the {} experts' matrices have different types; the CUDA backend needs one type per bank",
                 il, what);
    if (shared) parts.push_back(shared);  // ne[2] flattened into N: expert e's rows at e·rows, the shared one's last
    return upload_weight(ctx_, parts);
}

DeviceWeight CudaExecutor::upload_gate_up_bank(const ExpertBank& gate, const ExpertBank& up, const Tensor* sh_gate,
                                               const Tensor* sh_up, int64_t il) {
    // Row views of expert e's matrix: a slab of the 3-D tensor, or its own.
    const auto matrices = [&](const ExpertBank& b, const char* what) {
        std::vector<Tensor> m;
        if (b.stacked) {
            for (int64_t e = 0; e < b.stacked->ne[2]; ++e) {
                Tensor t = *b.stacked;
                t.ne[2] = t.ne[3] = 1;
                t.data = b.stacked->row(0, e);
                m.push_back(std::move(t));
            }
        } else {
            for (const Tensor* t : b.experts) m.push_back(*t);
        }
        for (const Tensor& t : m)
            if (t.type != m[0].type || t.ne[2] * t.ne[3] != 1)
                fail("layer {}: the {} experts' matrices have different types or shapes; the CUDA backend needs one "
                     "type per bank",
                     il, what);
        return m;
    };
    const std::vector<Tensor> g = matrices(gate, "gate"), u = matrices(up, "up");
    if (g.size() != u.size()) fail("layer {}: {} gate experts but {} up experts", il, g.size(), u.size());
    std::vector<const Tensor*> parts;
    for (size_t e = 0; e < g.size(); ++e) parts.insert(parts.end(), {&g[e], &u[e]});
    if (sh_gate) parts.insert(parts.end(), {sh_gate, sh_up});
    return upload_weight(ctx_, parts);
}

bool CudaExecutor::shared_expert_in_banks() const {
    const auto& c = plan_;
    if (c.n_ff_shexp == 0 || c.n_ff_shexp != c.n_ff_exp) return false;
    for (const BlockPlanLayer& P : c.layers) {
        if (!P.moe) continue;
        const MoeSpec& m = *P.moe;
        if (!P.shared_expert() || P.shexp_gate_up.size() != 2 || P.act != GluAct::SiLU) return false;
        if (m.gate.bias || m.up.bias || m.down.bias) return false;
        if (P.shexp_gate_up[0].w->type != bank_type(m.gate) || P.shexp_gate_up[1].w->type != bank_type(m.up) ||
            P.shexp_down->type != bank_type(m.down))
            return false;
    }
    return true;
}

std::vector<Piece> CudaExecutor::upload_group(const std::vector<LinearPiece>& ps) {
    std::vector<const Tensor*> ts;
    for (const LinearPiece& p : ps) ts.push_back(p.w);
    return upload_group(ts);
}

const float* CudaExecutor::upload_f32(const Tensor& t) {
    if (t.type == DType::F32) {
        DeviceBuffer b(t.nbytes());
        b.upload(t.data, t.nbytes(), ctx_.stream());
        owned_.push_back(std::move(b));
        return owned_.back().as<float>();
    }
    std::vector<float> v(static_cast<size_t>(t.nelements()));
    for (int64_t r = 0; r < t.nrows(); ++r) dequantize_row_ref(t.type, t.row(r), v.data() + r * t.ne[0], t.ne[0]);
    DeviceBuffer b(v.size() * sizeof(float));
    b.upload(v.data(), v.size() * sizeof(float), ctx_.stream());  // staged before it returns: v may go
    owned_.push_back(std::move(b));
    return owned_.back().as<float>();
}

void CudaExecutor::upload_weights() {
    const auto& c = plan_;
    const Tensor& emb = *c.embd;
    if (cuda_get_row_type_supported(emb.type)) {
        DeviceBuffer b(emb.nbytes());
        b.upload(emb.data, emb.nbytes(), ctx_.stream());
        embd_type_ = emb.type;
        owned_.push_back(std::move(b));
    } else {
        std::vector<uint16_t> f16(static_cast<size_t>(emb.nelements()));
        std::vector<float> row(static_cast<size_t>(emb.ne[0]));
        for (int64_t r = 0; r < emb.nrows(); ++r) {
            dequantize_row_ref(emb.type, emb.row(r), row.data(), emb.ne[0]);
            for (int64_t i = 0; i < emb.ne[0]; ++i)
                f16[static_cast<size_t>(r * emb.ne[0] + i)] = fp32_to_fp16(row[static_cast<size_t>(i)]);
        }
        DeviceBuffer b(f16.size() * 2);
        b.upload(f16.data(), f16.size() * 2, ctx_.stream());
        embd_type_ = DType::F16;
        owned_.push_back(std::move(b));
    }
    embd_ = owned_.back().data();
    out_norm_ = upload_f32(*c.out_norm);
    output_.w = upload_weight(ctx_, *c.output);
    if (c.draft()) {
        nextn_enorm_ = upload_f32(*c.nextn_enorm);
        nextn_hnorm_ = upload_f32(*c.nextn_hnorm);
        eh_proj_.w = upload_weight(ctx_, *c.nextn_eh_proj);
    }

    shexp_in_banks_ = shared_expert_in_banks();
    layers_.resize(static_cast<size_t>(c.n_layer));
    for (int64_t il = 0; il < c.n_layer; ++il) {
        const BlockPlanLayer& P = c.layers[static_cast<size_t>(il)];
        LayerWeights& L = layers_[static_cast<size_t>(il)];
        L.attn_norm = upload_f32(*P.attn_norm);
        upload_hybrid(P, L);
        L.ffn_norm = upload_f32(*P.ffn_norm);
        // Row slices of one fused matrix (Phi-3's attn_qkv, ffn_up) become
        // that matrix again: runs of one type are concatenated.
        L.qkv = upload_group(P.qkv);
        L.wo.w = upload_weight(ctx_, *P.wo);
        if (P.moe) {
            L.moe = true;
            L.router.w = upload_weight(ctx_, *P.moe->router);
            const bool sh = shexp_in_banks_;
            const Tensor* sh_gate = sh ? P.shexp_gate_up[0].w : nullptr;
            const Tensor* sh_up = sh ? P.shexp_gate_up[1].w : nullptr;
            if (bank_type(P.moe->gate) == bank_type(P.moe->up)) {
                L.exp_gate_up = upload_gate_up_bank(P.moe->gate, P.moe->up, sh_gate, sh_up, il);
            } else {
                L.exp_gate = upload_bank(P.moe->gate, sh_gate, il, "gate");
                L.exp_up = upload_bank(P.moe->up, sh_up, il, "up");
            }
            L.exp_down = upload_bank(P.moe->down, sh ? P.shexp_down : nullptr, il, "down");
        } else {
            L.gate_up = upload_group(P.gate_up);
            L.down.w = upload_weight(ctx_, *P.down);
        }
        if (P.qkv_bias()) {
            std::vector<float> b;
            for (const LinearPiece& pc : P.qkv) {
                const auto* d = static_cast<const float*>(pc.bias->data);
                b.insert(b.end(), d, d + pc.bias->nelements());
            }
            DeviceBuffer db(b.size() * sizeof(float));
            db.upload(b.data(), b.size() * sizeof(float), ctx_.stream());
            owned_.push_back(std::move(db));
            L.qkv_bias = owned_.back().as<float>();
        }
        if (P.attn && P.attn->q_norm) L.q_norm = upload_f32(*P.attn->q_norm);
        if (P.attn && P.attn->k_norm) L.k_norm = upload_f32(*P.attn->k_norm);
        if (P.post_attn_norm) L.post_attn_norm = upload_f32(*P.post_attn_norm);
        if (P.post_ffn_norm) L.post_ffn_norm = upload_f32(*P.post_ffn_norm);
    }
}

void CudaExecutor::make_rope_tables() {
    // One device table per distinct (dim, base, factors); LongRoPE layers
    // share one live table that select_rope() fills with the short or the
    // long one.
    std::map<std::tuple<int, float, const float*>, const float*> tables;
    const auto table = [&](int dim, float base, const float* factors) {
        const float*& t = tables[{dim, base, factors}];
        if (!t) {
            std::vector<float> inv(static_cast<size_t>(std::max(1, dim / 2)), 0.0f);
            cpu::rope_inv_freq(dim, base, factors, inv.data());
            DeviceBuffer b(inv.size() * sizeof(float));
            b.upload(inv.data(), inv.size() * sizeof(float), ctx_.stream());
            owned_.push_back(std::move(b));
            t = owned_.back().as<float>();
        }
        return t;
    };
    for (const BlockPlanLayer& P : plan_.layers) {
        if (!P.attn) {  // a DeltaNet layer
            inv_freq_.push_back(nullptr);
            continue;
        }
        const RopeSpec& r = P.attn->rope;
        if (!r.long_factors) {
            inv_freq_.push_back(table(r.dim, r.base, r.factors));
            continue;
        }
        const float* sh = table(r.dim, r.base, r.factors);
        const float* lg = table(r.dim, r.base, r.long_factors);
        if (rope_live_ && (sh != rope_short_ || lg != rope_long_ || r.long_from != rope_long_from_))
            fail("layers with different LongRoPE tables are not supported by the CUDA backend");
        if (!rope_live_) {
            rope_short_ = sh, rope_long_ = lg, rope_long_from_ = r.long_from, rope_long_dim_ = r.dim;
            DeviceBuffer b(static_cast<size_t>(std::max(1, r.dim / 2)) * sizeof(float));
            QUERN_CUDA_CHECK(cudaMemcpyAsync(b.data(), sh, b.size(), cudaMemcpyDeviceToDevice, ctx_.stream()));
            owned_.push_back(std::move(b));
            rope_live_ = owned_.back().as<float>();
        }
        inv_freq_.push_back(rope_live_);
    }
}

// bq layouts of the expert banks (5.5 or 11 bits per weight, on top of the
// banks themselves), which the grouped expert products of a prompt chunk
// read instead of decoding the bank's own layout (prefill_moe: on an H200
// bq_gemm_grouped is the faster of the two for the types it takes). Made
// after every weight is uploaded, bank by bank while half of the GPU's
// memory stays free (for the KV cache and the rest); a bank without one
// (another type, or no room) goes through dq_gemm_grouped.
void CudaExecutor::make_expert_bq() {
    const auto& c = plan_;
    for (auto& L : layers_) {
        const std::pair<DeviceWeight*, int64_t> banks[] = {{&L.exp_gate_up, 2 * c.n_ff_exp},
                                                             {&L.exp_gate, c.n_ff_exp},
                                                             {&L.exp_up, c.n_ff_exp},
                                                             {&L.exp_down, c.n_embd}};
        for (const auto& [b, rows] : banks) {
            if (!b->q || b->bq || rows % 16 != 0 || !bq_supported(b->type, b->K)) continue;
            size_t free_b = 0, total_b = 0;
            QUERN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
            if (free_b < bq_bytes(*b) + total_b / 2) return;
            try {
                make_resident_bq(*b, ctx_.stream());
            } catch (const Error&) {
                cudaGetLastError();
                b->bq_buf = DeviceBuffer(), b->bq = nullptr, b->bq_bits = 0;
                return;
            }
        }
    }
}

namespace {

/// quern::Error unless GPU opt.device exists (saying what to do instead).
void require_device(const SessionOptions& opt) {
    const int found = CudaContext::device_count();
    if (found < opt.device + 1)
        fail("{}; use --device cpu (or --device auto, which runs on the CPU when there is no GPU)",
             found == 0 ? std::string("no CUDA GPU found")
                        : fmt::format("CUDA device {} is not available ({} found)", opt.device, found));
}

}  // namespace

std::unique_ptr<Executor> make_executor(const Program& program, const SessionOptions& opt) {
    require_device(opt);
    SessionOptions o = opt;
    if (o.batches) o.batched_prefill = true;
    auto s = std::make_unique<CudaExecutor>(program, o);
    if (o.batches) s->prepare_batches();
    return s;
}

}  // namespace quern::cuda
