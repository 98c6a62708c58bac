// Included first-thing by the scalar reference quantizers (reference.cpp,
// reference_kquants.cpp, fit.cpp): no fused multiply-add contraction in the
// rest of the file, so that a*b + c rounds twice as in ggml's reference code
// (compiled without -march flags) and the quantized bytes match it exactly.
// A pragma, not a flag in CMake, so the files keep the rule wherever they are
// built.
#pragma once

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
