// FP8 W8A8 GEMM on the Tensor Memory Accelerator and wgmma: kernel and
// launch (API, method and numerics: fp8_gemm.h).
#include "backend/cuda/fp8_gemm.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/bq_common.cuh"
#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/tma.h"

namespace quern::cuda {
namespace {

constexpr int kF8Threads = 384;  // the copying warpgroup, then the two multiplying ones
constexpr int kF8Rows = 128;     // weight rows per block: 64 per multiplying warpgroup
constexpr int kF8Slice = 128;    // K elements (bytes) per stage: one 128-byte swizzle row

template <int NT>
struct F8Shape {
    static constexpr int kTok = 8 * NT;              // activation rows per block
    static constexpr int kA = kF8Rows * kF8Slice;    // the weight tile of a stage
    static constexpr int kB = kTok * kF8Slice;       // the activation tile
    static constexpr int kStage = kA + kB;
    // ~192 KiB of ring: one block per SM. (Two blocks of four stages each
    // for up to 64 tokens measured the same: bench/batched-cuda-h200.md.)
    static constexpr int kStages = NT <= 8 ? 8 : 6;
    // + the full and empty mbarriers, + the ring's alignment to 1024 bytes.
    static constexpr int kSmem = kStages * kStage + kStages * 16 + 1024;
    static_assert(kA % 1024 == 0 && kB % 1024 == 0, "stages of whole swizzle atoms");
};

// fp8_gemm_kernel<NT>
//   Shapes:  tw: the tensor map of the N × K weight codes (boxes 128 × 128);
//            tx: of the n × K activation codes (boxes 128 × 8·NT); sw, sx
//            their row scales; the product covers weight rows row0 ..
//            row0+rows−1 (output column j = weight row row0 + j); y: n rows
//            at stride ldy floats.
//   Grid:    (ceil(n / (8·NT)), ceil(rows / 128), splits) blocks of 384
//            threads: block (t, b, z) multiplies weight rows 128·b .. of the
//            product by activation rows 8·NT·t .. over slices z·sps ..
//            z·sps + sps − 1 of K (128 elements each). Thread 0 copies slice kb (K
//            elements 128·kb ..) of both tiles into stage kb % S once the
//            stage's empty barrier has had both multiplying warpgroups'
//            arrivals of round kb / S − 1; warpgroup G = 1, 2 waits on the
//            stage's full barrier, multiplies its 64 rows (wgmma, A and B from
//            the stage), waits for them, frees the stage and adds the
//            slice's sums into its fp32 accumulators.
//   Output:  one split: each thread writes its accumulators (wgmma's
//            fragment layout) times the two scales straight to y; several:
//            the unscaled sums to work[z][r][j] for fp8_splits_kernel. Rows
//            past the product and activation rows past n are not written.
template <int NT>
__global__ void __launch_bounds__(kF8Threads, 1)
    fp8_gemm_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx,
                    const float* __restrict__ sw, const float* __restrict__ sx, int row0, int rows, int n, int K,
                    float* __restrict__ y, int64_t ldy, int sps, float* __restrict__ work) {
#ifdef QUERN_WGMMA
    using Sh = F8Shape<NT>;
    constexpr int S = Sh::kStages;
    extern __shared__ __align__(128) uint8_t smem_raw[];
    const uint32_t base = (tma::smem_addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t full = base + S * Sh::kStage, empty = full + 8 * S;  // barrier of stage s: + 8·s
    const int tid = static_cast<int>(threadIdx.x), wg = tid >> 7;
    const int t0 = static_cast<int>(blockIdx.x) * Sh::kTok, rb = static_cast<int>(blockIdx.y) * kF8Rows;
    const int kb0 = static_cast<int>(blockIdx.z) * sps, nk = min((K + kF8Slice - 1) / kF8Slice, kb0 + sps);
    if (tid == 0) {
        for (int s = 0; s < S; ++s) {
            tma::mbar_init(full + 8 * s, 1);
            tma::mbar_init(empty + 8 * s, 2);
        }
        tma::mbar_init_fence();
    }
    __syncthreads();
    if (wg == 0) {
        if (tid == 0) {
            for (int kb = kb0, s = 0, round = 0; kb < nk; ++kb) {
                const uint32_t st = base + static_cast<uint32_t>(s * Sh::kStage);
                tma::mbar_wait(empty + 8 * s, (round & 1) ^ 1);
                tma::mbar_arrive_expect_tx(full + 8 * s, Sh::kStage);
                tma::load_2d(st, &tw, kb * kF8Slice, row0 + rb, full + 8 * s);
                tma::load_2d(st + Sh::kA, &tx, kb * kF8Slice, t0, full + 8 * s);
                if (++s == S) s = 0, ++round;
            }
        }
        return;
    }
    const int c = wg - 1, lt = tid & 127;
    float acc[NT][4], part[NT][4];
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][e] = part[t][e] = 0.0f;
    for (int kb = kb0, s = 0, round = 0; kb < nk; ++kb) {
        const uint32_t st = base + static_cast<uint32_t>(s * Sh::kStage);
        tma::mbar_wait(full + 8 * s, round & 1);
        mma::wgmma_fence();  // part was read by the previous slice's adds
        const uint32_t a = st + static_cast<uint32_t>(c * 64 * kF8Slice), b = st + Sh::kA;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            mma::wgmma_e4m3<NT>(part, mma::wgmma_desc_sw128(a + 32 * j), mma::wgmma_desc_sw128(b + 32 * j), j > 0);
        mma::wgmma_commit();
        mma::wgmma_wait<0>();
        if (lt == 0) tma::mbar_arrive(empty + 8 * s);
        // The slice's sums into fp32: the tensor cores' FP8 sums keep fewer
        // bits, and over a whole row of K they would drift (fp8_gemm.h).
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[t][e] += part[t][e];
        if (++s == S) s = 0, ++round;
    }
    const int w = lt >> 5, lane = lt & 31, g = lane >> 2, q = lane & 3;
    const int ra = rb + 64 * c + 16 * w + g, rb8 = ra + 8;
    // One split: scaled into y; several: this split's sums, unscaled (× 1
    // is exact), into work for fp8_splits_kernel.
    const bool split = gridDim.z > 1;
    float* const out = split ? work + static_cast<int64_t>(blockIdx.z) * n * rows : y;
    const int64_t ld = split ? rows : ldy;
    const float swa = ra < rows && !split ? sw[row0 + ra] : 1.0f, swb = rb8 < rows && !split ? sw[row0 + rb8] : 1.0f;
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int tk = t0 + 8 * t + 2 * q + e;
            if (tk >= n) continue;
            const float s = split ? 1.0f : sx[tk];
            float* yr = out + static_cast<int64_t>(tk) * ld;
            if (ra < rows) yr[ra] = acc[t][e] * swa * s;
            if (rb8 < rows) yr[rb8] = acc[t][2 + e] * swb * s;
        }
#else
    __trap();  // launched only on devices that run the sm_90a code (fp8_gemm_supported)
#endif
}

