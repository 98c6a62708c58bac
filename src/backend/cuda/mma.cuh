// Tensor-core and asynchronous-copy primitives (PTX ISA 8.x:
// mma.sync.m16n8k16 and m16n8k8, wgmma.mma_async, cp.async), shared by the kernels that stage
// their operands in shared memory themselves (bq_gemm.cu, grouped_gemm.cu,
// ops_paged.cu, ops_flash.cu, delta_rule_chunked.cu).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace quern::cuda::mma {

/// d += A·B for one m16n8k16 tile, BF16 inputs, fp32 accumulators. Lane
/// L = 4g + c holds: a[0] = A[g][2c, 2c+1], a[1] = A[g+8][2c, 2c+1],
/// a[2] = A[g][2c+8, 2c+9], a[3] = A[g+8][2c+8, 2c+9]; b0 = B[2c, 2c+1][g],
/// b1 = B[2c+8, 2c+9][g] (the lower k in the low half); d[0..1] =
/// D[g][2c, 2c+1], d[2..3] = D[g+8][2c, 2c+1].
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// mma_bf16 with f16 inputs (same fragment layouts).
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats rounded to f16 (to nearest) in one register, a in the low half.
__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
}

/// Four 8×8 b16 matrices, transposed (ldmatrix .x4 .trans), from the row
/// addresses of lanes 0-7, 8-15, 16-23, 24-31 (shared memory, 16-byte
/// aligned rows): register i holds matrix i, as mma B fragments of a
/// row-major K × N tile.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                                  const void* p) {
    const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a));
}

/// x rounded to TF32 (cvt.rna: to nearest, ties away from zero), the form
/// mma_tf32 takes its inputs in.
__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

/// d += A·B for one m16n8k8 tile, TF32 inputs (to_tf32), fp32 accumulators.
/// Lane L = 4g + c holds: a[0] = A[g][c], a[1] = A[g+8][c], a[2] = A[g][c+4],
/// a[3] = A[g+8][c+4]; b0 = B[c][g], b1 = B[c+4][g]; d[0..1] = D[g][2c, 2c+1],
/// d[2..3] = D[g+8][2c, 2c+1] (mma_bf16's accumulator layout).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Copies 16 bytes from global to shared memory asynchronously (cp.async.cg:
/// through L2 only); `valid` false writes 16 zero bytes and reads nothing.
/// Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const int n = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem), "r"(n));
}

/// cp_async16 to a shared-space address (as __cvta_generic_to_shared gives).
__device__ __forceinline__ void cp_async16(uint32_t smem, const void* gmem, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(n));
}

/// Closes this thread's group of cp.async copies issued so far.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}


/// Copies 4 bytes from global to shared memory asynchronously (cp.async.ca:
/// kept in L1, for data that nearby copies read again); `valid` false writes
/// 4 zero bytes and reads nothing. Both addresses 4-byte aligned.
__device__ __forceinline__ void cp_async4(uint32_t smem, const void* gmem, bool valid) {
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem), "r"(n));
}

// ------------------------------------------------------------------ wgmma
// Warpgroup matrix multiply-accumulate (PTX ISA 8.0+, sm_90a only:
// QUERN_WGMMA is defined in the device passes that have it). A warpgroup is
// 4 consecutive warps starting at a warp index divisible by 4; every
// instruction below is issued by all 128 of its threads together.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QUERN_WGMMA 1
#endif

/// Orders this thread's earlier register writes (A fragments, accumulators)
/// before the wgmma operations that follow (wgmma.fence).
__device__ __forceinline__ void wgmma_fence() {
#ifdef QUERN_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#elif defined(__CUDA_ARCH__)
    __trap();  // no wgmma in this device pass: callers guard with QUERN_WGMMA
#endif
}
/// Closes the group of wgmma operations issued so far (wgmma.commit_group).
__device__ __forceinline__ void wgmma_commit() {
#ifdef QUERN_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}
/// Waits until at most N committed wgmma groups are pending; before that
/// their A registers and accumulators must not be touched.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef QUERN_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}
/// Makes this thread's generic-proxy writes to shared memory (stores,
/// cp.async) visible to the async proxy that wgmma reads through; a barrier
/// after it publishes them to the other threads.
__device__ __forceinline__ void fence_proxy_async_smem() {
#ifdef QUERN_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/// Pins the four registers of an A fragment: the instructions computing
/// them stay before the wgmma_fence that follows (else they may be
/// scheduled between the wgmma operations, which ptxas then separates).
__device__ __forceinline__ void fence_operand(uint32_t (&a)[4]) {
    asm volatile("" : "+r"(a[0]), "+r"(a[1]), "+r"(a[2]), "+r"(a[3])::"memory");
}

/// Shared-memory matrix descriptor of wgmma (PTX ISA: "Matrix Descriptor
/// Format"), no swizzling: `addr` the shared-space byte address of the first
/// 8 × 16-byte core matrix; lbo the bytes between core matrices adjacent in
/// K, sbo between those adjacent in M/N (all multiples of 16).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | static_cast<uint64_t>(lbo >> 4) << 16 |
           static_cast<uint64_t>(sbo >> 4) << 32;
}

/// Shared-memory matrix descriptor of wgmma for a K-major operand in the
/// 128-byte swizzle mode (PTX ISA: "Matrix Descriptor Format", "Shared
/// Memory Matrix Layout"): rows of 128 bytes (64 BF16 of K), 16-byte unit u
/// of row r stored at unit u ^ (r % 8), in 1024-byte atoms of 8 rows (the
/// SBO); `addr` the row-0 address of the k16 step's 32 bytes (atom base +
/// 32·step), the atom base 1024-byte aligned. Unlike the no-swizzle form
/// the rows' reads fall in distinct banks.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr) {
    return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | uint64_t{1} << 16 | uint64_t{1024 >> 4} << 32 |
           uint64_t{1} << 62;
}

