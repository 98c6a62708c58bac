// `quern quantize`: a GGUF file's matrices requantized into one of
// llama-quantize's file types (quant/mix.h: which tensor gets which block
// type), everything else carried over unchanged: metadata (general.file_type
// and general.quantization_version set anew), tokenizer, norms, tensor order.
// Each row is dequantized to floats and quantized with the scalar reference
// quantizers (quant/reference.h), which choose scales as ggml's
// quantize_row_*_ref do: without an importance matrix the tensors equal
// llama-quantize's.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "quant/mix.h"

namespace quern {

struct QuantizeOptions {
    FileType type = FileType::Q4_K_M;
    /// Quantize tensors that already are (Q8_0 to Q4_K, say): each rounding
    /// loses accuracy, so the default refuses, as llama-quantize does.
    bool allow_requantize = false;
    /// With allow_requantize: called once, before any work, with the first
    /// tensor that will be requantized (the CLI warns with it).
    std::function<void(const std::string& tensor, DType from, DType to)> on_requantize;
    /// Decide every tensor's type and the sizes, write nothing (`out` unused).
    bool dry_run = false;
};

/// One tensor as it was written.
struct QuantizedTensor {
    std::string name;
    DType from, to;
    bool fell_back = false;  ///< the mix's type did not fit the row (MixPlanner::choose)
};

struct QuantizeReport {
    std::vector<QuantizedTensor> tensors;
    uint64_t bytes_in = 0, bytes_out = 0;  ///< tensor data
};

/// Writes `out` from GGUF file `in` (see the top of the file), rows spread
/// over `pool`, one converted tensor in memory at a time (the input is
/// mapped). progress(done, total) in bytes of the output file. quern::Error for a file that is not GGUF, a tensor
/// type the reference quantizers cannot read, an already quantized matrix
/// without allow_requantize (naming the option), or `out` == `in`.
QuantizeReport quantize_gguf(const std::string& in, const std::string& out, const QuantizeOptions& opts,
                             ThreadPool& pool, const std::function<void(uint64_t done, uint64_t total)>& progress = {});

}  // namespace quern