// fp8_splits_kernel: y[r·ldy + j] = sx[r] · sw[j] · Σ_z work[(z·n + r)·rows + j]
// for r < n, j < rows, the K splits added in split order (the same result
// on every run). One thread per output.
__global__ void __launch_bounds__(256) fp8_splits_kernel(const float* __restrict__ work, int splits, int n, int rows,
                                                         const float* __restrict__ sw, const float* __restrict__ sx,
                                                         float* __restrict__ y, int64_t ldy) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, total = static_cast<int64_t>(n) * rows;
    if (i >= total) return;
    const int r = static_cast<int>(i / rows), j = static_cast<int>(i % rows);
    float s = 0.0f;
    for (int z = 0; z < splits; ++z) s += work[z * total + i];
    y[static_cast<int64_t>(r) * ldy + j] = s * sw[j] * sx[r];
}

template <int NT>
void launch_f8(const CUtensorMap& tw, const float* sw, int64_t K, int64_t row0, int64_t rows, const uint8_t* qx,
               const float* sx, int64_t n, float* y, int64_t ldy, float* work, int64_t work_elems, cudaStream_t stream) {
    using Sh = F8Shape<NT>;
    const auto kernel = fp8_gemm_kernel<NT>;
    static const bool sized = [] {
        QUERN_CUDA_CHECK(
            cudaFuncSetAttribute(fp8_gemm_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, Sh::kSmem));
        return true;
    }();
    (void)sized;
    const CUtensorMap tx = tensor_map_2d_u8(qx, static_cast<uint64_t>(K), static_cast<uint64_t>(n),
                                            static_cast<uint64_t>(K), kF8Slice, Sh::kTok, CU_TENSOR_MAP_SWIZZLE_128B);
    const int64_t tx_blocks = (n + Sh::kTok - 1) / Sh::kTok, ty_blocks = (rows + kF8Rows - 1) / kF8Rows;
    // Splits of K while the blocks leave SMs idle (one block per SM): the
    // 4096-row matrices of an 8B model give 32 blocks per 128 tokens. At
    // least 4 slices per split; their sums meet in `work`.
    const int64_t nk = (K + kF8Slice - 1) / kF8Slice, blocks = tx_blocks * ty_blocks;
    int64_t splits = work ? std::min<int64_t>({CudaContext::current_sm_count() / blocks, nk / 4, 8}) : 1;
    while (splits > 1 && splits * n * rows > work_elems) --splits;
    splits = std::max<int64_t>(splits, 1);
    const int64_t sps = (nk + splits - 1) / splits;
    splits = (nk + sps - 1) / sps;
    const dim3 grid(static_cast<unsigned>(tx_blocks), static_cast<unsigned>(ty_blocks), static_cast<unsigned>(splits));
    kernel<<<grid, kF8Threads, Sh::kSmem, stream>>>(
        tw, tx, sw, sx, static_cast<int>(row0), static_cast<int>(rows), static_cast<int>(n), static_cast<int>(K), y,
        ldy, static_cast<int>(sps), work);
    QUERN_CUDA_CHECK_LAUNCH();
    if (splits > 1) {
        const int64_t total = n * rows;
        fp8_splits_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(
            work, static_cast<int>(splits), static_cast<int>(n), static_cast<int>(rows), sw + row0, sx, y, ldy);
        QUERN_CUDA_CHECK_LAUNCH();
    }
}

}  // namespace

