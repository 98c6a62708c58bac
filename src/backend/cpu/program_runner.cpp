// The CPU interpreter of a layer program (program_runner.h).
//
// Values live in slots (float buffers of rows × width), assigned once when
// the runner is made: a slot is reused as soon as the value in it has had its
// last reader, and the elementwise ops (RMSNorm, add, scale, soft-cap, the
// GLU) write over an input they are its last reader of. A Linear op of
// several matrices keeps each piece's output in a slot of its own
// ("planar"), so that attention reads q, k and v and the GLU reads gate and
// up as the separate arrays the kernels take; any other reader of such a
// value gets its rows gathered.
#include "backend/cpu/program_runner.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "backend/cpu/delta_rule.h"
#include "backend/cpu/moe_route.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "quant/fp8.h"
#include "quant/traits.h"

namespace quern::cpu {

namespace {

constexpr int64_t kPassRows = 512;  // tokens per pass of forward()
constexpr int64_t kDeltaChunk = 16;  // tokens per chunk of a lone sequence's delta rule (bench_delta_rule: 16 beat 32, 64)

size_t sz(int64_t v) { return static_cast<size_t>(v); }

/// y[r] += b for n rows of dim floats.
void add_bias_rows(float* y, int64_t n, int64_t dim, const float* b) {
    for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < dim; ++i) y[r * dim + i] += b[i];
}
void add_bias(float* y, const Tensor& b, int64_t n, int64_t dim) {
    add_bias_rows(y, n, dim, static_cast<const float*>(b.data));
}
/// A matrix's profile label: its tensor name without the layer ("blk.N.",
/// "layers.N.") or ".weight", and its type: "ffn_down Q6_K".
std::string weight_label(const Tensor& w) {
    std::string out;
    size_t at = 0;
    while (at <= w.name.size()) {
        const size_t dot = std::min(w.name.find('.', at), w.name.size());
        const std::string part = w.name.substr(at, dot - at);
        const bool layer = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!layer && part != "blk" && part != "layers" && part != "weight" && !part.empty())
            out += (out.empty() ? "" : ".") + part;
        at = dot + 1;
    }
    return (out.empty() ? std::string("matmul") : out) + " " + std::string(dtype_name(w.type));
}

double seconds_since(OpProfile::Clock::time_point t0) {
    return std::chrono::duration<double>(OpProfile::Clock::now() - t0).count();
}

/// Expert x's row of a bank's biases (F32, ne = {N, n_expert}).
const float* bias_row(const Tensor& b, int64_t x) {
    return reinterpret_cast<const float*>(static_cast<const uint8_t*>(b.data) + x * static_cast<int64_t>(b.nb[1]));
}

}  // namespace

struct ProgramRunner::State {
    // The plan: each value's slots (one per piece) and piece widths, and the
    // last op that reads it.
    std::vector<std::vector<int>> slots_of;
    std::vector<std::vector<int64_t>> widths;
    std::vector<int> last_use;
    std::vector<uint8_t> attn_in_place;  // per op: attention may rotate its q and k input in place
    std::vector<std::vector<float>> slots;

    // Scratch.
    std::vector<float> gathered[2];       // multi-piece values read as rows
    std::vector<float> qs, ks, vs;        // attention input copies
    std::vector<float> xr, yr, xf8;       // mm(): two-level split, FP8 rounding
    DType xr_act = DType::F32;
    std::vector<PagedAttnSeq> attn_seqs;
    std::vector<float> router, selw, xe, ge, ue, ye, eo;
    std::vector<float> dn_conv, dn_g, dn_beta;  // delta-net: the rows' conv outputs, per head log decays and β
    std::vector<std::vector<float>> dn_scratch;  // delta-net: per worker
    std::vector<float*> dn_rows;         // delta-net: each row's sequence state
    std::vector<int32_t> sel;
    std::vector<int64_t> moe_off, moe_ent;
    std::vector<int32_t> toks, pos;
    std::vector<int64_t> seq_last;  // per row: its sequence's last position in this call (LongRoPE)
    std::vector<int64_t> head;      // rows whose logits are wanted
    std::vector<float> hidden_in;   // forward_batch: the sequences' given rows, back to back

    float* slot(int s, int64_t n) {
        auto& b = slots[sz(s)];
        if (b.size() < sz(n)) b.resize(sz(n));
        return b.data();
    }
};

/// One pass of the program over `rows` rows.
struct ProgramRunner::Pass {
    int64_t rows = 0;
    MatmulPath path = MatmulPath::Auto;
    bool fp8_act = false;
    bool trace = false;
    const float* hidden_in = nullptr;  // OpKind::Input's rows
    // One sequence over a contiguous cache (forward) ...
    KvCache* cache = nullptr;
    int64_t p0 = 0;
    // ... or several over a paged one (forward_batch).
    const SeqBatch* seqs = nullptr;
    int n_seqs = 0;
    const PagedKvStore* store = nullptr;
};

