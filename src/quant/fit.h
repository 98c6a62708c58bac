// The scale searches behind the reference quantizers (reference_kquants.cpp)
// and the importance-weighted ones (weighted.cpp): each fits a group of n
// floats to integer codes times a scale (and an offset), minimising a
// weighted squared or absolute error. They follow the arithmetic of ggml's
// make_qkx2/qkx3_quants, make_qx_quants and make_qp_quants step for step
// (the same float operations in the same order, with FMA contraction off), so
// that files quantized here equal llama-quantize's.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace quern::ref {

/// Below this magnitude a group is treated as all zeros (ggml's GROUP_MAX_EPS).
inline constexpr float kGroupMaxEps = 1e-15f;

inline int clampi(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

/// Block i of an array of blocks B at `base` (any alignment).
template <class B>
void store_block(void* base, int64_t i, const B& b) {
    std::memcpy(static_cast<unsigned char*>(base) + i * static_cast<int64_t>(sizeof(B)), &b, sizeof(B));
}

/// Weighted affine fit: x[i] ≈ scale·L[i] − the_min, L in [0, nmax],
/// the_min ≥ 0. Starts from the min/max grid, then tries nstep+1 grid
/// spacings (nmax + rmin + rdelta·s)/(max − min), solving weighted least
/// squares for scale and offset on each and keeping the smallest weighted
/// error (|diff| with use_mad, else diff²). Writes L and the_min; returns
/// scale. w: n weights; Laux: n bytes of scratch.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* the_min, uint8_t* Laux,
                    float rmin, float rdelta, int nstep, bool use_mad);

/// Symmetric fit x ≈ scale·l, l in [−nmax, nmax−1], weights x², refined by
/// up to 5 passes of coordinate descent on the least-squares objective.
/// Writes L = l + nmax; returns scale (0 for an all-zero group).
float fit_symmetric_refine(int n, int nmax, const float* x, int8_t* L);

/// Symmetric fit x ≈ scale·l, l in [−nmax, nmax−1]: the least-squares scale
/// for the grid −nmax/max, then for the 18 grids −(nmax + 0.1·s)/max,
/// s = ±1..±9, keeping the one of largest (Σ w x l)² / Σ w l². Weights `qw`
/// (n floats), or x² when null. Writes L = l + nmax; returns scale.
float fit_symmetric_search(int n, int nmax, const float* x, int8_t* L, const float* qw = nullptr);

/// Fit of non-negative values x ≈ scale·L, L in [0, nmax], under weights w:
/// the best of the grids (nmax + 0.1·s)/max, s = −4..4, by weighted squared
/// error, then up to 5 passes of coordinate descent. Used for the scales and
/// mins of a super-block. Returns scale (0 for an all-zero group).
float fit_positive(int n, int nmax, const float* x, uint8_t* L, const float* w);

/// The weights of n elements under importance weights: imp·sqrt(σ² + x²)
/// (ggml's quant_weights scaling; σ² the caller's mean square).
inline void importance_weights(int n, const float* x, const float* imp, float sigma2, float* w) {
    for (int i = 0; i < n; ++i) w[i] = imp[i] * std::sqrt(sigma2 + x[i] * x[i]);
}

/// The sum of x² over n elements, in order.
inline float sum_squares(int64_t n, const float* x) {
    float s = 0;
    for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
    return s;
}

/// Packs the 2-bit values L[0..255] as Q2_K/Q3_K store them: element
/// 128·h + 32·j + l goes to bits 2j.. of qs[32·h + l].
void pack_2bit(const uint8_t* L, uint8_t* qs);

/// Q4_K/Q5_K: 6-bit scale ls and min lm of sub-block j (0..7) into 12 bytes.
/// j < 4: bytes j and j+4 hold ls and lm in their low 6 bits. j ≥ 4: byte j+4
/// holds the low nibbles of ls | lm << 4, and the top 2 bits of ls and lm go
/// to bits 6..7 of bytes j−4 and j.
void pack_scale_min_k4(int j, int ls, int lm, uint8_t* s);

}  // namespace quern::ref