bool fp8_gemm_supported(int64_t K) {
    return K > 0 && K % 16 == 0 && K < (int64_t{1} << 31) && device_has_wgmma();
}

void fp8_gemm(const uint8_t* qw, const float* sw, int64_t N, int64_t K, int64_t row0, int64_t rows, const uint8_t* qx,
              const float* sx, int64_t n, float* y, int64_t ldy, cudaStream_t stream, float* work,
              int64_t work_elems) {
    if (!qw || !sw || !qx || !sx || !y) throw_error("fp8_gemm: null pointer");
    if (!fp8_gemm_supported(K))
        throw_error("fp8_gemm: rows of " + std::to_string(K) +
                    " codes on this device (needs a multiple of 16 and a device running the sm_90a code)");
    if (n < 1 || n >= (int64_t{1} << 31) || N >= (int64_t{1} << 31) || row0 < 0 || rows < 1 || row0 + rows > N ||
        ldy < rows || (rows + kF8Rows - 1) / kF8Rows > 65535)
        throw_error("fp8_gemm: shape out of range");
    if (reinterpret_cast<uintptr_t>(qw) % 16 != 0 || reinterpret_cast<uintptr_t>(qx) % 16 != 0)
        throw_error("fp8_gemm: codes must be 16-byte aligned");
    const CUtensorMap tw = tensor_map_2d_u8(qw, static_cast<uint64_t>(K), static_cast<uint64_t>(N),
                                            static_cast<uint64_t>(K), kF8Slice, kF8Rows, CU_TENSOR_MAP_SWIZZLE_128B);
    if (n <= 32) return launch_f8<4>(tw, sw, K, row0, rows, qx, sx, n, y, ldy, work, work_elems, stream);
    if (n <= 64) return launch_f8<8>(tw, sw, K, row0, rows, qx, sx, n, y, ldy, work, work_elems, stream);
    launch_f8<16>(tw, sw, K, row0, rows, qx, sx, n, y, ldy, work, work_elems, stream);
}

}  // namespace quern::cuda