ProgramRunner::ProgramRunner(const Program& program) : p_(program), st_(std::make_unique<State>()) {
    State& s = *st_;
    const size_t nv = p_.values.size();
    s.slots_of.resize(nv);
    s.widths.resize(nv);
    s.last_use.assign(nv, -1);
    s.attn_in_place.assign(p_.ops.size(), 0);
    for (size_t i = 0; i < p_.ops.size(); ++i)
        for (const Value& v : p_.ops[i].in)
            if (v.valid()) s.last_use[sz(v.id)] = static_cast<int>(i);
    if (p_.logits.valid()) s.last_use[sz(p_.logits.id)] = INT_MAX;
    if (p_.hidden.valid()) s.last_use[sz(p_.hidden.id)] = INT_MAX;
    std::vector<int> free_slots;
    const auto take = [&] {
        if (free_slots.empty()) {
            s.slots.emplace_back();
            return static_cast<int>(s.slots.size() - 1);
        }
        const int k = free_slots.back();
        free_slots.pop_back();
        return k;
    };
    for (size_t i = 0; i < p_.ops.size(); ++i) {
        const Op& op = p_.ops[i];
        const int ii = static_cast<int>(i);
        std::vector<int> dying;  // distinct inputs read for the last time here
        for (const Value& v : op.in)
            if (v.valid() && s.last_use[sz(v.id)] == ii && std::find(dying.begin(), dying.end(), v.id) == dying.end())
                dying.push_back(v.id);
        const auto dies = [&](Value v) {
            return v.valid() && std::find(dying.begin(), dying.end(), v.id) != dying.end();
        };
        std::vector<int> reused;  // slots of dying inputs the output takes over
        if (op.out.valid()) {
            auto& out_slots = s.slots_of[sz(op.out.id)];
            auto& out_w = s.widths[sz(op.out.id)];
            const Value a = op.in[0], b = op.in[1];
            const auto single = [&](Value v) { return v.valid() && s.slots_of[sz(v.id)].size() == 1; };
            switch (op.kind) {
                case OpKind::Linear:
                    for (const LinearPiece& pc : op.pieces) {
                        out_slots.push_back(take());
                        out_w.push_back(pc.w->ne[1]);
                    }
                    break;
                case OpKind::RmsNorm:
                case OpKind::Gate:
                case OpKind::Scale:
                case OpKind::Softcap:
                case OpKind::Add:
                    if (dies(a) && single(a)) reused.push_back(s.slots_of[sz(a.id)][0]);
                    else if (op.kind == OpKind::Add && dies(b) && single(b)) reused.push_back(s.slots_of[sz(b.id)][0]);
                    break;
                case OpKind::Glu:  // out may alias the gate
                    if (dies(a) && s.slots_of[sz(a.id)].size() == 2) reused.push_back(s.slots_of[sz(a.id)][0]);
                    break;
                case OpKind::Attention: {
                    const AttentionSpec& sp = p_.attention[sz(op.spec)];
                    const auto& w = s.widths[sz(a.id)];
                    s.attn_in_place[i] = dies(a) && w.size() == 3 && w[0] == sp.q_dim() && w[1] == sp.kv_dim();
                    break;
                }
                default:
                    break;
            }
            if (op.kind != OpKind::Linear) {
                out_slots.push_back(reused.empty() ? take() : reused[0]);
                out_w.push_back(p_.width(op.out));
            }
        }
        for (int v : dying)
            for (int k : s.slots_of[sz(v)])
                if (std::find(reused.begin(), reused.end(), k) == reused.end()) free_slots.push_back(k);
    }
}

ProgramRunner::~ProgramRunner() = default;

void ProgramRunner::mm(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool,
                       bool same_input, MatmulPath path, bool fp8_act) {
    State& s = *st_;
    const DType act = quant_traits(W.type).vec_dot_type;
    if (fp8_act && W.type == DType::F8_E4M3_B32) {
        const int64_t K = W.ne[0];
        s.xf8.resize(sz(n * K));
        pool.parallel_for(n, 1, [&](int64_t r0, int64_t r1, int) {
            round_fp8_activation_rows(x + r0 * K, r1 - r0, K, s.xf8.data() + r0 * K);
        });
        return matmul(W, s.xf8.data(), n, y, ldy, pool, path);
    }
    if (!opts_.precise_activations || act == DType::F32) return matmul(W, x, n, y, ldy, pool, path);
    // Two-level activations: x split into its 8-bit quantization x8 and the
    // residual x - x8 (quantized in turn), both products summed: activation
    // error ~1/127² instead of ~1/127, for one extra activation row per row.
    const int64_t K = W.ne[0], M = W.ne[1];
    // The split and the sum are row by row; over the pool when there is
    // enough of them to pay for a parallel region.
    const auto rows = [&](int64_t width, auto&& fn) {
        const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(width, 1));
        pool.parallel_for(n, grain, [&](int64_t r0, int64_t r1, int) {
            for (int64_t i = r0; i < r1; ++i) fn(i);
        });
    };
    if (!same_input || s.xr_act != act || s.xr.size() != sz(2 * n * K)) {
        s.xr.resize(sz(2 * n * K));
        const size_t qb = row_size(act, K);
        std::copy(x, x + n * K, s.xr.begin());
        rows(K, [&](int64_t i) {
            thread_local std::vector<uint8_t> q;
            q.resize(qb);
            quantize_act_with_residual(act, x + i * K, K, q.data(), s.xr.data() + (n + i) * K);
        });
        s.xr_act = act;
    }
    s.yr.resize(sz(2 * n * M));
    matmul(W, s.xr.data(), 2 * n, s.yr.data(), M, pool, path);
    rows(M, [&](int64_t i) {
        const float* a = s.yr.data() + i * M;
        const float* b = s.yr.data() + (n + i) * M;
        for (int64_t j = 0; j < M; ++j) y[i * ldy + j] = a[j] + b[j];
    });
}

