// Deterministic test input for the ggml quantization fixtures in this folder,
// shared by make_ggml_fixture.cpp (which wrote the fixtures) and
// tests/unit/quant_test.cpp (which checks quern against them). Only integer
// arithmetic, exact scalings by powers of two and plain float additions and
// multiplications are used, so every IEEE-754 platform produces the same bits.
#pragma once
#include <cstdint>
#include <vector>

namespace quern_fixture {

inline constexpr int kSuperBlocks = 16;            // of 256 elements
inline constexpr int kElements = kSuperBlocks * 256;

struct SplitMix64 {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    // Uniform in [-1, 1): a 24-bit integer times 2^-23 (exact).
    float uniform() { return static_cast<float>(static_cast<int32_t>(next() >> 40) - (1 << 23)) * (1.0f / 8388608.0f); }
    // Bell-shaped (sum of four uniforms), deterministic float additions.
    float bell() { return ((uniform() + uniform()) + (uniform() + uniform())) * 0.5f; }
};

// 2^e for e in [-30, 30], exactly.
inline float pow2(int e) {
    float r = 1.0f;
    for (; e > 0; --e) r *= 2.0f;
    for (; e < 0; ++e) r *= 0.5f;
    return r;
}

// kElements floats; super-block b has character b % 8 (Gaussian-like,
// uniform, half-integer ties, zero sub-blocks, all positive, all negative,
// outliers, all zero / constant) at a magnitude 1.37 * 2^e, e in [-20, 9].
inline std::vector<float> make_input() {
    SplitMix64 r{0x5175657261ull};  // "Quera"
    std::vector<float> x(kElements);
    for (int b = 0; b < kSuperBlocks; ++b) {
        float* v = x.data() + 256 * b;
        const float mag = 1.37f * pow2(static_cast<int>(r.next() % 30) - 20);
        for (int j = 0; j < 256; ++j) {
            switch (b % 8) {
                case 0: v[j] = r.bell() * mag; break;
                case 1: v[j] = r.uniform() * mag; break;
                case 2: v[j] = static_cast<float>(static_cast<int>(r.next() % 509) - 254) * 0.5f; break;
                case 3: v[j] = (j / 16) % 2 ? r.bell() * mag : 0.0f; break;
                case 4: v[j] = (r.uniform() + 2.0f) * mag; break;
                case 5: v[j] = (r.uniform() - 1.5f) * mag; break;
                case 6: v[j] = r.bell() * mag * (j % 37 == 5 ? 25.0f : 1.0f); break;
                default: v[j] = b == 7 ? 0.0f : 0.8125f * mag; break;
            }
        }
    }
    return x;
}

// The types with a fixture file ggml_<NAME>.bin, and ggml's names for them.
inline constexpr const char* kTypes[] = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
                                         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"};

// The importance-weighted fixtures (ggml_<TYPE>_imatrix.bin) quantize the
// same input as kImatrixRows rows of kImatrixRow floats under these weights:
// positive, spread over four orders of magnitude, with heavy columns (every
// 37th) and dead ones (every 97th: 0, as an imatrix has for a column no
// token ever activated).
inline constexpr int kImatrixRow = 1024;
inline constexpr int kImatrixRows = kElements / kImatrixRow;

inline std::vector<float> make_importance() {
    SplitMix64 r{0x696d6174ull};  // "imat"
    std::vector<float> w(kImatrixRow);
    for (int j = 0; j < kImatrixRow; ++j) {
        const float u = r.uniform() + 1.0f;  // [0, 2)
        w[j] = j % 97 == 0 ? 0.0f : (0.001f + u * u * u) * (j % 37 == 5 ? 64.0f : 1.0f);
    }
    return w;
}

}  // namespace quern_fixture
