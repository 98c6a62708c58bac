// The CUDA Gated DeltaNet kernels (src/backend/cuda/delta_rule.h) against a
// scalar host reference on fresh random data: the conv (with each sequence's
// conv state), SiLU and q/k L2 norm as DeltaNetSpec defines them, then
// cpu::delta_rule_tokens per (sequence, value head). Several sequences of
// different row counts in one pass (a decode step is one row each), head
// sizes 32 / 64 / 128, grouped and tiled value heads; sequences long enough
// for the chunked (tensor-core) form, and that form alone on every length.
// Outputs and both parts of every sequence's state within 2e-4 relative
// (expf and FMA contraction against the CPU's; 3e-3 for the chunked form's
// TF32 products), and a second identical call bit-identical.
//
// The small kernels around it in a DeltaNet layer and in gated attention and
// shared experts (ops.h: rms_norm_groups, the sigmoid gate of swiglu_q8_1
// and glu_rows_bf16, add_sigmoid_gated) against scalar host references too.
//
// Needs a GPU at run time: skips (GTEST_SKIP) where there is none.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <random>
#include <vector>

#include "backend/cpu/delta_rule.h"
#include "backend/cuda/context.h"
#include "backend/cuda/delta_rule.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/ops.h"

using namespace quern;
using namespace quern::cuda;

namespace {

struct Shape {
    int nk, nv, dk, dv;
    bool tiled;
};

struct Layer {
    Shape sh;
    int K = 4;
    std::vector<float> conv, a_coef, dt_bias;
    int64_t C() const { return 2 * int64_t{sh.nk} * sh.dk + int64_t{sh.nv} * sh.dv; }
    int64_t state_floats() const { return (K - 1) * C() + int64_t{sh.nv} * sh.dk * sh.dv; }
};

/// The host reference of one pass: rows of each sequence in order.
void reference(const Layer& L, const std::vector<float>& x, const std::vector<float>& ba,
               const std::vector<int>& row0, const std::vector<int>& n_rows, std::vector<std::vector<float>>& states,
               std::vector<float>& y) {
    const int64_t C = L.C(), K = L.K, nk = L.sh.nk, nv = L.sh.nv, dk = L.sh.dk, dv = L.sh.dv, kd = nk * dk;
    const int64_t n = static_cast<int64_t>(x.size()) / C;
    std::vector<float> xc(x.size());
    y.assign(static_cast<size_t>(n * nv * dv), 0.0f);
    for (size_t s = 0; s < row0.size(); ++s) {
        float* conv_state = states[s].data();
        for (int r = row0[s]; r < row0[s] + n_rows[s]; ++r) {
            const float* xr = x.data() + r * C;
            float* c = xc.data() + r * C;
            for (int64_t ch = 0; ch < C; ++ch) {
                float acc = 0.0f;
                for (int64_t j = 0; j < K - 1; ++j) acc += conv_state[j * C + ch] * L.conv[static_cast<size_t>(ch * K + j)];
                acc += xr[ch] * L.conv[static_cast<size_t>(ch * K + K - 1)];
                c[ch] = acc / (1.0f + std::exp(-acc));
            }
            std::copy(conv_state + C, conv_state + (K - 1) * C, conv_state);
            std::copy_n(xr, C, conv_state + (K - 2) * C);
            for (int64_t h = 0; h < 2 * nk; ++h) {
                float* v = c + h * dk;
                float ss = 0.0f;
                for (int64_t i = 0; i < dk; ++i) ss += v[i] * v[i];
                const float inv = 1.0f / std::sqrt(ss + 1e-6f) * (h < nk ? 1.0f / std::sqrt(static_cast<float>(dk)) : 1.0f);
                for (int64_t i = 0; i < dk; ++i) v[i] *= inv;
            }
        }
        for (int64_t h = 0; h < nv; ++h) {
            const int64_t kh = L.sh.tiled ? h % nk : h / (nv / nk);
            std::vector<float> g, beta;
            for (int r = row0[s]; r < row0[s] + n_rows[s]; ++r) {
                const float u = ba[static_cast<size_t>(r * 2 * nv + nv + h)] + L.dt_bias[static_cast<size_t>(h)];
                g.push_back(L.a_coef[static_cast<size_t>(h)] * (u > 20.0f ? u : std::log1p(std::exp(u))));
                beta.push_back(1.0f / (1.0f + std::exp(-ba[static_cast<size_t>(r * 2 * nv + h)])));
            }
            cpu::DeltaRuleRun run;
            const float* base = xc.data() + row0[s] * C;
            run.q = base + kh * dk;
            run.k = base + kd + kh * dk;
            run.v = base + 2 * kd + h * dv;
            run.ld_qk = run.ld_v = C;
            run.g = g.data();
            run.beta = beta.data();
            run.o = y.data() + row0[s] * nv * dv + h * dv;
            run.ld_o = nv * dv;
            run.T = n_rows[s];
            run.dk = dk;
            run.dv = dv;
            std::vector<float> mem(static_cast<size_t>(dv));
            cpu::delta_rule_tokens(run, states[s].data() + (K - 1) * C + h * dk * dv, mem.data());
        }
    }
}

double max_rel(const std::vector<float>& got, const std::vector<float>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        num = std::max(num, static_cast<double>(std::abs(got[i] - want[i])));
        den = std::max(den, static_cast<double>(std::abs(want[i])));
    }
    return num / std::max(den, 1e-30);
}

