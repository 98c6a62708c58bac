// Runtime CPU feature detection (cpuid + xgetbv) and the ISA level the CPU
// kernels dispatch on. The level can be lowered for tests and benchmarks with
// the environment variable QUERN_CPU=scalar|avx2|avx512 (read once, at first
// use) or programmatically with set_isa_override(); it is never raised above
// what the CPU and OS support.
#pragma once
#include <optional>
#include <string_view>

namespace quern::cpu {

struct CpuFeatures {
    bool os_avx = false;     // OS saves YMM state (XCR0 bits 1,2)
    bool os_avx512 = false;  // OS saves opmask/ZMM state (XCR0 bits 5,6,7)
    bool avx2 = false, fma = false, f16c = false, bmi2 = false;
    bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
    bool avx512_vnni = false, avx512_bf16 = false, avx512_vbmi = false;
    bool avx_vnni = false;
};

/// What the CPU and OS support (detected once).
const CpuFeatures& cpu_features();

/// Kernel families, ordered: a higher level implies the lower ones work.
///   Scalar: portable C++.
///   AVX2:   AVX2 + FMA + F16C + BMI2 (Haswell / Zen 1 and later).
///   AVX512: AVX-512 F/BW/VL/DQ + VNNI (Ice Lake / Zen 4 and later).
enum class Isa : int { Scalar = 0, AVX2 = 1, AVX512 = 2 };

/// Highest level the hardware and OS support.
Isa max_isa();
/// Level the kernels use: max_isa(), lowered by QUERN_CPU or set_isa_override().
Isa active_isa();
/// Forces a level for later calls (clamped to max_isa()); nullopt restores the
/// default (QUERN_CPU or max_isa()). Not thread-safe against running kernels.
void set_isa_override(std::optional<Isa> isa);

std::string_view isa_name(Isa isa);
/// Parses "scalar", "avx2", "avx512" (case-insensitive); nullopt otherwise.
std::optional<Isa> isa_from_name(std::string_view name);

}  // namespace quern::cpu