const float* ProgramRunner::gather(Value v, int64_t n, int which) {
    State& s = *st_;
    const auto& sl = s.slots_of[sz(v.id)];
    if (sl.size() == 1) return s.slots[sz(sl[0])].data();
    const int64_t w = p_.width(v);
    auto& g = s.gathered[which];
    g.resize(sz(n * w));
    int64_t col = 0;
    for (size_t j = 0; j < sl.size(); ++j) {
        const int64_t pw = s.widths[sz(v.id)][j];
        const float* src = s.slots[sz(sl[j])].data();
        for (int64_t r = 0; r < n; ++r) std::copy_n(src + r * pw, pw, g.data() + r * w + col);
        col += pw;
    }
    return g.data();
}

void ProgramRunner::run(Pass& pass, ThreadPool& pool) {
    State& s = *st_;
    const int64_t T = pass.rows, m = static_cast<int64_t>(s.head.size());
    const auto rows_of = [&](Value v) { return p_.values[sz(v.id)].head ? m : T; };
    const auto piece = [&](Value v, size_t j) { return s.slots[sz(s.slots_of[sz(v.id)][j])].data(); };
    const auto rows = [&](Value v, int which) { return gather(v, rows_of(v), which); };
    // The output's buffer, sized for its rows (in place when it took over an input's slot).
    const auto out = [&](const Op& op) { return s.slot(s.slots_of[sz(op.out.id)][0], rows_of(op.out) * p_.width(op.out)); };
    const auto same_slot = [&](Value a, Value b) {
        return s.slots_of[sz(a.id)].size() == 1 && s.slots_of[sz(a.id)][0] == s.slots_of[sz(b.id)][0];
    };
    if (profile_) profile_->begin_pass(T);
    for (const Op& op : p_.ops) {
        const Value in = op.in[0];
        if (in.valid() && p_.values[sz(in.id)].head && m == 0) continue;  // no rows want logits in this pass
        const auto t0 = profile_ ? OpProfile::Clock::now() : OpProfile::Clock::time_point{};
        switch (op.kind) {
            case OpKind::Embed:
                get_rows(*op.weight, s.toks.data(), T, out(op));
                break;
            case OpKind::RmsNorm: {
                float* y = out(op);
                const int64_t w = p_.width(in), g = op.group > 0 ? op.group : w;
                rms_norm(rows(in, 0), static_cast<const float*>(op.weight->data), y, rows_of(in) * (w / g), g, op.eps);
                break;
            }
            case OpKind::Gate: {
                const int64_t w = p_.width(op.out), count = rows_of(op.out) * w;
                float* y = out(op);
                const float* x = rows(in, 0);
                const float* g = rows(op.in[1], 1);
                const bool per_row = p_.width(op.in[1]) == 1 && w != 1;
                const auto act = [&](float v) {
                    const float sg = 1.0f / (1.0f + std::exp(-v));
                    return op.act == GluAct::Sigmoid ? sg : v * sg;
                };
                for (int64_t i = 0; i < count; ++i) y[i] = x[i] * act(g[per_row ? i / w : i]);
                break;
            }
            case OpKind::DeltaNet:
                run_delta_net(op, pass, pool);
                break;
            case OpKind::Linear: {
                const int64_t n = rows_of(in);
                const float* x = rows(in, 0);
                for (size_t j = 0; j < op.pieces.size(); ++j) {
                    const LinearPiece& pc = op.pieces[j];
                    const int64_t N = pc.w->ne[1];
                    if (observe_) observe_(*pc.w, -1, x, n);
                    float* y = s.slot(s.slots_of[sz(op.out.id)][j], n * N);
                    const auto tm = profile_ ? OpProfile::Clock::now() : OpProfile::Clock::time_point{};
                    mm(*pc.w, x, n, y, N, pool, j > 0, pass.path, pass.fp8_act);
                    if (pc.bias) add_bias(y, *pc.bias, n, N);
                    if (profile_) {
                        const double dt = seconds_since(tm);  // before the label is built
                        profile_->add(weight_label(*pc.w), dt, pc.w->nbytes());
                    }
                }
                break;
            }
            case OpKind::Attention:
                run_attention(op, pass, pool);
                break;
            case OpKind::Glu: {
                const int64_t n = rows_of(in), F = p_.width(op.out);
                float* y = out(op);
                const auto glu = [&](const float* g, const float* u, float* o, int64_t count) {
                    if (op.act == GluAct::GeluTanh) geglu_tanh(g, u, o, count);
                    else swiglu(g, u, o, count);
                };
                if (s.slots_of[sz(in.id)].size() == 2 && s.widths[sz(in.id)][0] == F) {
                    glu(piece(in, 0), piece(in, 1), y, n * F);
                } else {
                    const float* x = rows(in, 0);
                    for (int64_t r = 0; r < n; ++r) glu(x + r * 2 * F, x + r * 2 * F + F, y + r * F, F);
                }
                break;
            }
            case OpKind::Moe:
                run_moe(op, pass, pool);
                break;
            case OpKind::Add: {
                const int64_t count = rows_of(op.out) * p_.width(op.out);
                float* y = out(op);
                const Value a = op.in[0], b = op.in[1];
                if (same_slot(op.out, a)) {
                    add_inplace(y, rows(b, 1), count);
                } else if (same_slot(op.out, b)) {
                    add_inplace(y, rows(a, 0), count);
                } else {
                    std::copy_n(rows(a, 0), count, y);
                    add_inplace(y, rows(b, 1), count);
                }
                break;
            }
            case OpKind::Scale:
            case OpKind::Softcap: {
                const int64_t count = rows_of(op.out) * p_.width(op.out);
                float* y = out(op);
                if (!same_slot(op.out, in)) std::copy_n(rows(in, 0), count, y);
                if (op.kind == OpKind::Scale) scale(y, count, op.scalar);
                else softcap(y, count, op.scalar);
                break;
            }
            case OpKind::SelectRows: {
                const int64_t w = p_.width(in);
                float* y = out(op);
                const float* x = rows(in, 0);
                for (int64_t i = 0; i < m; ++i) std::copy_n(x + s.head[sz(i)] * w, w, y + i * w);
                break;
            }
            case OpKind::Input:
                if (!pass.hidden_in) fail("forward: the program reads given rows (hidden_in) and none were given");
                std::copy_n(pass.hidden_in, T * p_.width(op.out), out(op));
                break;
            case OpKind::Concat: {
                const int64_t n = rows_of(op.out), wa = p_.width(in), wb = p_.width(op.in[1]);
                float* y = out(op);
                const float* a = rows(in, 0);
                const float* b = rows(op.in[1], 1);
                for (int64_t r = 0; r < n; ++r) {
                    std::copy_n(a + r * wa, wa, y + r * (wa + wb));
                    std::copy_n(b + r * wb, wb, y + r * (wa + wb) + wa);
                }
                break;
            }
            case OpKind::Trace:
                if (pass.trace && trace_) {
                    const int64_t w = p_.width(in);
                    trace_(op.name, rows(in, 0) + (rows_of(in) - 1) * w, w);
                }
                break;
        }
        if (profile_ && op.kind != OpKind::Linear && op.kind != OpKind::Trace) {
            const double dt = seconds_since(t0);
            profile_->add(kind_name(op.kind), dt, 0);
        }
    }
}

