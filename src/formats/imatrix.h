// Importance matrices, as llama.cpp's llama-imatrix writes them and
// llama-quantize --imatrix reads them. For every weight matrix a calibration
// text went through, the sum over its tokens of the squared activation each
// input column met (`in_sum2`), and how many tokens were summed (`counts`),
// per expert for an expert bank. The mean square per column tells the
// quantizer which columns matter most (quant/reference.h,
// quantize_row_weighted).
//
// Files: GGUF with general.type = "imatrix", imatrix.datasets (strings),
// imatrix.chunk_count and imatrix.chunk_size (u32), and per matrix NAME the
// F32 tensors NAME.in_sum2 {n_in, n_mat} and NAME.counts {1, n_mat}, sorted by
// name. The older ".dat" layout is read too: int32 entry count, then per
// entry int32 name length, the name, int32 ncall, int32 nval and nval floats
// (mean squares times ncall), then optionally int32 chunk count and a dataset
// name (int32 length, bytes).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace quern {

struct ImatrixEntry {
    std::vector<float> sums;    ///< {n_in, n_mat}: sums[m·n_in + j]
    std::vector<float> counts;  ///< n_mat: tokens summed into each matrix
    int64_t n_in() const { return counts.empty() ? 0 : static_cast<int64_t>(sums.size() / counts.size()); }
};

struct Imatrix {
    std::map<std::string, ImatrixEntry> entries;  ///< by weight tensor name (GGUF names)
    std::vector<std::string> datasets;            ///< the calibration texts' names
    int64_t chunk_count = 0;                      ///< chunks evaluated
    int64_t chunk_size = 0;                       ///< tokens per chunk (0: unknown, .dat files)

    /// The mean square per column of matrix `name` ({n_in, n_mat} floats:
    /// sums / counts; 1 for a matrix that saw no tokens, an expert never
    /// routed to, as llama-quantize does). Empty when `name` has no entry.
    std::vector<float> importance(const std::string& name) const;
    /// The same for a tensor of n_expert matrices, and for an expert bank
    /// "P_exps.weight" without an entry of its own, its experts' entries
    /// "P.E.weight" (E = 0 .. n_expert−1) side by side: what a model whose
    /// experts are tensors of their own yields (Hugging Face folders, older
    /// Mixtral GGUF files). Empty when an expert is missing.
    std::vector<float> importance(const std::string& name, int64_t n_expert) const;
    /// How many weights importance(name, n_expert) gives (0: none), without
    /// making them.
    size_t importance_size(const std::string& name, int64_t n_expert) const;

    /// Adds `rows` activation rows (n_in floats each, row-major) that met
    /// matrix `mat` of the n_mat of `name` (an expert's index; 0 for a plain
    /// matrix). quern::Error when `name` was seen with another shape.
    void accumulate(const std::string& name, int64_t n_mat, int64_t mat, const float* x, int64_t rows, int64_t n_in);
};

/// Reads a GGUF or .dat importance matrix. quern::Error for a missing,
/// truncated or malformed file, or sums and counts that do not pair up.
Imatrix read_imatrix(const std::string& path);

/// Writes `m` as a GGUF importance matrix (quern::Error on I/O errors).
void write_imatrix(const std::string& path, const Imatrix& m);

}  // namespace quern
