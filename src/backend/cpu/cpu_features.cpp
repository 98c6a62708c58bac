// cpuid / xgetbv based feature detection; see cpu_features.h.
#include "backend/cpu/cpu_features.h"

#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define QUERN_X86 1
#endif

namespace quern::cpu {

namespace {

#if QUERN_X86
struct Regs {
    uint32_t a = 0, b = 0, c = 0, d = 0;
};
Regs cpuid(uint32_t leaf, uint32_t sub = 0) {
    Regs r;
    __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
    return r;
}
uint64_t xgetbv0() {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (static_cast<uint64_t>(hi) << 32) | lo;
}
#endif

CpuFeatures detect() {
    CpuFeatures f;
#if QUERN_X86
    const uint32_t max_leaf = cpuid(0).a;
    if (max_leaf < 1) return f;
    const Regs l1 = cpuid(1);
    const bool osxsave = (l1.c >> 27) & 1;
    const bool avx = (l1.c >> 28) & 1;
    if (osxsave && avx) {
        const uint64_t xcr0 = xgetbv0();
        f.os_avx = (xcr0 & 0x6) == 0x6;                // XMM | YMM
        f.os_avx512 = f.os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask | ZMM_Hi256 | Hi16_ZMM
    }
    if (!f.os_avx) return f;
    f.fma = (l1.c >> 12) & 1;
    f.f16c = (l1.c >> 29) & 1;
    if (max_leaf >= 7) {
        const Regs l7 = cpuid(7, 0);
        f.avx2 = (l7.b >> 5) & 1;
        f.bmi2 = (l7.b >> 8) & 1;
        if (f.os_avx512) {
            f.avx512f = (l7.b >> 16) & 1;
            f.avx512dq = (l7.b >> 17) & 1;
            f.avx512bw = (l7.b >> 30) & 1;
            f.avx512vl = (l7.b >> 31) & 1;
            f.avx512_vbmi = (l7.c >> 1) & 1;
            f.avx512_vnni = (l7.c >> 11) & 1;
        }
        if (cpuid(7, 0).a >= 1) {
            const Regs l71 = cpuid(7, 1);
            f.avx_vnni = (l71.a >> 4) & 1;
            if (f.os_avx512) f.avx512_bf16 = (l71.a >> 5) & 1;
        }
    }
#endif
    return f;
}

Isa detect_max() {
    const CpuFeatures& f = cpu_features();
    const bool avx2 = f.os_avx && f.avx2 && f.fma && f.f16c && f.bmi2;
    if (!avx2) return Isa::Scalar;
    const bool avx512 = f.os_avx512 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512_vnni;
    return avx512 ? Isa::AVX512 : Isa::AVX2;
}

Isa default_isa() {
    Isa isa = max_isa();
    if (const char* env = std::getenv("QUERN_CPU")) {
        if (auto want = isa_from_name(env); want && *want < isa) isa = *want;
    }
    return isa;
}

// -1: no override; otherwise an Isa value.
std::atomic<int> g_override{-1};

}  // namespace

const CpuFeatures& cpu_features() {
    static const CpuFeatures f = detect();
    return f;
}

Isa max_isa() {
    static const Isa isa = detect_max();
    return isa;
}

Isa active_isa() {
    static const Isa dflt = default_isa();
    const int o = g_override.load(std::memory_order_relaxed);
    return o < 0 ? dflt : static_cast<Isa>(o);
}

void set_isa_override(std::optional<Isa> isa) {
    if (!isa) {
        g_override.store(-1);
        return;
    }
    const Isa clamped = *isa < max_isa() ? *isa : max_isa();
    g_override.store(static_cast<int>(clamped));
}

std::string_view isa_name(Isa isa) {
    switch (isa) {
        case Isa::Scalar: return "scalar";
        case Isa::AVX2: return "avx2";
        case Isa::AVX512: return "avx512";
    }
    return "?";
}

std::optional<Isa> isa_from_name(std::string_view name) {
    std::string s(name);
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (s == "scalar") return Isa::Scalar;
    if (s == "avx2") return Isa::AVX2;
    if (s == "avx512") return Isa::AVX512;
    return std::nullopt;
}

}  // namespace quern::cpu