void ProgramRunner::run_attention(const Op& op, Pass& pass, ThreadPool& pool) {
    State& s = *st_;
    const AttentionSpec& sp = p_.attention[sz(op.spec)];
    const int64_t T = pass.rows, qd = sp.q_dim(), kvd = sp.kv_dim();
    const Value in = op.in[0];
    float *q, *k, *v;
    const auto& sl = s.slots_of[sz(in.id)];
    if (s.attn_in_place[sz(&op - p_.ops.data())]) {
        q = s.slots[sz(sl[0])].data();
        k = s.slots[sz(sl[1])].data();
        v = s.slots[sz(sl[2])].data();
    } else {  // q and k are rotated in place: work on copies
        s.qs.resize(sz(T * qd));
        s.ks.resize(sz(T * kvd));
        s.vs.resize(sz(T * kvd));
        int64_t col = 0;
        for (size_t j = 0; j < sl.size(); ++j) {
            const int64_t pw = s.widths[sz(in.id)][j];
            const float* src = s.slots[sz(sl[j])].data();
            for (int64_t r = 0; r < T; ++r)
                for (int64_t c = 0; c < pw; ++c) {
                    const int64_t g = col + c;
                    const float x = src[r * pw + c];
                    if (g < qd) s.qs[sz(r * qd + g)] = x;
                    else if (g < qd + kvd) s.ks[sz(r * kvd + g - qd)] = x;
                    else s.vs[sz(r * kvd + g - qd - kvd)] = x;
                }
            col += pw;
        }
        q = s.qs.data(), k = s.ks.data(), v = s.vs.data();
    }
    if (sp.q_norm) rms_norm(q, static_cast<const float*>(sp.q_norm->data), q, T * sp.n_head, sp.head_dim, sp.norm_eps);
    if (sp.k_norm)
        rms_norm(k, static_cast<const float*>(sp.k_norm->data), k, T * sp.n_head_kv, sp.head_dim, sp.norm_eps);
    // Rows in runs of one factor set (LongRoPE picks short or long per sequence).
    const RopeSpec& rp = sp.rope;
    for (int64_t r0 = 0; r0 < T;) {
        int64_t r1 = T;
        const float* ff = rp.factors;
        if (rp.long_factors) {
            const auto lg = [&](int64_t r) { return s.seq_last[sz(r)] >= rp.long_from; };
            r1 = r0 + 1;
            while (r1 < T && lg(r1) == lg(r0)) ++r1;
            if (lg(r0)) ff = rp.long_factors;
        }
        rope(q + r0 * qd, s.pos.data() + r0, r1 - r0, sp.n_head, sp.head_dim, rp.dim, rp.base, rp.neox, ff);
        rope(k + r0 * kvd, s.pos.data() + r0, r1 - r0, sp.n_head_kv, sp.head_dim, rp.dim, rp.base, rp.neox, ff);
        r0 = r1;
    }
    float* o = s.slot(s.slots_of[sz(op.out.id)][0], T * qd);
    const float* sinks = sp.sinks ? static_cast<const float*>(sp.sinks->data) : nullptr;
    if (pass.cache) {
        KvCache& c = *pass.cache;
        std::copy_n(k, T * kvd, c.k(sp.kv_layer, pass.p0));
        std::copy_n(v, T * kvd, c.v(sp.kv_layer, pass.p0));
        attention(q, c.k(sp.kv_layer), c.v(sp.kv_layer), kvd, s.pos.data(), T, sp.n_head, sp.n_head_kv, sp.head_dim,
                  sp.scale, o, pool, sp.window, sp.softcap, sinks);
        return;
    }
    const PagedKvStore& st = *pass.store;
    float* kl = st.k_layer(sp.kv_layer);
    float* vl = st.v_layer(sp.kv_layer);
    s.attn_seqs.clear();
    int64_t r = 0;
    for (int i = 0; i < pass.n_seqs; ++i) {
        const SeqBatch& b = pass.seqs[i];
        for (int64_t j = 0; j < b.n; ++j) {
            const int64_t row = st.row(b.block_table, b.n_past + j);
            std::copy_n(k + (r + j) * kvd, kvd, kl + row * kvd);
            std::copy_n(v + (r + j) * kvd, kvd, vl + row * kvd);
        }
        s.attn_seqs.push_back(PagedAttnSeq{q + r * qd, PagedKv{kl, vl, b.block_table, st.block_size, kvd},
                                           s.pos.data() + r, b.n, o + r * qd});
        r += b.n;
    }
    // One parallel region for every sequence's rows.
    attention_paged_batch(s.attn_seqs.data(), pass.n_seqs, sp.n_head, sp.n_head_kv, sp.head_dim, sp.scale, pool,
                          sp.window, sp.softcap, sinks);
}

