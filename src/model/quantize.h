// `quern quantize`: a GGUF file's matrices requantized into one of
// llama-quantize's file types (quant/mix.h: which tensor gets which block
// type), everything else carried over unchanged: metadata (general.file_type
// and general.quantization_version set anew), tokenizer, norms, tensor order.
// Each row is dequantized to floats and quantized with the scalar reference
// quantizers (quant/reference.h), which choose scales as ggml's
// quantize_row_*_ref do, or, with an importance matrix, as ggml's weighted
// quantize_<type>: either way the tensors equal llama-quantize's.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "formats/imatrix.h"
#include "quant/mix.h"

namespace quern {

class GgufWriter;

/// What quantize_gguf reads: a GGUF file's tensors as they are, or a
/// Hugging Face folder's as llama.cpp's converter lays them out
/// (hf_quantize_source, model/hf_to_gguf.h).
struct QuantizeSource {
    struct Tensor {
        std::string name;
        DType type;
        std::array<int64_t, 4> ne;
        int n_dims;
        /// Row r (of ne[1]·ne[2]·ne[3], each row_size(type, ne[0]) bytes):
        /// rows need not be contiguous (a stacked expert bank, permuted rows).
        std::function<const uint8_t*(int64_t r)> row;
        const uint8_t* contiguous = nullptr;  ///< all rows at once, when they are
    };
    std::vector<Tensor> tensors;
    /// Writes the output's metadata but general.file_type and
    /// general.quantization_version.
    std::function<void(GgufWriter&)> write_metadata;
    MixModel mix;                          ///< what the mix rules read (has_imatrix set by quantize_gguf)
    std::shared_ptr<const void> owner;     ///< keeps the tensors' bytes alive
};

/// A GGUF file as a source (its metadata copied in order).
QuantizeSource gguf_quantize_source(const std::string& path);

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
    /// Importance weights per matrix (null: none). A matrix it lacks is
    /// quantized without; one of another width is an error.
    const Imatrix* imatrix = nullptr;
    /// The file it came from, recorded in the output's quantize.imatrix.*
    /// metadata as llama-quantize records it.
    std::string imatrix_file;
};

/// One tensor as it was written.
struct QuantizedTensor {
    std::string name;
    DType from, to;
    bool fell_back = false;  ///< the mix's type did not fit the row (MixPlanner::choose)
    bool weighted = false;   ///< quantized under the importance matrix's weights
};

struct QuantizeReport {
    std::vector<QuantizedTensor> tensors;
    uint64_t bytes_in = 0, bytes_out = 0;  ///< tensor data
};

/// Writes `out` from `in`, a GGUF file or a Hugging Face folder (see the top
/// of the file), rows spread over `pool`, one converted tensor in memory at a
/// time (the input is mapped). progress(done, total) in bytes of the output file. quern::Error for a file that is not GGUF, a tensor
/// type the reference quantizers cannot read, an already quantized matrix
/// without allow_requantize (naming the option), an importance-matrix entry
/// whose width is not its matrix's, or `out` == `in`.
QuantizeReport quantize_gguf(const std::string& in, const std::string& out, const QuantizeOptions& opts,
                             ThreadPool& pool, const std::function<void(uint64_t done, uint64_t total)>& progress = {});

}  // namespace quern
