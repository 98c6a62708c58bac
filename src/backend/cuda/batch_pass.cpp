// Batches of many sequences (the serving engine's passes through
// Executor::forward): resident copies of the weights for passes of many rows,
// and each pass — its rows laid out on the device, replayed from
// a CUDA graph when every sequence brings one row (decode steps), the output
// head on the rows that want logits.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/executor.h"
#include "backend/cuda/qw_gemm.h"
#include "backend/cuda/tuning.h"
#include "core/error.h"
#include <chrono>

namespace quern::cuda {

void CudaExecutor::prepare_batches() {
    if (batches_ready_) return;
    batch_runner_ = true;
    if (!prefill_supported_ || !ensure_prefill_scratch())
        fail("no batched GPU path for this model (a weight type without a GPU GEMM, heads of {} elements, or no "
             "GPU memory for the pass scratch); serve it with --device cpu",
             plan_.head_dim);
    // The head's buffers (up to 256 rows at a time) before the copies below.
    bhead_x_ = DeviceBuffer(static_cast<size_t>(kHeadRows * plan_.n_embd) * 2);
    // Scratch for attention with the keys split across blocks (up to 8
    // ranges for passes of up to kSplitRows rows: decode steps).
    bsplit_floats_ = kSplitRows * plan_.n_head * 8 * (plan_.head_dim + 2);
    bsplit_ = DeviceBuffer(static_cast<size_t>(bsplit_floats_) * 4);
    blogits_ = DeviceBuffer(static_cast<size_t>(kHeadRows * plan_.n_vocab) * 4);
    bgreedy_ = DeviceBuffer(kHeadRows * 4);
    bargmax_ = DeviceBuffer(argmax_rows_scratch_bytes(kHeadRows));
    hgreedy_ = PinnedBuffer(kHeadRows * 4);
    // A pass's DeltaNet arrays (set_batch_delta): at most one sequence per row.
    if (plan_.hybrid())
        bdelta_ = DeviceBuffer(static_cast<size_t>(prefill_rows_) * (8 + sizeof(float*) * static_cast<size_t>(n_delta_)));
    // Resident BF16 copies of the dense matrices and the output head: every
    // pass multiplies them directly instead of dequantizing the model again
    // (expert banks stay quantized: too large to double). A quarter of the
    // GPU's memory stays free for the KV cache and the passes' scratch; the
    // copies stop at the first that would not leave it, and the rest are
    // dequantized per pass as the prefill does.
    // First the small-batch (bq) layouts: passes of few rows read those
    // instead of the 16-bit copies (on an H200 decode of one sequence in a
    // batch runs 1.3× faster, of 8 1.26×), and where no BF16 copy fits,
    // passes of up to 64 rows. Matrices qw_gemm multiplies from their
    // resident layout (PrefillGemm::qw_weight: Q4_K and Q6_K where sm_90a
    // runs, with Tuning::qw or marked by choose_copy_free when the copies
    // would not all fit) get neither: no second copy of them.
    const bool copy_free = choose_copy_free();
    const size_t bq_total = make_small_layouts();
    size_t bytes = bq_total;  // all copies
    size_t free_b = 0, total_b = 0;
    QUERN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    free_b += bq_total;  // measured after the bq layouts
    const size_t keep = total_b / 4;
    const auto copy_if_room = [&](bool& room, size_t need, const auto& make) {
        copy_while_room(room, bytes, free_b, keep, need, make);
    };
    bool full = true;
    // The Q|K|V and the gate|up pieces of a layer share one copy, rows
    // stacked in output order: one GEMM per group instead of one per piece
    // (at 32 rows the three products of 4096, 1024 and 1024 rows cost ~2.4×
    // one of 6144). Passes the pieces' bq layouts take multiply piece by
    // piece, except Q|K|V past 16 rows (layer_rows).
    const auto fuse = [&](std::vector<Piece>& ps, DeviceWeight& fused) {
        if (!full || ps.size() < 2) return;
        int64_t rows = 0;
        for (const Piece& p : ps) {
            if (!p.w.q || p.w.bf16 || p.w.fp8_row_scaled || !gemm_weight_type_supported(p.w.type) ||
                PrefillGemm::qw_weight(p.w) || p.w.K != ps[0].w.K || p.offset != rows)
                return;
            rows += p.w.N;
        }
        const int64_t K = ps[0].w.K;
        copy_if_room(full, static_cast<size_t>(rows * K) * 2, [&] {
            DeviceBuffer b(static_cast<size_t>(rows * K) * 2);
            for (Piece& p : ps) {
                uint16_t* at = b.as<uint16_t>() + p.offset * K;
                dequantize_weight_bf16(p.w, 0, p.w.N, at, ctx_.stream());
                p.w.bf16 = at;  // owned by `fused`
            }
            ctx_.synchronize();
            fused.type = DType::BF16;
            fused.K = K;
            fused.N = rows;
            fused.bf16_buf = std::move(b);
            fused.bf16 = fused.bf16_buf.as<uint16_t>();
            fused.q = fused.bf16_buf.data();
        });
    };
    for (auto& L : layers_) {
        fuse(L.qkv, L.qkv_bf16);
        fuse(L.gate_up, L.gate_up_bf16);
    }
    const auto resident = [&](DeviceWeight& w) {
        if (!w.q || w.bf16 || w.fp8_row_scaled || !gemm_weight_type_supported(w.type) || PrefillGemm::qw_weight(w))
            return;
        copy_if_room(full, static_cast<size_t>(w.N * w.K) * 2, [&] { make_resident_bf16(w, ctx_.stream()); });
    };
    for_each_layer_matrix(resident, /*experts=*/false);
    for (auto& L : layers_)
        if (L.moe) resident(L.router.w);
    resident(output_.w);
    if (eh_proj_.w.q) resident(eh_proj_.w);
    // Graphs for passes of single rows, where no product of such a pass
    // dequantizes tiles on the second stream (the products' own streams and
    // events would fall outside the graph) and expert layers group on the
    // device (no host round trip inside).
    {
        bool copies = true, small = true;
        const auto check = [&](DeviceWeight& w) {
            if (!w.q || w.fp8_row_scaled) return;
            copies = copies && (w.bf16 || PrefillGemm::qw_weight(w));
            small = small && (w.bf16 || w.bq || PrefillGemm::qw_weight(w));
        };
        for_each_layer_matrix(check, /*experts=*/false);
        check(eh_proj_.w);
        bool grouped = true;
        for (auto& L : layers_) {
            if (!L.moe) continue;
            check(L.router.w);
            grouped = grouped && moe_on_device(L);
        }
        graph_rows_ = (!opt_.cuda_graph || !grouped) ? 0 : copies ? kGraphRows : small ? kBqMaxRows : 0;
        graph_rows_ = std::min(graph_rows_, prefill_rows_);
        if (graph_rows_ > 0) bgints_ = DeviceBuffer(static_cast<size_t>(kGraphInts) * 4);
    }
    batch_copy_bytes_ = bytes;
    if (opt_.verbose && bq_total > 0)
        std::fprintf(stderr, "quern: %.2f GiB of small-batch weight layouts on the GPU\n", gib(static_cast<double>(bq_total)));
    if (opt_.verbose && !copy_free)
        std::fprintf(stderr, "quern: %.2f GiB of BF16 weight copies on the GPU for batches%s\n", gib(static_cast<double>(bytes - bq_total)),
                     full ? "" : " (no more fit beside a free quarter of GPU memory: the rest are dequantized per pass)");
    batches_ready_ = true;
}

bool CudaExecutor::choose_copy_free() {
    if (tuning().qw != 0 || small_layouts_) return false;
    size_t need = 0;
    bool any = false;
    const auto count = [&](DeviceWeight& w) {
        if (!w.q || w.fp8_row_scaled || !gemm_weight_type_supported(w.type)) return;
        need += static_cast<size_t>(w.N * w.K) * 2 + (bq_supported(w.type, w.K) ? bq_bytes(w) : 0);
        any = any || qw_supported(w.type, w.K);
    };
    for_each_layer_matrix(count, /*experts=*/false);
    count(output_.w);
    if (eh_proj_.w.q) count(eh_proj_.w);
    size_t free_b = 0, total_b = 0;
    QUERN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (!any || need + total_b / 4 <= free_b) return false;
    const auto mark = [](DeviceWeight& w) {
        if (w.q && !w.fp8_row_scaled && qw_supported(w.type, w.K)) w.qw = true;
    };
    for_each_layer_matrix(mark, /*experts=*/false);
    mark(output_.w);
    if (eh_proj_.w.q) mark(eh_proj_.w);
    if (opt_.verbose)
        std::fprintf(stderr,
                     "quern: the weight copies for batches (BF16 and small-batch layouts) would take %.2f GiB and "
                     "%.2f GiB is free: batches multiply the quantized weights directly (qw_gemm), with no copies\n",
                     gib(static_cast<double>(need)), gib(static_cast<double>(free_b)));
    return true;
}

size_t CudaExecutor::make_small_layouts() {
    if (small_layouts_) return 0;
    small_layouts_ = true;
    size_t free_b = 0, total_b = 0, bytes = 0;
    QUERN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    bool room = true;
    const auto small = [&](DeviceWeight& w) {
        if (!w.q || w.fp8_row_scaled || !bq_supported(w.type, w.K) || PrefillGemm::qw_weight(w)) return;
        copy_while_room(room, bytes, free_b, total_b / 4, bq_bytes(w), [&] { make_resident_bq(w, ctx_.stream()); });
    };
    for_each_layer_matrix(small, /*experts=*/false);
    small(output_.w);
    if (eh_proj_.w.q) small(eh_proj_.w);
    return bytes;
}

void CudaExecutor::forward_batch(const SeqBatch* seqs, int n_seqs) {
    // forward() has checked the ids and tables.
    // Passes of at most prefill_rows_ rows; a long prompt chunk may span
    // passes (its later rows see the keys the earlier pass stored).
    std::vector<BatchSegment> segs;
    int64_t rows = 0;
    for (int i = 0; i < n_seqs; ++i)
        for (int64_t off = 0; off < seqs[i].n;) {
            const int64_t take = std::min(seqs[i].n - off, prefill_rows_ - rows);
            segs.push_back({i, off, take});
            rows += take;
            off += take;
            if (rows == prefill_rows_) {
                batch_pass(seqs, segs);
                segs.clear();
                rows = 0;
            }
        }
    if (!segs.empty()) batch_pass(seqs, segs);
}

namespace {

// The padded row count of a graph pass of n single rows: 1, 2, 4, 8, then
// multiples of 8 up to 64 and of 32 up to 256 (few graphs, at most a
// quarter of a pass wasted beyond 8 rows).
int64_t graph_bucket(int64_t n) {
    if (n <= 8) {
        int64_t b = 1;
        while (b < n) b *= 2;
        return b;
    }
    return n <= 64 ? (n + 7) / 8 * 8 : (n + 31) / 32 * 32;
}

}  // namespace

void CudaExecutor::clear_batch_graphs() {
    for (auto& [key, g] : bgraphs_)
        if (g.first) cudaGraphExecDestroy(g.first);
    bgraphs_.clear();
}

bool CudaExecutor::replay_layers(const int32_t* d, int64_t n, int64_t keys, const PagedRows& pr) {
    auto& [ge, seen] = bgraphs_[{n, keys}];
    if (!ge) {
        // The first pass of a pair runs uncaptured: whatever a product sets
        // up on its first call (plans, kernel attributes) happens outside
        // the graph. A pair whose capture failed (seen < 0) stays uncaptured.
        if (seen < 0 || seen++ == 0) return false;
        const cudaStream_t s = ctx_.stream();
        cudaGraph_t g = nullptr;
        bool ok = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
        if (ok) {
            try {
                layer_rows(d, n, 0, &pr);
            } catch (const Error&) {
                ok = false;
            }
            ok = cudaStreamEndCapture(s, &g) == cudaSuccess && ok && g;
            ok = ok && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
            if (g) cudaGraphDestroy(g);
        }
        if (!ok) {  // e.g. a product that falls back to tiles on the second stream at this size
            cudaGetLastError();
            ge = nullptr;
            seen = -1;
            if (opt_.verbose)
                std::fprintf(stderr, "quern: a batch pass of %lld rows could not be captured as a CUDA graph; such passes "
                                     "run uncaptured\n", static_cast<long long>(n));
            return false;
        }
    }
    QUERN_CUDA_CHECK(cudaGraphLaunch(ge, ctx_.stream()));
    ++graph_replays_;
    return true;
}

void CudaExecutor::batch_pass(const SeqBatch* seqs, const std::vector<BatchSegment>& segs) {
    const auto t_start = std::chrono::steady_clock::now();
    const auto& c = plan_;
    const cudaStream_t s = ctx_.stream();
    const int64_t bs = kv_block_size_, E = c.n_embd, V = c.n_vocab;
    // The pass's integers, one host buffer (kept between passes) in the
    // device layout: ids (n) | positions (n) | table offsets (n) | rows whose
    // logits are read (nh) | the segments' block tables.
    // Rows of a segment whose logits are read: every row of a sequence
    // that wants all its rows' logits, else its last row.
    const auto head_rows = [&](const BatchSegment& g) -> int64_t {
        const SeqBatch& q = seqs[g.seq];
        if (q.all_logits && q.logits) return g.n;
        return (q.logits || q.next) && g.off + g.n == q.n ? 1 : 0;
    };
    const auto blocks_of = [&](const BatchSegment& g) { return (seqs[g.seq].n_past + g.off + g.n + bs - 1) / bs; };
    int64_t n = 0, nh = 0, nt = 0;
    bool single = true;  // every segment one row: the pass may run as a graph
    bool hidden = false;  // some sequence wants its hidden rows
    for (const BatchSegment& g : segs) {
        n += g.n, nh += head_rows(g), nt += blocks_of(g), single = single && g.n == 1;
        hidden = hidden || seqs[g.seq].hidden;
    }
    const bool lr = rope_live_ != nullptr;  // LongRoPE: the rows' choices follow the head rows
    // A graph pass pads its rows to np (graph_bucket) and its integers sit at
    // fixed places of bgints_; padding rows read token 0 at position 0 from a
    // one-entry table naming the pool's spare block.
    int64_t np = 0;
    if (single && n <= graph_rows_ && !profile_) {
        np = graph_bucket(n);
        if (np > prefill_rows_) np = 0;  // the passes' scratch holds prefill_rows_ rows
        if (4 * np + (lr ? np : 0) + nt + 1 > kGraphInts) np = 0;
    }
    const int64_t nr = np ? np : n, hc = np ? np : nh;  // rows and head slots laid out
    // The pass's integers, one host buffer (kept between passes) in the
    // device layout: ids (nr) | positions (nr) | table offsets (nr) | rows
    // whose logits are read (hc) | LongRoPE choices (nr, LongRoPE only) |
    // the segments' block tables (| the spare block's one-entry table).
    bhost_.resize(static_cast<size_t>(3 * nr + hc + (lr ? nr : 0) + nt + (np ? 1 : 0)));
    int32_t* ids = bhost_.data();
    int32_t* pos = ids + nr;
    int32_t* toff = pos + nr;
    int32_t* head = toff + nr;
    int32_t* lrow = head + hc;
    int32_t* tables = lrow + (lr ? nr : 0);
    head_seq_.clear();
    head_row_.clear();
    seg_row0_.clear();
    int64_t r = 0, t0 = 0;
    for (const BatchSegment& g : segs) {
        seg_row0_.push_back(r);
        const SeqBatch& q = seqs[g.seq];
        const int64_t nb = blocks_of(g);
        std::copy(q.block_table, q.block_table + nb, tables + t0);
        // LongRoPE: per sequence, from its last position in this call (the CPU's rule).
        const int32_t lg = lr && q.n_past + q.n - 1 >= rope_long_from_ ? 1 : 0;
        for (int64_t j = g.off; j < g.off + g.n; ++j, ++r) {
            ids[r] = q.tokens[j];
            pos[r] = static_cast<int32_t>(q.n_past + j);
            toff[r] = static_cast<int32_t>(t0);
            if (lr) lrow[r] = lg;
        }
        for (int64_t k = head_rows(g); k > 0; --k) {
            head[head_seq_.size()] = static_cast<int32_t>(r - k);
            head_seq_.push_back(&q);
            head_row_.push_back(g.off + g.n - k);
        }
        t0 += nb;
    }
    if (np) {
        tables[t0] = static_cast<int32_t>(kv_blocks_);
        for (; r < np; ++r) {  // padding rows: token 0 at position 0 (head slots past nh go unread)
            ids[r] = pos[r] = 0;
            toff[r] = static_cast<int32_t>(t0);
            if (lr) lrow[r] = 0;
        }
    }
    const size_t bytes = bhost_.size() * 4;
    if (!np && bints_.size() < bytes) bints_ = DeviceBuffer(bytes * 2);
    DeviceBuffer& dints = np ? bgints_ : bints_;
    QUERN_CUDA_CHECK(cudaMemcpyAsync(dints.data(), bhost_.data(), bytes, cudaMemcpyHostToDevice, s));
    const int32_t* d = dints.as<int32_t>();
    PagedRows pr;
    pr.pos = d + nr;
    pr.table_off = d + 2 * nr;
    pr.tables = d + 3 * nr + hc + (lr ? nr : 0);
    pr.block_size = static_cast<int>(bs);
    pr.one_row_per_seq = single;
    pr.split_ws = bsplit_.as<float>();
    pr.split_ws_floats = bsplit_floats_;
    const int max_keys = n > 0 ? *std::max_element(pos, pos + n) + 1 : 0;
    // A graph's attention is planned for a power of two of keys (from 64):
    // any row of fewer keys is attended alike (its splits shorter).
    int keys = max_keys;
    if (np) {
        keys = 64;
        while (keys < max_keys) keys *= 2;
    }
    pr.max_keys = keys;
    if (lr) {
        pr.rope_long = d + 3 * nr + hc;
        pr.inv_freq_long = rope_long_;
    }
    if (c.hybrid()) set_batch_delta(seqs, segs, nr - n);
    if (c.draft()) {  // the given rows, in the pass's row order
        bhin_.resize(static_cast<size_t>(n * E));
        for (size_t i = 0; i < segs.size(); ++i) {
            const BatchSegment& g = segs[i];
            std::copy_n(seqs[g.seq].hidden_in + g.off * E, g.n * E, bhin_.data() + seg_row0_[i] * E);
        }
        QUERN_CUDA_CHECK(cudaMemcpyAsync(phin_.data(), bhin_.data(), bhin_.size() * sizeof(float), cudaMemcpyHostToDevice, s));
    }
    if (!np || !replay_layers(d, np, keys, pr)) layer_rows(d, nr, 0, &pr);
    float* X = px_.as<float>();
    const float* HRES = c.post_norms ? phpost_.as<float>() : ph_.as<float>();
    if (hidden) {
        // Every row through the output norm (the last residual added in),
        // in floats: the hidden rows the sequences that ask get.
        rms_norm_q8_1(X, HRES, out_norm_, phout_.as<float>(), nullptr, nullptr, n, E, c.rms_eps, s);
        for (size_t i = 0; i < segs.size(); ++i) {
            const BatchSegment& g = segs[i];
            if (float* h = seqs[g.seq].hidden)
                QUERN_CUDA_CHECK(cudaMemcpyAsync(h + g.off * E, phout_.as<float>() + seg_row0_[i] * E,
                                                 static_cast<size_t>(g.n * E) * sizeof(float), cudaMemcpyDeviceToHost, s));
        }
    }
    if (nh > 0) {
        // The final norm on every row (the last residual added in unless the
        // hidden rows did), then the rows that need logits gathered and
        // multiplied by the output head, at most 256 at a time.
        uint16_t* xb = gemm_->act_bf16();
        rms_norm_bf16(X, hidden ? nullptr : HRES, out_norm_, xb, n, E, c.rms_eps, s);
        for (int64_t h0 = 0; h0 < nh; h0 += kHeadRows) {
            const int64_t m = std::min(kHeadRows, nh - h0);
            gather_rows_bf16(xb, E, d + 3 * nr + h0, m, bhead_x_.as<uint16_t>(), s);
            gemm_->run_bf16(output_.w, bhead_x_.as<uint16_t>(), m, blogits_.as<float>(), V, s);
            if (c.logit_scale != 1.0f || c.final_softcap > 0.0f)
                scale_softcap(blogits_.as<float>(), m * V, c.logit_scale, c.final_softcap, s);
            bool greedy = false;
            for (int64_t j = 0; j < m; ++j) {
                const SeqBatch& q = *head_seq_[static_cast<size_t>(h0 + j)];
                const int64_t row = head_row_[static_cast<size_t>(h0 + j)];
                if (q.logits)
                    QUERN_CUDA_CHECK(cudaMemcpyAsync(q.logits + (q.all_logits ? row * V : 0), blogits_.as<float>() + j * V,
                                                     static_cast<size_t>(V) * 4, cudaMemcpyDeviceToHost, s));
                greedy = greedy || (q.next && row == q.n - 1);
            }
            if (greedy) {  // every row's argmax in one launch (the others' go unread)
                argmax_rows(blogits_.as<float>(), m, V, V, bargmax_.data(), bgreedy_.as<int32_t>(), s);
                QUERN_CUDA_CHECK(cudaMemcpyAsync(hgreedy_.as<int32_t>(), bgreedy_.data(), static_cast<size_t>(m) * 4,
                                                 cudaMemcpyDeviceToHost, s));
            }
            ctx_.synchronize();  // blogits_ and hgreedy_ are reused
            for (int64_t j = 0; j < m; ++j) {
                const SeqBatch& q = *head_seq_[static_cast<size_t>(h0 + j)];
                if (q.next && head_row_[static_cast<size_t>(h0 + j)] == q.n - 1) *q.next = hgreedy_.as<int32_t>()[j];
            }
        }
        mark("head");
    }
    ctx_.synchronize();
    if (profile_) {
        Profile& prof = single ? prof_batch_ : prof_batch_prompt_;
        collect_profile(prof);
        prof.rows += n;
        if (single) batch_wall_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();
    }
}

}  // namespace quern::cuda