void ProgramRunner::run_moe(const Op& op, Pass& pass, ThreadPool& pool) {
    // Route every row, then for each expert with rows: gather them, run its
    // gated FFN once for all of them and scatter the results; a row's output
    // is the sum over its k slots (in slot order) of weight × expert output.
    // Every row's arithmetic is independent of the others when the matmul
    // path is (MatmulPath::Gemm).
    State& s = *st_;
    const MoeSpec& sp = p_.moe[sz(op.spec)];
    const Value in = op.in[0];
    const int64_t nb = p_.values[sz(in.id)].head ? static_cast<int64_t>(s.head.size()) : pass.rows;
    const int64_t X = sp.n_expert, k = sp.n_used, E = p_.width(in), F = sp.n_ff;
    float* out = s.slot(s.slots_of[sz(op.out.id)][0], nb * E);
    const auto& isl = s.slots_of[sz(in.id)];
    if (isl.size() != 1) fail("program: an expert layer's input must be one matrix product's output");
    const float* h = s.slots[sz(isl[0])].data();
    const auto mat = [&](const Tensor& W, const float* x, int64_t rows, float* y, int64_t ld, bool same) {
        mm(W, x, rows, y, ld, pool, same, pass.path, pass.fp8_act);
    };
    // An expert's matrix as the activation observer names it: its bank's
    // stacked tensor and its index, or a tensor of its own.
    const auto observe = [&](const ExpertBank& bank, int64_t x, const float* in_rows, int64_t rows) {
        if (!observe_) return;
        if (bank.stacked) observe_(*bank.stacked, x, in_rows, rows);
        else observe_(*bank.experts[sz(x)], -1, in_rows, rows);
    };
    s.router.resize(sz(nb * X));
    if (observe_) observe_(*sp.router, -1, h, nb);
    mat(*sp.router, h, nb, s.router.data(), X, false);
    if (sp.router_bias) add_bias_rows(s.router.data(), nb, X, static_cast<const float*>(sp.router_bias->data));
    s.sel.resize(sz(nb * k));
    s.selw.resize(sz(nb * k));
    moe_route(s.router.data(), nb, X, k, sp.renormalize, s.sel.data(), s.selw.data());
    moe_group(s.sel.data(), nb, k, X, s.moe_off, s.moe_ent);
    s.eo.resize(sz(nb * k * E));
    s.xe.resize(sz(nb * E));
    s.ye.resize(sz(nb * E));
    s.ge.resize(sz(nb * F));
    s.ue.resize(sz(nb * F));
    for (int64_t x = 0; x < X; ++x) {
        const int64_t b = s.moe_off[sz(x)], cnt = s.moe_off[sz(x + 1)] - b;
        if (cnt == 0) continue;
        for (int64_t j = 0; j < cnt; ++j) std::copy_n(h + s.moe_ent[sz(b + j)] / k * E, E, s.xe.data() + j * E);
        observe(sp.gate, x, s.xe.data(), cnt);
        observe(sp.up, x, s.xe.data(), cnt);
        mat(*sp.gate.experts[sz(x)], s.xe.data(), cnt, s.ge.data(), F, false);
        mat(*sp.up.experts[sz(x)], s.xe.data(), cnt, s.ue.data(), F, true);
        if (sp.gate.bias) add_bias_rows(s.ge.data(), cnt, F, bias_row(*sp.gate.bias, x));
        if (sp.up.bias) add_bias_rows(s.ue.data(), cnt, F, bias_row(*sp.up.bias, x));
        if (sp.act == GluAct::GeluTanh) geglu_tanh(s.ge.data(), s.ue.data(), s.ge.data(), cnt * F);
        else if (sp.act == GluAct::SwiGluOai)
            swiglu_oai(s.ge.data(), s.ue.data(), s.ge.data(), cnt * F, sp.glu_alpha, sp.glu_limit);
        else swiglu(s.ge.data(), s.ue.data(), s.ge.data(), cnt * F);
        observe(sp.down, x, s.ge.data(), cnt);
        mat(*sp.down.experts[sz(x)], s.ge.data(), cnt, s.ye.data(), E, false);
        if (sp.down.bias) add_bias_rows(s.ye.data(), cnt, E, bias_row(*sp.down.bias, x));
        for (int64_t j = 0; j < cnt; ++j)
            std::copy_n(s.ye.data() + j * E, E, s.eo.data() + s.moe_ent[sz(b + j)] * E);
    }
    for (int64_t r = 0; r < nb; ++r) {
        float* o = out + r * E;
        for (int64_t slot = 0; slot < k; ++slot) {
            const float w = s.selw[sz(r * k + slot)];
            const float* y = s.eo.data() + (r * k + slot) * E;
            if (slot == 0)
                for (int64_t i = 0; i < E; ++i) o[i] = w * y[i];
            else
                for (int64_t i = 0; i < E; ++i) o[i] += w * y[i];
        }
    }
}