/// d += A·B for one wgmma.m64nNk16 (N = 8·NT, NT = 4, 8, 16 or 32), BF16 inputs, fp32
/// accumulators, A from registers, B (N × 16, K-major) from shared memory by
/// descriptor. Warp w of the warpgroup holds rows 16w .. 16w+15 of A and D in
/// exactly mma_bf16's fragment layout: a as there, d[t][0..3] = the m16n8
/// fragment of tokens 8t .. 8t+7 (d[t][0..1] = D[g][8t+2c, +1], d[t][2..3] =
/// D[g+8][8t+2c, +1]).
template <int NT>
__device__ __forceinline__ void wgmma_bf16(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t desc);

template <>
__device__ __forceinline__ void wgmma_bf16<4>(float (&d)[4][4], const uint32_t (&a)[4], uint64_t desc) {
#ifdef QUERN_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
          "+f"(d[3][2]), "+f"(d[3][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}

template <>
__device__ __forceinline__ void wgmma_bf16<8>(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc) {
#ifdef QUERN_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"
        "%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
          "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
          "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}

template <>
__device__ __forceinline__ void wgmma_bf16<16>(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc) {
#ifdef QUERN_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
          "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
          "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
          "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
          "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}

// The 32 accumulator operands of tiles t .. t+7 (wgmma_bf16<32>'s 128).
#define QUERN_WG_D1(t) "+f"(d[t][0]), "+f"(d[t][1]), "+f"(d[t][2]), "+f"(d[t][3])
#define QUERN_WG_D8(t)                                                                                       \
    QUERN_WG_D1(t), QUERN_WG_D1(t + 1), QUERN_WG_D1(t + 2), QUERN_WG_D1(t + 3), QUERN_WG_D1(t + 4), \
        QUERN_WG_D1(t + 5), QUERN_WG_D1(t + 6), QUERN_WG_D1(t + 7)

template <>
__device__ __forceinline__ void wgmma_bf16<32>(float (&d)[32][4], const uint32_t (&a)[4], uint64_t desc) {
#ifdef QUERN_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
        "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
        "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
        "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
        "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
        "}, {%128,%129,%130,%131}, %132, p, 1, 1, 0;\n}\n"
        : QUERN_WG_D8(0), QUERN_WG_D8(8), QUERN_WG_D8(16), QUERN_WG_D8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}
/// d = A·B (accumulate false: scale-d 0) or d += A·B for one
/// wgmma.m64nNk32 (N = 8·NT, NT = 4, 8 or 16) of OCP E4M3 inputs with fp32
/// accumulators, A (64 × 32) and B (N × 32) both from shared memory by
/// descriptor, both K-major (the only layout FP8 takes). D as wgmma_bf16.
/// The tensor cores add FP8 products with fewer bits than fp32 (about 14
/// mantissa bits kept between partial sums, DeepSeek-V3 report §3.3.2):
/// callers over long K add a few steps' d into fp32 themselves.
template <int NT>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[NT][4], uint64_t da, uint64_t db, bool accumulate);

template <>
__device__ __forceinline__ void wgmma_e4m3<4>(float (&d)[4][4], uint64_t da, uint64_t db, bool accumulate) {
#ifdef QUERN_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1;\n}\n"
        : QUERN_WG_D1(0), QUERN_WG_D1(1), QUERN_WG_D1(2), QUERN_WG_D1(3)
        : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)));
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}

template <>
__device__ __forceinline__ void wgmma_e4m3<8>(float (&d)[8][4], uint64_t da, uint64_t db, bool accumulate) {
#ifdef QUERN_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1;\n}\n"
        : QUERN_WG_D8(0)
        : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)));
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}

template <>
__device__ __forceinline__ void wgmma_e4m3<16>(float (&d)[16][4], uint64_t da, uint64_t db, bool accumulate) {
#ifdef QUERN_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}\n"
        : QUERN_WG_D8(0), QUERN_WG_D8(8)
        : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)));
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}

#undef QUERN_WG_D8
#undef QUERN_WG_D1

}  // namespace quern::cuda::mma
