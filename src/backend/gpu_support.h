// What the CUDA backend computes, as a property of the model's configuration:
// one answer for the CLI (--device auto falls back to the CPU) and for the
// CUDA session's constructor (which refuses). Compiled in every build.
#pragma once
#include <string>

#include "model/config.h"

namespace quern {

/// The first feature of `c` the CUDA decode path does not compute, in words
/// ("attention heads of 80 elements", "an attention output bias", ...), or
/// "" when it runs the model. Covers the architecture and
/// its blocks, the head size (32, 64, 96, 128, 256), the GQA ratio (<= 16),
/// dimensions divisible by 32 and, for mixture-of-experts layers, at most
/// 1024 experts with 1 to 16 used per token; not the weight types (see
/// gpu_unsupported in src/cli/common.h).
std::string cuda_unsupported_feature(const ModelConfig& c);

}  // namespace quern