void ProgramRunner::run_delta_net(const Op& op, Pass& pass, ThreadPool& pool) {
    State& s = *st_;
    const DeltaNetSpec& sp = p_.delta_net[sz(op.spec)];
    const int64_t T = pass.rows, C = sp.conv_dim(), K = sp.conv_kernel, dk = sp.head_k, dv = sp.head_v;
    const int64_t nk = sp.n_k_heads, nv = sp.n_v_heads, kd = sp.key_dim();
    // Each row's sequence state: the one sequence's (forward), or its
    // sequence's slot (forward_batch, rows grouped by sequence in order).
    std::vector<float*>& row_state = s.dn_rows;
    row_state.resize(sz(T));
    if (pass.cache) {
        if (!pass.cache->state() || pass.cache->state_floats() != p_.state_floats())
            fail("delta-net layer {}: no recurrent state for this pass", op.layer);
        std::fill(row_state.begin(), row_state.end(), pass.cache->state());
    } else {
        int64_t r = 0;
        for (int i = 0; i < pass.n_seqs; ++i)
            for (int64_t j = 0; j < pass.seqs[i].n; ++j)
                row_state[sz(r++)] = pass.store->state + pass.seqs[i].state_slot * pass.store->state_floats;
    }
    const int64_t off = p_.state_offset(sp.state_layer);
    const float* w = static_cast<const float*>(sp.conv->data);                    // channel c: taps c·K .. c·K+K-1
    const float* a_coef = static_cast<const float*>(sp.a_coef->data);
    const float* dt_bias = static_cast<const float*>(sp.dt_bias->data);
    // The output has a slot of its own (never an input's), so the inputs
    // are read in place or gathered from their pieces.
    const float* x = gather(op.in[0], T, 0);   // [q | k | v] before the conv
    const float* ba = gather(op.in[1], T, 1);  // [b | a]
    float* y = s.slot(s.slots_of[sz(op.out.id)][0], T * sp.value_dim());
    // 1. Row by row (each row's conv reads the rows before it): the causal
    //    depthwise conv and SiLU, q and k L2-normalised per key head (q
    //    scaled by 1/sqrt(dk)), each value head's log decay and β.
    std::vector<float>& xc = s.dn_conv;
    xc.resize(sz(T * C));
    s.dn_g.resize(sz(nv * T));
    s.dn_beta.resize(sz(nv * T));
    const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
    for (int64_t r = 0; r < T; ++r) {
        float* conv_state = row_state[sz(r)] + off;  // K-1 rows of C, oldest first
        const float* xr = x + r * C;
        float* c = xc.data() + r * C;
        for (int64_t ch = 0; ch < C; ++ch) {
            float acc = 0.0f;
            for (int64_t j = 0; j < K - 1; ++j) acc += conv_state[j * C + ch] * w[ch * K + j];
            acc += xr[ch] * w[ch * K + K - 1];
            c[ch] = acc / (1.0f + std::exp(-acc));
        }
        if (K > 1) {
            std::copy(conv_state + C, conv_state + (K - 1) * C, conv_state);
            std::copy_n(xr, C, conv_state + (K - 2) * C);
        }
        for (int64_t h = 0; h < 2 * nk; ++h) {
            float* v = c + h * dk;
            float ss = 0.0f;
            for (int64_t i = 0; i < dk; ++i) ss += v[i] * v[i];
            const float inv = 1.0f / std::sqrt(ss + 1e-6f) * (h < nk ? qscale : 1.0f);
            for (int64_t i = 0; i < dk; ++i) v[i] *= inv;
        }
        const float* b = ba + r * 2 * nv;
        const float* a = b + nv;
        for (int64_t h = 0; h < nv; ++h) {
            const float u = a[h] + dt_bias[h];
            const float softplus = u > 20.0f ? u : std::log1p(std::exp(u));
            s.dn_g[sz(h * T + r)] = a_coef[h] * softplus;
            s.dn_beta[sz(h * T + r)] = 1.0f / (1.0f + std::exp(-b[h]));
        }
    }
    // 2. Per (sequence, value head): the delta rule over the sequence's rows
    //    of this pass, its state kept in cache. A lone sequence's prompt goes
    //    in chunks (delta_rule.h); batch-invariant passes token by token, so
    //    that a row's result does not depend on where its prompt was cut.
    struct Segment {
        int64_t row0, n;
        float* state;
    };
    std::vector<Segment> segs;
    for (int64_t r = 0; r < T;) {
        int64_t e = r + 1;
        while (e < T && row_state[sz(e)] == row_state[sz(r)]) ++e;
        segs.push_back({r, e - r, row_state[sz(r)] + off + (K - 1) * C});
        r = e;
    }
    const bool chunked = pass.cache && T >= kDeltaChunk;
    const int64_t VD = sp.value_dim(), n_tasks = static_cast<int64_t>(segs.size()) * nv;
    s.dn_scratch.resize(sz(pool.size() + 1));
    pool.parallel_for(n_tasks, 1, [&](int64_t t0, int64_t t1, int worker) {
        std::vector<float>& scratch = s.dn_scratch[sz(worker)];
        for (int64_t task = t0; task < t1; ++task) {
            const Segment& sg = segs[sz(task / nv)];
            const int64_t h = task % nv, kh = sp.kv_tiled ? h % nk : h / (nv / nk);
            const float* base = xc.data() + sg.row0 * C;
            DeltaRuleRun run;
            run.q = base + kh * dk;
            run.k = base + kd + kh * dk;
            run.v = base + 2 * kd + h * dv;
            run.ld_qk = run.ld_v = C;
            run.g = s.dn_g.data() + h * T + sg.row0;
            run.beta = s.dn_beta.data() + h * T + sg.row0;
            run.o = y + sg.row0 * VD + h * dv;
            run.ld_o = VD;
            run.T = sg.n;
            run.dk = dk;
            run.dv = dv;
            float* S = sg.state + h * dk * dv;  // row i (a key element) of dv floats
            if (chunked) {
                delta_rule_chunked(run, S, kDeltaChunk, scratch);
            } else {
                scratch.resize(sz(dv));
                delta_rule_tokens(run, S, scratch.data());
            }
        }
    });
}

