// RoPE of one decode token fused with the KV-cache write. API: ops.h.
//
// rope_kv_kernel<T>
//   Shapes:  q: n_head × head_dim floats (in place); k, v: n_head_kv ×
//            head_dim floats; caches: n_ctx rows × n_head_kv × head_dim T.
//   Grid:    one block per head: blocks [0, n_head) rotate q heads,
//            [n_head, n_head + n_head_kv) rotate k heads into the cache,
//            the rest copy v heads. head_dim/2 threads; thread i owns rotation
//            pair i (i < rope_dim/2) or the two pass-through elements
//            rope_dim + 2(i − rope_dim/2) + {0, 1}.
//   Math:    the angle as cpu::rope computes it, in double: inv_freq =
//            float(base^(−2i/rope_dim) / ff[i]), a = pos · inv_freq, cos/sin in
//            double rounded to float; the rotation in fp32.
//   Align:   none (scalar accesses).
//   Bound:   latency (a few KB per token).
#include "backend/cuda/launch.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace quern::cuda {
namespace {

template <class T>
__global__ void rope_kv_kernel(float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                               T* __restrict__ k_cache, T* __restrict__ v_cache, const int32_t* __restrict__ pos_ptr,
                               int n_ctx, int n_head, int n_head_kv, int head_dim, int rope_dim, float base, bool neox,
                               const float* __restrict__ freq_factors) {
    pdl_wait();
    pdl_trigger();
    int pos = *pos_ptr;
    pos = pos < 0 ? 0 : (pos >= n_ctx ? n_ctx - 1 : pos);
    const int head = blockIdx.x;
    const int i = threadIdx.x;
    const int64_t row = static_cast<int64_t>(pos) * n_head_kv * head_dim;
    if (head >= n_head + n_head_kv) {  // v: plain copy of elements 2i, 2i+1
        const int hk = head - n_head - n_head_kv;
        const float* src = v + static_cast<int64_t>(hk) * head_dim;
        T* dst = v_cache + row + static_cast<int64_t>(hk) * head_dim;
        dst[2 * i] = detail::from_f32<T>(src[2 * i]);
        dst[2 * i + 1] = detail::from_f32<T>(src[2 * i + 1]);
        return;
    }
    const int half = rope_dim / 2;
    int i0, i1;
    float c = 1.0f, s = 0.0f;
    if (i < half) {
        i0 = neox ? i : 2 * i;
        i1 = neox ? i + half : 2 * i + 1;
        double f = pow(static_cast<double>(base), -2.0 * i / rope_dim);
        if (freq_factors) f /= freq_factors[i];
        const double a = static_cast<double>(pos) * static_cast<double>(static_cast<float>(f));
        double sd, cd;
        sincos(a, &sd, &cd);
        c = static_cast<float>(cd);
        s = static_cast<float>(sd);
    } else {
        i0 = rope_dim + 2 * (i - half);
        i1 = i0 + 1;
    }
    const bool is_q = head < n_head;
    const float* src = is_q ? q + static_cast<int64_t>(head) * head_dim
                            : k + static_cast<int64_t>(head - n_head) * head_dim;
    const float a = src[i0], b = src[i1];
    const float r0 = i < half ? a * c - b * s : a;
    const float r1 = i < half ? a * s + b * c : b;
    if (is_q) {
        float* dst = q + static_cast<int64_t>(head) * head_dim;
        dst[i0] = r0;
        dst[i1] = r1;
    } else {
        T* dst = k_cache + row + static_cast<int64_t>(head - n_head) * head_dim;
        dst[i0] = detail::from_f32<T>(r0);
        dst[i1] = detail::from_f32<T>(r1);
    }
}

}  // namespace

void rope_kv_store(float* q, const float* k, const float* v, void* k_cache, void* v_cache, KvType kv_type,
                   const int32_t* pos, int n_ctx, int n_head, int n_head_kv, int head_dim, int rope_dim, float base,
                   bool neox, const float* freq_factors, cudaStream_t stream) {
    if (n_head < 1 || n_head_kv < 1 || n_ctx < 1 || head_dim < 2 || head_dim % 2 != 0 || head_dim > 1024 ||
        rope_dim < 0 || rope_dim % 2 != 0 || rope_dim > head_dim)
        throw_error("rope_kv_store: bad shape (need even head_dim <= 1024, even rope_dim <= head_dim)");
    if (!q || !k || !v || !k_cache || !v_cache || !pos) throw_error("rope_kv_store: null pointer");
    const unsigned grid = static_cast<unsigned>(n_head + 2 * n_head_kv);
    const unsigned threads = static_cast<unsigned>(head_dim / 2);
    if (kv_type == KvType::F16)
        launch_pdl(rope_kv_kernel<__half>, dim3(grid), dim3(threads), 0, stream, q, k, v, static_cast<__half*>(k_cache),
                   static_cast<__half*>(v_cache), pos, n_ctx, n_head, n_head_kv, head_dim, rope_dim, base, neox,
                   freq_factors);
    else
        launch_pdl(rope_kv_kernel<float>, dim3(grid), dim3(threads), 0, stream, q, k, v, static_cast<float*>(k_cache),
                   static_cast<float*>(v_cache), pos, n_ctx, n_head, n_head_kv, head_dim, rope_dim, base, neox,
                   freq_factors);
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace quern::cuda
