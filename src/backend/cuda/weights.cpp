#include "backend/cuda/weights.h"

#include <array>
#include <string>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace quern::cuda {

namespace {

// Bytes per row of each stream (q, q2, s, s2) in the device layout.
std::array<size_t, 4> stream_row_bytes(DType t, int64_t K) {
    const auto k = static_cast<size_t>(K);
    switch (t) {
        case DType::F32: return {4 * k, 0, 0, 0};
        case DType::F16:
        case DType::BF16: return {2 * k, 0, 0, 0};
        case DType::Q8_0: return {k, 0, 2 * (k / 32), 0};
        case DType::Q4_1: return {k / 2, 0, 4 * (k / 32), 0};
        case DType::Q4_K: return {k / 2, 0, 16 * (k / 256), 0};
        case DType::Q6_K: return {k / 2, k / 4, k / 16, 2 * (k / 256)};
        case DType::Q4_0: return {k / 2, 0, 2 * (k / 32), 0};
        case DType::Q5_0: return {k / 2, 4 * (k / 32), 2 * (k / 32), 0};
        case DType::Q5_1: return {k / 2, 0, 8 * (k / 32), 0};
        case DType::Q5_K: return {k / 2, 4 * (k / 32), 16 * (k / 256), 0};
        case DType::Q2_K: return {k / 4, 0, k / 16, 4 * (k / 256)};
        case DType::Q3_K: return {k / 4, k / 8, 12 * (k / 256), 2 * (k / 256)};
        case DType::F8_E4M3_B32: return {k, 0, 4 * (k / 32), 0};
        case DType::NVFP4: return {k / 2, 0, 8 * (k / 64), 0};
        default: return {0, 0, 0, 0};
    }
}

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Copies the rows of host tensor w, tightly packed (row_size bytes each), to dst.
void copy_rows(const Tensor& w, uint8_t* dst, cudaStream_t stream) {
    const size_t rb = w.row_bytes();
    for (int64_t i3 = 0; i3 < w.ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < w.ne[2]; ++i2) {
            const auto* src = static_cast<const uint8_t*>(w.data) + i2 * w.nb[2] + i3 * w.nb[3];
            uint8_t* d = dst + (static_cast<size_t>(i3 * w.ne[2] + i2) * static_cast<size_t>(w.ne[1])) * rb;
            QUERN_CUDA_CHECK(cudaMemcpy2DAsync(d, rb, src, w.nb[1], rb, static_cast<size_t>(w.ne[1]),
                                               cudaMemcpyHostToDevice, stream));
        }
}

}  // namespace

bool cuda_weight_type_supported(DType t) {
    switch (t) {
        case DType::F32:
        case DType::F16:
        case DType::BF16:
        case DType::Q8_0:
        case DType::Q4_1:
        case DType::Q4_K:
        case DType::Q6_K:
        case DType::Q4_0:
        case DType::Q5_0:
        case DType::Q5_1:
        case DType::Q5_K:
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::F8_E4M3_B32:
        case DType::NVFP4: return true;
        default: return false;
    }
}

DeviceWeight upload_weight(CudaContext& ctx, const Tensor& w) { return upload_weight(ctx, std::vector<const Tensor*>{&w}); }

DeviceWeight upload_weight(CudaContext& ctx, const std::vector<const Tensor*>& parts) {
    if (parts.empty() || !parts[0]) fail("upload_weight: no tensor");
    const Tensor& w = *parts[0];
    const std::string name = w.name.empty() ? std::string("(unnamed)") : w.name;
    if (!cuda_weight_type_supported(w.type))
        fail("tensor '{}': weight type {} has no CUDA kernel (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
             "Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F8_E4M3_B32, NVFP4)",
             name, dtype_name(w.type));
    const int64_t K = w.ne[0];
    const auto& info = dtype_info(w.type);
    const int64_t align_elems = w.type == DType::F32 ? 4 : (!dtype_is_quantized(w.type) ? 8 : info.block_size);
    if (K <= 0 || K % align_elems != 0 || K > (int64_t{1} << 30))
        fail("tensor '{}': row length {} must be a positive multiple of {} (at most 2^30) for CUDA {} weights", name,
             K, align_elems, dtype_name(w.type));
    int64_t N = 0;
    for (const Tensor* p : parts) {
        const std::string pn = p && !p->name.empty() ? p->name : std::string("(unnamed)");
        if (!p || p->device != Device::CPU || p->data == nullptr) fail("tensor '{}': upload_weight needs host data", pn);
        if (p->type != w.type || p->ne[0] != K)
            fail("tensor '{}' ({}, rows of {}) cannot share one device matrix with '{}' ({}, rows of {})", pn,
                 dtype_name(p->type), p->ne[0], name, dtype_name(w.type), K);
        if (p->ne[1] <= 0 || p->ne[2] <= 0 || p->ne[3] <= 0) fail("tensor '{}': an empty dimension", pn);
        if (p->nb[1] < p->row_bytes())
            fail("tensor '{}': row stride {} is below the row size {}", pn, p->nb[1], p->row_bytes());
        N += p->ne[1] * p->ne[2] * p->ne[3];
    }
    if (N > (int64_t{1} << 31) - 1) fail("tensor '{}': {} rows is not a valid CUDA weight matrix", name, N);

    ctx.make_current();
    const auto rows = stream_row_bytes(w.type, K);
    std::array<size_t, 4> off{};
    size_t total = 0;
    for (int i = 0; i < 4; ++i) {
        off[i] = total;
        total = align_up(total + rows[i] * static_cast<size_t>(N), 256);
    }

    DeviceWeight dw;
    dw.type = w.type;
    dw.K = K;
    dw.N = N;
    dw.buf = DeviceBuffer(total);
    auto* base = dw.buf.as<uint8_t>();
    dw.q = base + off[0];
    dw.q2 = rows[1] ? base + off[1] : nullptr;
    dw.s = rows[2] ? base + off[2] : nullptr;
    dw.s2 = rows[3] ? base + off[3] : nullptr;

    const cudaStream_t stream = ctx.stream();
    const auto copy_parts = [&](uint8_t* dst) {  // every part's rows, back to back
        for (const Tensor* p : parts) {
            copy_rows(*p, dst, stream);
            dst += p->row_bytes() * static_cast<size_t>(p->ne[1] * p->ne[2] * p->ne[3]);
        }
    };
    if (!dtype_is_quantized(w.type)) {
        copy_parts(static_cast<uint8_t*>(dw.q));
    } else {
        DeviceBuffer staging(w.row_bytes() * static_cast<size_t>(N));
        copy_parts(staging.as<uint8_t>());
        const int64_t n_blocks = N * (K / info.block_size);
        launch_repack(w.type, staging.as<uint8_t>(), n_blocks, K, dw.q, dw.q2, dw.s, dw.s2, stream);
        QUERN_CUDA_CHECK_LAUNCH();
        ctx.synchronize();  // staging must outlive the repack
    }
    ctx.synchronize();
    return dw;
}

}  // namespace quern::cuda