void ProgramRunner::forward(const int32_t* tokens, int64_t n, KvCache& cache, float* logits, bool all_logits,
                            ThreadPool& pool, const float* hidden_in, float* hidden_out) {
    State& s = *st_;
    const int64_t V = p_.n_vocab;
    if (n <= 0) return;
    if (cache.kv_dim() != p_.kv_dim)
        fail("KV cache row size {} does not match the model ({})", cache.kv_dim(), p_.kv_dim);
    if (cache.size() + n > cache.n_ctx())
        fail("context is full: {} tokens in the cache + {} new > context size {} (raise -c)", cache.size(), n,
             cache.n_ctx());
    for (int64_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= V) fail("token id {} is outside the vocabulary [0, {})", tokens[i], V);
    if (hidden_out && !p_.hidden.valid()) fail("forward: the program names no hidden rows to hand out");
    if (cache.state_floats() != p_.state_floats())
        fail("recurrent state of {} floats does not match the model ({})", cache.state_floats(), p_.state_floats());
    // A sequence's recurrent state describes its positions so far: none at 0.
    if (cache.size() == 0 && cache.state()) std::fill_n(cache.state(), cache.state_floats(), 0.0f);
    // LongRoPE decides once per call, from the call's last position.
    const int64_t last_pos = cache.size() + n - 1;
    for (int64_t b0 = 0; b0 < n; b0 += kPassRows) {
        const int64_t nb = std::min(kPassRows, n - b0);
        const bool last = b0 + nb == n;
        Pass pass;
        pass.rows = nb;
        pass.path = MatmulPath::Auto;
        pass.fp8_act = opts_.fp8_activation_rows > 0 && nb >= opts_.fp8_activation_rows;
        pass.trace = last;
        pass.cache = &cache;
        int64_t in_width = 0;
        for (const Op& op : p_.ops)
            if (op.kind == OpKind::Input) in_width = p_.width(op.out);
        pass.hidden_in = hidden_in ? hidden_in + b0 * in_width : nullptr;
        pass.p0 = cache.size();
        s.toks.assign(tokens + b0, tokens + b0 + nb);
        s.pos.resize(sz(nb));
        for (int64_t i = 0; i < nb; ++i) s.pos[sz(i)] = static_cast<int32_t>(pass.p0 + i);
        s.seq_last.assign(sz(nb), last_pos);
        s.head.clear();
        if (all_logits)
            for (int64_t i = 0; i < nb; ++i) s.head.push_back(i);
        else if (last)
            s.head.push_back(nb - 1);
        run(pass, pool);
        cache.set_size(pass.p0 + nb);
        if (!s.head.empty()) {
            const float* l = s.slots[sz(s.slots_of[sz(p_.logits.id)][0])].data();
            std::copy_n(l, static_cast<int64_t>(s.head.size()) * V, all_logits ? logits + b0 * V : logits);
        }
        if (hidden_out) {
            const int64_t E = p_.width(p_.hidden);
            std::copy_n(gather(p_.hidden, nb, 0), nb * E, hidden_out + b0 * E);
        }
    }
}

