// Implementations of quant/fit.h; see there for what each fit does.
#include "quant/no_fp_contract.h"  // first: applies to everything below, fit.h's inline code too
#include "quant/fit.h"

#include <cmath>

#include "quant/ref_rows.h"


namespace quern::ref {

float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* the_min, uint8_t* Laux,
                    float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        std::fill(L, L + n, uint8_t{0});
        *the_min = -min;
        return 0.f;
    }
    float iscale = static_cast<float>(nmax) / (max - min);
    float scale = 1 / iscale;
    auto error_of = [&](float s, float m, const uint8_t* q) {
        float e = 0;
        for (int i = 0; i < n; ++i) {
            float diff = s * static_cast<float>(q[i]) + m - x[i];
            diff = use_mad ? std::fabs(diff) : diff * diff;
            e += w[i] * diff;
        }
        return e;
    };
    for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(clampi(nearest_int(iscale * (x[i] - min)), 0, nmax));
    float best_error = error_of(scale, min, L);
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int step = 0; step <= nstep; ++step) {
        iscale = (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = static_cast<uint8_t>(l);
            const float fl = static_cast<float>(l);
            sum_l += w[i] * fl;
            sum_l2 += w[i] * fl * fl;
            sum_xl += w[i] * fl * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            const float err = error_of(this_scale, this_min, Laux);
            if (err < best_error) {
                std::copy(Laux, Laux + n, L);
                best_error = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

namespace {

/// The value of largest magnitude (the first one on ties); false, with L
/// zeroed, for an all-zero group.
bool signed_max(int n, const float* x, int8_t* L, float& max) {
    float amax = 0;
    max = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax >= kGroupMaxEps) return true;
    std::fill(L, L + n, int8_t{0});
    return false;
}

}  // namespace

float fit_symmetric_refine(int n, int nmax, const float* x, int8_t* L) {
    float max;
    if (!signed_max(n, x, L, max)) return 0.f;
    const float iscale = static_cast<float>(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = static_cast<int8_t>(l);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * static_cast<float>(l);
        suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    for (int pass = 0; pass < 5; ++pass) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            const float li = static_cast<float>(L[i]);
            float slx = sumlx - w * x[i] * li;
            if (slx > 0) {
                float sl2 = suml2 - w * li * li;
                const int new_l = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    const float fl = static_cast<float>(new_l);
                    slx += w * x[i] * fl;
                    sl2 += w * fl * fl;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = static_cast<int8_t>(new_l);
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
    return sumlx / suml2;
}

float fit_symmetric_search(int n, int nmax, const float* x, int8_t* L, const float* qw) {
    float max;
    if (!signed_max(n, x, L, max)) return 0.f;
    auto sums_for = [&](float iscale, float& sumlx, float& suml2, bool write_L) {
        sumlx = 0;
        suml2 = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            if (write_L) L[i] = static_cast<int8_t>(l + nmax);
            const float w = qw ? qw[i] : x[i] * x[i];
            sumlx += w * x[i] * static_cast<float>(l);
            suml2 += w * static_cast<float>(l) * static_cast<float>(l);
        }
    };
    float sumlx, suml2;
    sums_for(static_cast<float>(-nmax) / max, sumlx, suml2, true);
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int s = -9; s <= 9; ++s) {
        if (s == 0) continue;
        const float iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(s)) / max;
        sums_for(iscale, sumlx, suml2, false);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            sums_for(iscale, sumlx, suml2, true);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

void pack_2bit(const uint8_t* L, uint8_t* qs) {
    for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
            const uint8_t* e = L + 128 * h + l;
            qs[32 * h + l] = static_cast<uint8_t>(e[0] | (e[32] << 2) | (e[64] << 4) | (e[96] << 6));
        }
}

void pack_scale_min_k4(int j, int ls, int lm, uint8_t* s) {
    if (j < 4) {
        s[j] = static_cast<uint8_t>(ls);
        s[j + 4] = static_cast<uint8_t>(lm);
    } else {
        s[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
        s[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
        s[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
}


float fit_positive(int n, int nmax, const float* x, uint8_t* L, const float* w) {
    float max = 0;
    for (int i = 0; i < n; ++i) max = std::max(max, x[i]);
    if (max < kGroupMaxEps) {
        std::fill(L, L + n, uint8_t{0});
        return 0.f;
    }
    // The starting grid's error, then the best of the nearby grids. Codes are
    // stored as bytes as they come (a negative x would wrap, as in ggml).
    float iscale = static_cast<float>(nmax) / max;
    for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(nearest_int(iscale * x[i]));
    const float scale0 = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; ++i) {
        const float diff = x[i] - scale0 * static_cast<float>(L[i]);
        best_mse += w[i] * diff * diff;
    }
    for (int s = -4; s <= 4; ++s) {
        if (s == 0) continue;
        const float iscale_s = (0.1f * static_cast<float>(s) + static_cast<float>(nmax)) / max;
        const float scale_s = 1 / iscale_s;
        float mse = 0;
        for (int i = 0; i < n; ++i) {
            const int l = std::min(nmax, nearest_int(iscale_s * x[i]));
            const float diff = x[i] - scale_s * static_cast<float>(l);
            mse += w[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_s;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = std::min(nmax, nearest_int(iscale * x[i]));
        L[i] = static_cast<uint8_t>(l);
        const float fl = static_cast<float>(l);
        sumlx += w[i] * x[i] * fl;
        suml2 += w[i] * fl * fl;
    }
    for (int pass = 0; pass < 5; ++pass) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float li = static_cast<float>(L[i]);
            float slx = sumlx - w[i] * x[i] * li;
            float sl2 = suml2 - w[i] * li * li;
            if (slx > 0 && sl2 > 0) {
                const int new_l = std::min(nmax, nearest_int(x[i] * sl2 / slx));
                if (new_l != L[i]) {
                    const float fl = static_cast<float>(new_l);
                    slx += w[i] * x[i] * fl;
                    sl2 += w[i] * fl * fl;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = static_cast<uint8_t>(new_l);
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

}  // namespace quern::ref
