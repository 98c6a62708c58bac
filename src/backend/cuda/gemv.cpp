#include "backend/cuda/gemv.h"

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tuning.h"
#include "core/error.h"

namespace quern::cuda {

QuantizedActivation::QuantizedActivation(int64_t K, int levels) : K_(K), levels_(levels) {
    if (K <= 0 || K % 32 != 0) fail("QuantizedActivation: K = {} is not a positive multiple of 32", K);
    if (levels != 1 && levels != 2) fail("QuantizedActivation: {} levels (1 or 2)", levels);
    buf_ = DeviceBuffer(level_bytes() * static_cast<size_t>(levels));
}

bool gemv_takes_quantized_activation(DType t) {
    return cuda_weight_type_supported(t) && dtype_is_quantized(t) && t != DType::F8_E4M3_B32;
}

int gemv_config_count() { return kNumGemvConfigs; }

const char* gemv_config_name(int config) {
    static const std::string* names = [] {
        auto* v = new std::string[kNumGemvConfigs];
        for (int i = 0; i < kNumGemvConfigs; ++i)
            v[i] = fmt::format("R{} T{} U{}{}", kGemvConfigs[i].rows, kGemvConfigs[i].threads,
                               kGemvConfigs[i].unroll, kGemvConfigs[i].persistent ? " P" : "");
        return v;
    }();
    return config >= 0 && config < kNumGemvConfigs ? names[config].c_str() : "?";
}

namespace {

constexpr int64_t kAny = INT64_MAX;

// A launch configuration rule: matrices of `type` (kAnyType: any type whose
// GEMV reads the quantized activation) with K in [k_min, k_max] and N in
// [n_min, n_max], under two-level activations (levels 2) or one level (0),
// get kGemvConfigs[config]. The first rule that matches wins; the last is the catch-all.
struct GemvRule {
    DType type;
    int levels;
    int64_t k_min, k_max, n_min, n_max;
    int config;
};
constexpr auto kAnyType = static_cast<DType>(0xffffffffu);  // no GGUF type has this id

// From bench_gemv_cuda's sweeps of every configuration on an H200 and, where a
// sweep and a whole decode step disagreed, the step (bench/gemv-cuda-h200.md,
// bench/decode-cuda-h200.md). The quantized kernels want few threads per row
// and 2-4 rows per block; the float kernels more threads per row. Two-level
// activations double the activation loads per weight load, so more rows per
// block (sharing them) pay off. Rows longer than 8192 (the FFN down
// projection) and the output head (N >= 65536) get their own rules.
// R rows per block, T threads per row, U units per thread, P persistent.
constexpr GemvRule kGemvRules[] = {
    {DType::Q4_K, 2, 8193, kAny, 0, kAny, 14},      // R4 T128 U1 P
    {DType::Q4_K, 2, 4096, kAny, 4097, 65535, 14},  // R4 T128 U1 P (fused Q|K|V, gate|up)
    {DType::Q4_K, 2, 0, kAny, 0, kAny, 10},         // R4 T64 U2 P
    {DType::Q6_K, 2, 8193, kAny, 0, kAny, 2},       // R4 T128 U1
    {DType::Q6_K, 2, 0, kAny, 65536, kAny, 10},     // R4 T64 U2 P (output)
    {DType::Q6_K, 2, 0, kAny, 2049, 8191, 7},       // R4 T32 U4 (q, o)
    {DType::Q6_K, 2, 0, kAny, 0, kAny, 4},          // R4 T64 U2
    {DType::Q8_0, 2, 8193, kAny, 0, kAny, 1},       // R2 T128 U2
    {DType::Q8_0, 2, 0, kAny, 0, kAny, 11},         // R2 T64 U2 P (fastest step, not alone)
    {kAnyType, 2, 8193, kAny, 0, kAny, 3},          // R2 T64 U2 (not swept)
    {kAnyType, 2, 0, kAny, 0, kAny, 4},             // R4 T64 U2 (not swept)
    // One level, or float activations.
    {DType::Q4_1, 0, 8193, kAny, 0, kAny, 4},       // R4 T64 U2
    {DType::Q4_1, 0, 0, kAny, 0, kAny, 3},          // R2 T64 U2
    {DType::Q8_0, 0, 8193, kAny, 0, kAny, 5},       // R1 T256 U2
    {DType::Q8_0, 0, 0, kAny, 0, kAny, 2},          // R4 T128 U1
    {DType::Q4_K, 0, 0, kAny, 0, 2048, 2},          // R4 T128 U1
    {DType::Q4_K, 0, 0, kAny, 0, kAny, 4},          // R4 T64 U2
    {DType::Q6_K, 0, 8193, kAny, 0, kAny, 1},       // R2 T128 U2
    {DType::Q6_K, 0, 0, kAny, 0, 8191, 7},          // R4 T32 U4
    {DType::Q6_K, 0, 0, kAny, 0, kAny, 3},          // R2 T64 U2
    {DType::Q4_0, 0, 0, kAny, 0, kAny, 2},          // R4 T128 U1
    {DType::Q5_1, 0, 0, kAny, 0, kAny, 2},          // R4 T128 U1
    {DType::Q5_0, 0, 0, kAny, 2049, 8192, 8},       // R2 T32 U4
    {DType::Q5_0, 0, 0, kAny, 0, kAny, 2},          // R4 T128 U1
    {DType::Q5_K, 0, 0, kAny, 8193, kAny, 3},       // R2 T64 U2
    {DType::Q5_K, 0, 0, kAny, 0, kAny, 2},          // R4 T128 U1
    {DType::Q2_K, 0, 0, kAny, 0, 2048, 3},          // R2 T64 U2
    {DType::Q2_K, 0, 0, kAny, 0, kAny, 4},          // R4 T64 U2
    {DType::Q3_K, 0, 0, kAny, 0, kAny, 4},          // R4 T64 U2
    {DType::F16, 0, 0, kAny, 0, 2048, 5},           // R1 T256 U2: few rows, many blocks
    {DType::F16, 0, 0, 8192, 8192, kAny, 7},        // R4 T32 U4
    {DType::F16, 0, 0, kAny, 0, kAny, 0},           // R1 T128 U4
    {DType::BF16, 0, 0, kAny, 0, 2048, 5},          // as F16
    {DType::BF16, 0, 0, 8192, 8192, kAny, 7},
    {DType::BF16, 0, 0, kAny, 0, kAny, 0},
    {DType::F32, 0, 0, kAny, 0, kAny, 5},           // R1 T256 U2
    // Not swept: NVFP4 reads 18 bytes per 32-element unit like Q4_0;
    // F8_E4M3_B32 one 16-byte load per unit like F16, with twice its elements.
    {DType::NVFP4, 0, 0, kAny, 0, kAny, 2},         // R4 T128 U1 (as Q4_0)
    {DType::F8_E4M3_B32, 0, 0, kAny, 0, 2048, 5},   // R1 T256 U2
    {DType::F8_E4M3_B32, 0, 8193, kAny, 0, kAny, 0},  // R1 T128 U4
    {DType::F8_E4M3_B32, 0, 0, kAny, 0, kAny, 1},   // R2 T128 U2
    {kAnyType, 0, 0, kAny, 0, kAny, 3},             // R2 T64 U2
};

}  // namespace

int gemv_default_config(DType type, int64_t N, int64_t K, bool float_activation, int levels) {
    (void)float_activation;
    // Two-level rules for two-level activations of the quantized types, else one-level rules.
    const int regime = levels == 2 && gemv_takes_quantized_activation(type) ? 2 : 0;
    for (const GemvRule& r : kGemvRules)
        if (r.levels == regime && (r.type == type || r.type == kAnyType) && K >= r.k_min && K <= r.k_max &&
            N >= r.n_min && N <= r.n_max)
            return r.config;
    return 3;  // unreachable: each regime ends with a catch-all
}

void quantize_activation(CudaContext& ctx, const float* x, QuantizedActivation& xq) {
    if (xq.K() <= 0) fail("quantize_activation: empty QuantizedActivation");
    launch_quantize_q8_1(x, xq.q(), xq.info(), xq.K(), ctx.stream(), xq.q2(), xq.info2());
    QUERN_CUDA_CHECK_LAUNCH();
}

namespace {

// Tuning::gemv_config (QUERN_GEMV_CONFIG): a configuration index per weight
// type in place of the rules, or -1.
int config_override(DType type, int64_t N = -1) {
    const auto& table = tuning().gemv_config;
    if (table.empty()) return -1;
    const std::string t(dtype_name(type)), tn = t + "@" + std::to_string(N);
    for (const auto& [name, idx] : table)
        if (name == t || name == tn) return idx;
    return -1;
}

void run(CudaContext& ctx, const GemvLaunch& l, const GemvOptions& opt) {
    const bool float_act = l.act == ActKind::F32;
    int config = opt.config;
    if (config < 0) config = config_override(l.type, l.N);
    if (config < 0) config = gemv_default_config(l.type, l.N, l.K, float_act, l.xq2 ? 2 : 1);
    if (config >= kNumGemvConfigs) fail("gemv: unknown configuration {} (0..{})", config, kNumGemvConfigs - 1);
    if (!launch_gemv(l, config, ctx.stream()))
        fail("gemv: no CUDA kernel for {} weights with {} activations", dtype_name(l.type),
             float_act ? "float" : "quantized");
    QUERN_CUDA_CHECK_LAUNCH();
}

GemvLaunch base_launch(const DeviceWeight& W, float* y) {
    if (W.N <= 0 || W.q == nullptr) fail("gemv: empty weight matrix");
    if (y == nullptr) fail("gemv: null output");
    GemvLaunch l{};
    l.type = W.type;
    l.w = WeightPtrs{W.q, W.q2, W.s, W.s2};
    l.N = W.N;
    l.K = W.K;
    l.y = y;
    return l;
}

/// Points launch l at the quantized activation xq (one or two levels).
void set_q8_activation(GemvLaunch& l, const QuantizedActivation& xq) {
    l.act = ActKind::Q8;
    l.xq = xq.q();
    l.xinfo = xq.info();
    if (xq.levels() == 2) {
        l.xq2 = xq.q(1);
        l.xinfo2 = xq.info(1);
    }
}

/// A launch of float-activation W (F32, F16, BF16, F8_E4M3_B32) on the float
/// activation x, after the checks every such entry point makes.
GemvLaunch f32_launch(const char* fn, const DeviceWeight& W, const float* x, float* y) {
    if (x == nullptr) fail("{}: null activation", fn);
    if (gemv_takes_quantized_activation(W.type))
        fail("{}: {} weights take a QuantizedActivation (quantize_activation), not float x", fn, dtype_name(W.type));
    GemvLaunch l = base_launch(W, y);
    l.act = ActKind::F32;
    l.x = x;
    return l;
}

/// A launch of quantized W on the quantized activation xq (one or two levels),
/// after the checks every such entry point makes (`fn` names it in errors).
GemvLaunch q8_launch(const char* fn, const DeviceWeight& W, const QuantizedActivation& xq, float* y) {
    if (!gemv_takes_quantized_activation(W.type))
        fail("{}: {} weights take float activations (use the float-x gemv)", fn, dtype_name(W.type));
    if (xq.K() != W.K) fail("{}: activation has {} elements, weight rows have {}", fn, xq.K(), W.K);
    GemvLaunch l = base_launch(W, y);
    set_q8_activation(l, xq);
    return l;
}

/// The kernels' form of a DeferredNormScale, after checking it.
ActScale act_scale(const DeferredNormScale& norm) {
    if (!norm.parts || norm.dim <= 0 || static_cast<int64_t>(norm.n_parts) * 32 != norm.dim)
        fail("gemv: DeferredNormScale needs dim/32 partial sums (dim {}, {} parts)", norm.dim, norm.n_parts);
    return ActScale{norm.parts, norm.n_parts, 1.0f / static_cast<float>(norm.dim), norm.eps, true};
}

}  // namespace

bool launch_gemv(const GemvLaunch& l, int config, cudaStream_t stream) {
    switch (l.type) {
        case DType::Q8_0: return launch_gemv_q8_0(l, config, stream);
        case DType::Q4_1: return launch_gemv_q4_1(l, config, stream);
        case DType::Q4_K: return launch_gemv_q4_k(l, config, stream);
        case DType::Q6_K: return launch_gemv_q6_k(l, config, stream);
        case DType::Q4_0: return launch_gemv_q4_0(l, config, stream);
        case DType::Q5_0: return launch_gemv_q5_0(l, config, stream);
        case DType::Q5_1: return launch_gemv_q5_1(l, config, stream);
        case DType::Q5_K: return launch_gemv_q5_k(l, config, stream);
        case DType::Q2_K: return launch_gemv_q2_k(l, config, stream);
        case DType::Q3_K: return launch_gemv_q3_k(l, config, stream);
        case DType::F32:
        case DType::F16:
        case DType::BF16: return launch_gemv_float(l, config, stream);
        case DType::F8_E4M3_B32: return launch_gemv_f8_e4m3(l, config, stream);
        case DType::NVFP4: return launch_gemv_nvfp4(l, config, stream);
        default: return false;
    }
}

void gemv(CudaContext& ctx, const DeviceWeight& W, const QuantizedActivation& xq, float* y, const GemvOptions& opt) {
    run(ctx, q8_launch("gemv", W, xq, y), opt);
}

void gemv(CudaContext& ctx, const DeviceWeight& W, const QuantizedActivation& xq, float* y,
          const DeferredNormScale& norm, const GemvOptions& opt) {
    const ActScale sc = act_scale(norm);
    GemvLaunch l = q8_launch("gemv", W, xq, y);
    l.scale = sc;
    run(ctx, l, opt);
}

void gemv_pair(CudaContext& ctx, const DeviceWeight& W1, float* y1, const DeviceWeight& W2, float* y2,
               const QuantizedActivation& xq, const DeferredNormScale* norm) {
    const ActScale sc = norm ? act_scale(*norm) : ActScale{};
    GemvLaunch l1 = q8_launch("gemv", W1, xq, y1), l2 = q8_launch("gemv", W2, xq, y2);
    l1.scale = l2.scale = sc;
    // The fused kernel runs the default configuration of each matrix only.
    const bool defaults = config_override(W1.type, W1.N) < 0 && config_override(W2.type, W2.N) < 0;
    if (defaults && launch_gemv_pair(l1, l2, ctx.stream())) {
        QUERN_CUDA_CHECK_LAUNCH();
        return;
    }
    run(ctx, l1, {});
    run(ctx, l2, {});
}

void gemv_residual_norm(CudaContext& ctx, const DeviceWeight& W, const QuantizedActivation& a, float* x,
                        const float* norm_w, QuantizedActivation& xq_next, float* ss_parts) {
    if (!x || !norm_w || !ss_parts) fail("gemv_residual_norm: null pointer");
    GemvLaunch l = q8_launch("gemv_residual_norm", W, a, x);
    if (W.N % 32 != 0) fail("gemv_residual_norm: N = {} is not a multiple of 32", W.N);
    if (xq_next.K() != W.N) fail("gemv_residual_norm: next activation has {} elements, N = {}", xq_next.K(), W.N);
    const NormEpilogue epi{x, norm_w, xq_next.q(), xq_next.info(), xq_next.q2(), xq_next.info2(), ss_parts,
                           true};
    l.epi = &epi;
    if (!launch_gemv(l, 0, ctx.stream())) fail("gemv_residual_norm: no CUDA kernel for {} weights", dtype_name(W.type));
    QUERN_CUDA_CHECK_LAUNCH();
}

namespace {

/// The launch of gemv_indexed over `l` (W's launch with its activation set):
/// N becomes the rows of one matrix, the index describes the slots.
void run_indexed(CudaContext& ctx, GemvLaunch l, int64_t rows, const int32_t* ids, int slots, int64_t act_stride,
                 int64_t act_half_k, const GemvOptions& opt) {
    if (rows <= 0 || l.N % rows != 0) fail("gemv_indexed: {} rows per matrix do not divide the bank's {}", rows, l.N);
    if (slots < 1 || slots > 65535) fail("gemv_indexed: {} slots (1..65535)", slots);
    if (!ids) fail("gemv_indexed: null ids");
    if (l.N / rows > (int64_t{1} << 30)) fail("gemv_indexed: {} matrices", l.N / rows);
    GemvIndex ix;
    ix.ids = ids;
    ix.n_ids = static_cast<int>(l.N / rows);
    ix.slots = slots;
    ix.act_stride = act_stride;
    ix.act_half_k = act_half_k;
    l.N = rows;
    l.index = &ix;
    int config = opt.config;
    if (config < 0) config = config_override(l.type);
    if (config < 0) config = gemv_default_config(l.type, l.N, l.K, l.act == ActKind::F32, l.xq2 ? 2 : 1);
    if (config >= kNumGemvConfigs) fail("gemv_indexed: unknown configuration {} (0..{})", config, kNumGemvConfigs - 1);
    if (!launch_gemv(l, config, ctx.stream()))
        fail("gemv_indexed: no CUDA kernel for {} weights with {} activations", dtype_name(l.type),
             l.act == ActKind::F32 ? "float" : "quantized");
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gemv_indexed(CudaContext& ctx, const DeviceWeight& W, int64_t rows, const QuantizedActivation& xq, bool per_slot,
                  const int32_t* ids, int slots, float* y, const GemvOptions& opt) {
    if (!gemv_takes_quantized_activation(W.type))
        fail("gemv_indexed: {} weights take float activations (use the float-x gemv_indexed)", dtype_name(W.type));
    const int64_t want = per_slot ? static_cast<int64_t>(slots) * W.K : W.K;
    if (xq.K() != want)
        fail("gemv_indexed: activation has {} elements, expected {} ({} slots of {}{})", xq.K(), want, slots, W.K,
             per_slot ? ", one row per slot" : ", shared");
    // q8_launch checks xq.K() against W.K; build the launch by hand.
    GemvLaunch l = base_launch(W, y);
    set_q8_activation(l, xq);
    run_indexed(ctx, l, rows, ids, slots, per_slot ? W.K : 0, xq.K() / 2, opt);
}

void gemv_indexed(CudaContext& ctx, const DeviceWeight& W, int64_t rows, const float* x, bool per_slot,
                  const int32_t* ids, int slots, float* y, const GemvOptions& opt) {
    GemvLaunch l = f32_launch("gemv_indexed", W, x, y);
    run_indexed(ctx, l, rows, ids, slots, per_slot ? W.K : 0, 0, opt);
}

void gemv(CudaContext& ctx, const DeviceWeight& W, const float* x, float* y, const GemvOptions& opt) {
    run(ctx, f32_launch("gemv", W, x, y), opt);
}

}  // namespace quern::cuda