void ProgramRunner::forward_batch(const SeqBatch* seqs, int n_seqs, const PagedKvStore& kv, ThreadPool& pool) {
    State& s = *st_;
    if (n_seqs <= 0) return;
    if (kv.kv_dim != p_.kv_dim || kv.n_layer != p_.n_kv_layers)
        fail("paged KV cache shape ({} layers × {}) does not match the model ({} × {})", kv.n_layer, kv.kv_dim,
             p_.n_kv_layers, p_.kv_dim);
    // Validate everything before evaluating anything.
    int64_t T = 0;
    for (int i = 0; i < n_seqs; ++i) {
        const SeqBatch& b = seqs[i];
        if (b.n <= 0 || !b.tokens || !b.block_table || b.n_past < 0) fail("forward_batch: entry {} is empty", i);
        if (!p_.delta_net.empty() && (b.state_slot < 0 || b.state_slot >= kv.n_state_slots ||
                                      kv.state_floats != p_.state_floats()))
            fail("forward_batch: entry {} has no recurrent-state slot ({} of {})", i, b.state_slot, kv.n_state_slots);
        for (int64_t j = 0; j < b.n; ++j)
            if (b.tokens[j] < 0 || b.tokens[j] >= p_.n_vocab)
                fail("token id {} is outside the vocabulary [0, {})", b.tokens[j], p_.n_vocab);
        if (b.hidden && !p_.hidden.valid()) fail("forward_batch: the program names no hidden rows to hand out");
        if (b.all_logits && !b.logits) fail("forward_batch: entry {} asks for every row's logits without a buffer", i);
        T += b.n;
    }
    // The given rows of a program that reads some (OpKind::Input), the
    // sequences' back to back.
    int64_t in_width = 0;
    for (const Op& op : p_.ops)
        if (op.kind == OpKind::Input) in_width = p_.width(op.out);
    if (in_width > 0) {
        s.hidden_in.resize(sz(T * in_width));
        int64_t at = 0;
        for (int i = 0; i < n_seqs; ++i) {
            if (!seqs[i].hidden_in) fail("forward_batch: entry {} gives no rows for the program's input", i);
            std::copy_n(seqs[i].hidden_in, seqs[i].n * in_width, s.hidden_in.data() + at);
            at += seqs[i].n * in_width;
        }
    }
    s.toks.resize(sz(T));
    s.pos.resize(sz(T));
    s.seq_last.resize(sz(T));
    s.head.clear();
    int64_t r = 0;
    for (int i = 0; i < n_seqs; ++i) {
        const SeqBatch& b = seqs[i];
        for (int64_t j = 0; j < b.n; ++j, ++r) {
            s.toks[sz(r)] = b.tokens[j];
            s.pos[sz(r)] = static_cast<int32_t>(b.n_past + j);
            s.seq_last[sz(r)] = b.n_past + b.n - 1;  // LongRoPE: per sequence, from its last position
        }
        if (b.all_logits)
            for (int64_t j = b.n; j > 0; --j) s.head.push_back(r - j);
        else if (b.logits)
            s.head.push_back(r - 1);
    }
    if (!p_.delta_net.empty())  // a sequence's state describes its positions so far: none at 0
        for (int i = 0; i < n_seqs; ++i)
            if (seqs[i].n_past == 0) std::fill_n(kv.state + seqs[i].state_slot * kv.state_floats, kv.state_floats, 0.0f);
    Pass pass;
    pass.rows = T;
    pass.path = MatmulPath::Gemm;
    pass.fp8_act = opts_.fp8_activation_rows > 0 && T >= opts_.fp8_activation_rows;
    pass.seqs = seqs;
    pass.n_seqs = n_seqs;
    pass.store = &kv;
    pass.hidden_in = in_width > 0 ? s.hidden_in.data() : nullptr;
    run(pass, pool);
    if (p_.hidden.valid()) {
        const int64_t E = p_.width(p_.hidden);
        const float* h = gather(p_.hidden, T, 0);
        int64_t at = 0;
        for (int q = 0; q < n_seqs; at += seqs[q].n, ++q)
            if (seqs[q].hidden) std::copy_n(h + at * E, seqs[q].n * E, seqs[q].hidden);
    }
    if (s.head.empty()) return;
    const int64_t V = p_.n_vocab;
    const float* l = s.slots[sz(s.slots_of[sz(p_.logits.id)][0])].data();
    int64_t i = 0;
    for (int q = 0; q < n_seqs; ++q) {
        if (!seqs[q].logits) continue;
        const int64_t rows = seqs[q].all_logits ? seqs[q].n : 1;
        std::copy_n(l + i * V, rows * V, seqs[q].logits);
        i += rows;
    }
}

}  // namespace quern::cpu