class DeltaRuleCuda : public ::testing::TestWithParam<Shape> {
protected:
    void SetUp() override {
        if (CudaContext::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
    }
};

/// What a pass holds and how it runs the recurrence: mixed row counts
/// through delta_rule (its own choice per sequence) or delta_rule_chunked
/// for every sequence; or one row per sequence (a decode step: the conv
/// kernel moves the conv state on itself).
/// FusedStep: one row per sequence through delta_step (conv and recurrence
/// in one launch).
enum class Mode { Dispatch, AllChunked, DecodeStep, FusedStep };

void check_pass(const Shape& sh, Mode mode, int col_groups = 0) {
    std::mt19937 rng(static_cast<uint32_t>(sh.dk * 131 + sh.dv * 7 + sh.nv + sh.tiled));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    Layer L{sh};
    const int64_t C = L.C();
    for (int64_t i = 0; i < C * L.K; ++i) L.conv.push_back(0.5f * nd(rng));
    for (int h = 0; h < sh.nv; ++h) {
        L.a_coef.push_back(-std::exp(0.5f * nd(rng)));
        L.dt_bias.push_back(nd(rng));
    }
    // Decode rows, short prompt chunks (the token kernel) and long ones (the
    // chunked kernel from 32 rows: whole chunks of 64 and partial ones).
    const std::vector<int> n_rows =
        mode == Mode::DecodeStep || mode == Mode::FusedStep ? std::vector<int>{1, 1, 1}
                                                            : std::vector<int>{1, 5, 17, 1, 200, 64, 31, 33};
    std::vector<int> row0;
    int n = 0;
    for (int c : n_rows) {
        row0.push_back(n);
        n += c;
    }
    std::vector<float> x(static_cast<size_t>(n * C)), ba(static_cast<size_t>(n * 2 * sh.nv));
    for (auto& v : x) v = nd(rng);
    for (auto& v : ba) v = nd(rng);
    std::vector<std::vector<float>> states(n_rows.size());
    for (auto& st : states) {
        st.resize(static_cast<size_t>(L.state_floats()));
        for (auto& v : st) v = 0.3f * nd(rng);
    }

    CudaContext ctx;
    const cudaStream_t stream = ctx.stream();
    const auto up = [&](const void* p, size_t bytes) {
        DeviceBuffer b(bytes);
        b.upload(p, bytes, stream);
        return b;
    };
    DeviceBuffer d_conv = up(L.conv.data(), L.conv.size() * 4), d_a = up(L.a_coef.data(), L.a_coef.size() * 4),
                 d_dt = up(L.dt_bias.data(), L.dt_bias.size() * 4), d_x = up(x.data(), x.size() * 4),
                 d_ba = up(ba.data(), ba.size() * 4), d_row0 = up(row0.data(), row0.size() * 4),
                 d_n = up(n_rows.data(), n_rows.size() * 4);
    std::vector<DeviceBuffer> d_states;
    std::vector<float*> ptrs;
    for (const auto& st : states) {
        d_states.push_back(up(st.data(), st.size() * 4));
        ptrs.push_back(d_states.back().as<float>());
    }
    DeviceBuffer d_ptrs = up(ptrs.data(), ptrs.size() * sizeof(float*));
    DeviceBuffer d_xc(x.size() * 4), d_y(static_cast<size_t>(n) * sh.nv * sh.dv * 4);
    DeltaLayer dl;
    dl.n_k_heads = sh.nk;
    dl.n_v_heads = sh.nv;
    dl.head_k = sh.dk;
    dl.head_v = sh.dv;
    dl.conv_kernel = L.K;
    dl.kv_tiled = sh.tiled;
    dl.conv = d_conv.as<float>();
    dl.a_coef = d_a.as<float>();
    dl.dt_bias = d_dt.as<float>();
    DeltaSeqs ds;
    ds.row0 = d_row0.as<int32_t>();
    ds.n_rows = d_n.as<int32_t>();
    ds.state = d_ptrs.as<float*>();
    ds.n_seqs = static_cast<int>(n_rows.size());
    DeviceBuffer d_counts(n_rows.size() * static_cast<size_t>(sh.nk) * sizeof(int));
    d_counts.fill_bytes(0, stream);
    const auto pass = [&] {
        if (mode == Mode::FusedStep) {
            delta_step(d_x.as<float>(), d_ba.as<float>(), d_y.as<float>(), ds, dl, d_counts.as<int>(), stream);
            return;
        }
        delta_conv(d_x.as<float>(), d_xc.as<float>(), n, ds, dl, stream);
        if (mode == Mode::AllChunked) delta_rule_chunked(d_xc.as<float>(), d_ba.as<float>(), d_y.as<float>(), ds, dl, 1, stream, col_groups);
        else delta_rule(d_xc.as<float>(), d_ba.as<float>(), d_y.as<float>(), n, ds, dl, stream);
    };
    pass();

    std::vector<float> y_ref;
    std::vector<std::vector<float>> ref_states = states;
    reference(L, x, ba, row0, n_rows, ref_states, y_ref);
    std::vector<float> y(y_ref.size());
    d_y.download(y.data(), y.size() * 4, stream);
    const int64_t VD = int64_t{sh.nv} * sh.dv;
    for (size_t s = 0; s < states.size(); ++s) {
        // The token kernel within 2e-4 relative (expf and FMA contraction
        // against the CPU's); the chunked one's TF32 products within 3e-3.
        const bool chunked = delta_rule_chunked_supported(dl) && (mode == Mode::AllChunked || n_rows[s] >= 32);
        const double tol = chunked ? 3e-3 : 2e-4;
        const auto rows = [&](const std::vector<float>& v) {
            return std::vector<float>(v.begin() + row0[s] * VD, v.begin() + (row0[s] + n_rows[s]) * VD);
        };
        EXPECT_LT(max_rel(rows(y), rows(y_ref)), tol) << "outputs of sequence " << s << " (" << n_rows[s] << " rows)";
        std::vector<float> st(states[s].size());
        d_states[s].download(st.data(), st.size() * 4, stream);
        const auto conv_end = static_cast<size_t>((L.K - 1) * C);
        EXPECT_EQ(std::vector<float>(st.begin(), st.begin() + static_cast<int64_t>(conv_end)),
                  std::vector<float>(ref_states[s].begin(), ref_states[s].begin() + static_cast<int64_t>(conv_end)))
            << "conv state of sequence " << s;
        EXPECT_LT(max_rel(std::vector<float>(st.begin() + static_cast<int64_t>(conv_end), st.end()),
                          std::vector<float>(ref_states[s].begin() + static_cast<int64_t>(conv_end), ref_states[s].end())),
                  tol)
            << "delta-rule state of sequence " << s << " (" << n_rows[s] << " rows)";
    }
    if (mode == Mode::FusedStep) {  // every key head's counter back at zero
        std::vector<int> counts(n_rows.size() * static_cast<size_t>(sh.nk), -1);
        d_counts.download(counts.data(), counts.size() * sizeof(int), stream);
        EXPECT_EQ(counts, std::vector<int>(counts.size(), 0));
    }
    // The same inputs and states again: the same bits.
    for (size_t s = 0; s < states.size(); ++s) d_states[s].upload(states[s].data(), states[s].size() * 4, stream);
    pass();
    std::vector<float> y2(y.size());
    d_y.download(y2.data(), y2.size() * 4, stream);
    EXPECT_EQ(y2, y);
}

TEST_P(DeltaRuleCuda, ConvAndRecurrenceMatchTheHost) { check_pass(GetParam(), Mode::Dispatch); }

TEST_P(DeltaRuleCuda, DecodeStepMatchesTheHost) { check_pass(GetParam(), Mode::DecodeStep); }

TEST_P(DeltaRuleCuda, FusedDecodeStepMatchesTheHost) { check_pass(GetParam(), Mode::FusedStep); }

TEST_P(DeltaRuleCuda, ChunkedFormMatchesTheHostForEveryLength) {
    DeltaLayer dl;
    dl.head_k = GetParam().dk;
    dl.head_v = GetParam().dv;
    if (!delta_rule_chunked_supported(dl)) GTEST_SKIP() << "heads the chunked kernel does not take";
    for (int groups : {1, 2, 4}) {  // heads of 128 split their value columns over 1, 2 or 4 blocks
        SCOPED_TRACE("column groups " + std::to_string(groups));
        check_pass(GetParam(), Mode::AllChunked, groups);
        if (GetParam().dk != 128) break;  // other heads take one block
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DeltaRuleCuda,
                         ::testing::Values(Shape{2, 4, 32, 32, false}, Shape{2, 4, 32, 32, true},
                                           Shape{2, 2, 64, 64, false}, Shape{4, 8, 128, 128, true},
                                           Shape{2, 6, 128, 64, false}),
                         [](const auto& info) {
                             const Shape& s = info.param;
                             return std::to_string(s.nk) + "k" + std::to_string(s.nv) + "v_" + std::to_string(s.dk) +
                                    "x" + std::to_string(s.dv) + (s.tiled ? "_tiled" : "");
                         });

TEST(DeltaRuleCudaArgs, UnsupportedShapesAreRefused) {
    DeltaLayer dl;
    dl.n_k_heads = 2;
    dl.n_v_heads = 4;
    dl.head_k = 48;  // not 32, 64 or 128
    dl.head_v = 32;
    dl.conv_kernel = 4;
    DeltaSeqs ds;
    EXPECT_THROW(delta_rule(nullptr, nullptr, nullptr, 1, ds, dl, nullptr), std::exception);
    dl.head_k = 64;  // not square
    EXPECT_THROW(delta_rule_chunked(nullptr, nullptr, nullptr, ds, dl, 1, nullptr), std::exception);
}

}  // namespace

namespace {

std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

DeviceBuffer to_device(const std::vector<float>& v, cudaStream_t s) {
    DeviceBuffer b(v.size() * 4);
    b.upload(v.data(), v.size() * 4, s);
    return b;
}

std::vector<float> to_host(const DeviceBuffer& b, size_t n, CudaContext& ctx) {
    std::vector<float> v(n);
    ctx.synchronize();
    b.download(v.data(), n * 4, ctx.stream());
    return v;
}

float bf16_value(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

}  // namespace

// Per-group RMSNorm (a DeltaNet's per-value-head output norm) into rows of
// a wider stride, against a double-precision host norm per group.
TEST(GatedOpsCuda, RmsNormGroups) {
    if (CudaContext::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
    CudaContext ctx;
    std::mt19937 rng(31);
    for (const auto [n, width, group] : {std::tuple{1, 128, 32}, std::tuple{7, 6144, 128}, std::tuple{3, 512, 512}}) {
        const auto x = random_floats(static_cast<size_t>(n * width), rng, -3.0f, 3.0f);
        const auto w = random_floats(static_cast<size_t>(group), rng, 0.5f, 1.5f);
        const int64_t ldy = 2 * width;
        DeviceBuffer dx = to_device(x, ctx.stream()), dw = to_device(w, ctx.stream());
        DeviceBuffer dy(static_cast<size_t>(n * ldy) * 4);
        dy.fill_bytes(0, ctx.stream());
        rms_norm_groups(dx.as<float>(), dw.as<float>(), dy.as<float>(), ldy, n, width, group, 1e-6f, ctx.stream());
        const auto y = to_host(dy, static_cast<size_t>(n * ldy), ctx);
        for (int64_t r = 0; r < n; ++r)
            for (int64_t g0 = 0; g0 < width; g0 += group) {
                double ss = 0;
                for (int64_t i = 0; i < group; ++i) ss += double{x[r * width + g0 + i]} * x[r * width + g0 + i];
                const double inv = 1.0 / std::sqrt(ss / group + 1e-6);
                for (int64_t i = 0; i < group; ++i) {
                    const double want = x[r * width + g0 + i] * inv * w[i];
                    ASSERT_NEAR(y[r * ldy + g0 + i], want, 1e-5 * std::fabs(want) + 1e-6)
                        << "row " << r << " element " << g0 + i << " width " << width;
                }
            }
    }
}

// The decode step's gated RMSNorm in one launch: the floats against a
// double-precision host norm and SiLU gate, and its quantized row (one and
// two levels) byte for byte what quantize_activation makes of those floats.
TEST(GatedOpsCuda, GatedRmsNormQ8_1) {
    if (CudaContext::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
    CudaContext ctx;
    std::mt19937 rng(35);
    for (const auto [width, group] : {std::tuple{6144, 128}, std::tuple{4096, 128}, std::tuple{96, 32}, std::tuple{1024, 1024}})
        for (int levels : {1, 2}) {
            const auto y = random_floats(static_cast<size_t>(width), rng, -3.0f, 3.0f);
            const auto z = random_floats(static_cast<size_t>(width), rng, -6.0f, 6.0f);
            const auto w = random_floats(static_cast<size_t>(group), rng, 0.5f, 1.5f);
            DeviceBuffer dy = to_device(y, ctx.stream()), dz = to_device(z, ctx.stream()), dw = to_device(w, ctx.stream());
            DeviceBuffer dh(static_cast<size_t>(width) * 4);
            dh.fill_bytes(0xFF, ctx.stream());
            QuantizedActivation a(width, levels), b(width, levels);
            gated_rms_norm_q8_1(dy.as<float>(), dw.as<float>(), dz.as<float>(), dh.as<float>(), a.q(), a.info(), a.q2(),
                                a.info2(), width, group, 1e-6f, ctx.stream());
            const auto h = to_host(dh, static_cast<size_t>(width), ctx);
            for (int64_t g0 = 0; g0 < width; g0 += group) {
                double ss = 0;
                for (int64_t i = 0; i < group; ++i) ss += double{y[g0 + i]} * y[g0 + i];
                const double inv = 1.0 / std::sqrt(ss / group + 1e-6);
                for (int64_t i = 0; i < group; ++i) {
                    const double zi = z[g0 + i];
                    const double want = zi / (1.0 + std::exp(-zi)) * (y[g0 + i] * inv * w[i]);
                    ASSERT_NEAR(h[g0 + i], want, 2e-5 * std::fabs(want) + 1e-6) << "width " << width << " element " << g0 + i;
                }
            }
            quantize_activation(ctx, dh.as<float>(), b);
            const size_t bytes = a.level_bytes() * static_cast<size_t>(levels);
            std::vector<uint8_t> ga(bytes), gb(bytes);
            ctx.synchronize();
            cudaMemcpy(ga.data(), a.q(), bytes, cudaMemcpyDeviceToHost);
            cudaMemcpy(gb.data(), b.q(), bytes, cudaMemcpyDeviceToHost);
            EXPECT_EQ(0, std::memcmp(ga.data(), gb.data(), bytes)) << "width " << width << " levels " << levels;
        }
    DeviceBuffer d(4096);
    EXPECT_ANY_THROW(gated_rms_norm_q8_1(d.as<float>(), d.as<float>(), d.as<float>(), nullptr, nullptr, nullptr, nullptr,
                                         nullptr, 96, 48, 1e-6f, ctx.stream()));
}

// The sigmoid gate (gated attention): swiglu_q8_1 and glu_rows_bf16 with
// kGateSigmoid give u / (1 + e^-g).
TEST(GatedOpsCuda, SigmoidGate) {
    if (CudaContext::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
    CudaContext ctx;
    std::mt19937 rng(32);
    const int64_t n = 5, F = 256;
    const auto gu = random_floats(static_cast<size_t>(n * 2 * F), rng, -6.0f, 6.0f);
    DeviceBuffer dgu = to_device(gu, ctx.stream()), dh(static_cast<size_t>(F) * 4), db(static_cast<size_t>(n * F) * 2);
    const auto want = [&](int64_t r, int64_t i) {
        return gu[r * 2 * F + F + i] / (1.0 + std::exp(-double{gu[r * 2 * F + i]}));
    };
    swiglu_q8_1(dgu.as<float>(), dgu.as<float>() + F, dh.as<float>(), nullptr, nullptr, F, ctx.stream(), nullptr,
                nullptr, kGateSigmoid);
    const auto h = to_host(dh, static_cast<size_t>(F), ctx);
    for (int64_t i = 0; i < F; ++i) ASSERT_NEAR(h[i], want(0, i), 1e-5 * std::fabs(want(0, i)) + 1e-6) << i;
    glu_rows_bf16(dgu.as<float>(), 2 * F, n, F, db.as<uint16_t>(), kGateSigmoid, ctx.stream());
    std::vector<uint16_t> b(static_cast<size_t>(n * F));
    ctx.synchronize();
    db.download(b.data(), b.size() * 2, ctx.stream());
    for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < F; ++i)
            ASSERT_NEAR(bf16_value(b[r * F + i]), want(r, i), 4e-3 * std::fabs(want(r, i)) + 1e-6) << r << " " << i;
}

// A shared expert's gated add, the row read as floats or as BF16.
TEST(GatedOpsCuda, AddSigmoidGated) {
    if (CudaContext::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
    CudaContext ctx;
    std::mt19937 rng(33);
    const int64_t n = 6, dim = 2048;
    auto x = random_floats(static_cast<size_t>(n * dim), rng, -1.0f, 1.0f);
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) {  // values exact in BF16, so both forms read the same row
        uint32_t u;
        std::memcpy(&u, &x[i], 4);
        u &= 0xFFFF0000u;
        std::memcpy(&x[i], &u, 4);
        xb[i] = static_cast<uint16_t>(u >> 16);
    }
    const auto w = random_floats(static_cast<size_t>(dim), rng, -0.1f, 0.1f);
    const auto y = random_floats(static_cast<size_t>(n * dim), rng, -2.0f, 2.0f);
    const auto out0 = random_floats(static_cast<size_t>(n * dim), rng, -2.0f, 2.0f);
    DeviceBuffer dx = to_device(x, ctx.stream()), dw = to_device(w, ctx.stream()), dy = to_device(y, ctx.stream());
    DeviceBuffer dxb(xb.size() * 2);
    dxb.upload(xb.data(), xb.size() * 2, ctx.stream());
    for (bool bf16 : {false, true}) {
        DeviceBuffer dout = to_device(out0, ctx.stream());
        if (bf16) add_sigmoid_gated(dxb.as<uint16_t>(), dw.as<float>(), dy.as<float>(), dout.as<float>(), n, dim, ctx.stream());
        else add_sigmoid_gated(dx.as<float>(), dw.as<float>(), dy.as<float>(), dout.as<float>(), n, dim, ctx.stream());
        const auto out = to_host(dout, out0.size(), ctx);
        for (int64_t r = 0; r < n; ++r) {
            double d = 0;
            for (int64_t i = 0; i < dim; ++i) d += double{x[r * dim + i]} * w[i];
            const double g = 1.0 / (1.0 + std::exp(-d));
            for (int64_t i = 0; i < dim; ++i) {
                const double want = out0[r * dim + i] + g * y[r * dim + i];
                ASSERT_NEAR(out[r * dim + i], want, 1e-5 * std::fabs(want) + 1e-5) << (bf16 ? "bf16 " : "f32 ") << r;
            }
        }
    }
}
