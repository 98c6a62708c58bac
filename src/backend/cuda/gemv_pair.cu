// Two decode GEMVs on one activation in one launch (gemv_pair_kernel,
// gemv_common.cuh). Q4_K_M files keep Q and K in Q4_K and V in Q6_K on half
// the layers (llama.cpp's quantization mix), which would otherwise cost a
// second launch per layer for a 1024-row matrix; a Gated DeltaNet layer
// projects its input to [q|k|v] and to z, two matrices of one type.
//
// Pairs with a fused kernel: (Q4_K, Q6_K) and (Q4_K, Q4_K), one or two
// activation levels.
//   Rows:  Q4_K as R4 T64 U2 P (the Q|K configuration this pair was tuned
//          with; gemv() now runs larger Q4_K matrices as R4 T128 U1 P, not
//          tried here); Q6_K as R4 T64 U2 (its two-level default for V) —
//          same NT, so one block size.
//   Grid:  at most one wave of resident blocks (occupancy × SMs), split
//          between the two matrices so that the side with more rounds of row
//          groups (weighted by bytes) has as few as possible.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/gemv_q4_k.cuh"
#include "backend/cuda/gemv_q6_k.cuh"

namespace quern::cuda {
using namespace kern;

namespace {

constexpr int kPairThreads = 64;
constexpr int kPairRows1 = 4, kPairUnroll1 = 2;  // Q4_K
constexpr int kPairRows2 = 4, kPairUnroll2 = 2;  // Q6_K

// Bytes per 256 weights, which weight a round of row groups when the grid is
// split: Q4_K 144, Q6_K 210.
template <class Op>
constexpr bool kPairOp = std::is_same_v<Op, OpQ4_K> || std::is_same_v<Op, OpQ6_K>;

template <class Op>
constexpr int64_t kBytes256 = std::is_same_v<Op, OpQ6_K> ? 210 : 144;

template <class Op>
typename Op::Args pair_args(const GemvLaunch& l) {
    static_assert(kPairOp<Op>, "gemv_pair has kernels for Q4_K and Q6_K only");
    if constexpr (std::is_same_v<Op, OpQ6_K>) return q6_k_args(l);
    else return q4_k_args(l);
}

template <class Op1, class Op2, int L>
bool launch_pair(const GemvLaunch& l1, const GemvLaunch& l2, cudaStream_t stream) {
    constexpr auto kern = gemv_pair_kernel<Op1, kPairRows1, kPairUnroll1, Op2, kPairRows2, kPairUnroll2, kPairThreads, L>;
    const int resident = std::max(2, resident_blocks<kern>(kPairThreads));
    const int64_t groups1 = (l1.N + kPairRows1 - 1) / kPairRows1, groups2 = (l2.N + kPairRows2 - 1) / kPairRows2;
    // The split that minimizes the longer side's rounds of row groups, a
    // round weighted by its bytes: e.g. Llama-3-8B's 1280 Q|K and 256 V
    // groups on 792 resident blocks run as 664 + 128 blocks, two rounds each.
    int blocks1 = 1, blocks2 = 1;
    int64_t best = -1;
    for (int64_t b2 = 1; b2 <= std::min<int64_t>(groups2, resident - 1); ++b2) {
        const int64_t b1 = std::min<int64_t>(groups1, resident - b2);
        const int64_t cost = std::max((groups1 + b1 - 1) / b1 * kBytes256<Op1>, (groups2 + b2 - 1) / b2 * kBytes256<Op2>);
        if (best < 0 || cost < best || (cost == best && b1 + b2 < blocks1 + blocks2)) {
            best = cost;
            blocks1 = static_cast<int>(b1);
            blocks2 = static_cast<int>(b2);
        }
    }
    launch_pdl(kern, dim3(static_cast<unsigned>(blocks1 + blocks2)), dim3(kPairThreads), 0, stream,
               pair_args<Op1>(l1), residual_act(l1), l1.y, static_cast<int>(l1.N),
               static_cast<int>(l1.K / Op1::kUnitElems), pair_args<Op2>(l2), residual_act(l2), l2.y,
               static_cast<int>(l2.N), static_cast<int>(l2.K / Op2::kUnitElems), l1.scale, blocks1);
    return true;
}

template <class Op1, class Op2>
bool launch_levels(const GemvLaunch& l1, const GemvLaunch& l2, cudaStream_t stream) {
    return l1.xq2 ? launch_pair<Op1, Op2, 2>(l1, l2, stream) : launch_pair<Op1, Op2, 1>(l1, l2, stream);
}

}  // namespace

bool launch_gemv_pair(const GemvLaunch& l1, const GemvLaunch& l2, cudaStream_t stream) {
    if (l1.act != ActKind::Q8 || l2.act != ActKind::Q8 || l1.epi || l2.epi || l1.index || l2.index) return false;
    if (l1.K != l2.K || l1.xq != l2.xq || l1.xq2 != l2.xq2 || l1.scale.parts != l2.scale.parts) return false;
    if (l1.type == DType::Q4_K && l2.type == DType::Q6_K) return launch_levels<OpQ4_K, OpQ6_K>(l1, l2, stream);
    if (l1.type == DType::Q4_K && l2.type == DType::Q4_K) return launch_levels<OpQ4_K, OpQ4_K>(l1, l2, stream);
    return false;
}

}  // namespace quern::cuda
