// The tensor table of an architecture: every tensor a model of that
// architecture has, with its GGUF name (llama.cpp's, the name the builder
// binds), its Hugging Face state-dict name and its shape. One table serves
// the GGUF binding (BoundWeights), the Hugging Face loader (hf_model.cpp,
// which renames checkpoint tensors to the GGUF names) and the errors that
// name a missing or misshapen tensor.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/weights.h"

namespace quern {

enum class TensorKind : uint8_t {
    Matrix,  ///< a weight matrix or embedding table: any type the CPU's matmul reads
    Vector,  ///< a norm weight, a bias or another small float table: F32 in GGUF files, widened to F32
             ///< from checkpoints
    Experts, ///< one bank of an expert layer (see TensorEntry)
};

/// One tensor (or expert bank) of a model. Shapes are ne, innermost first.
/// An Experts entry names a bank of n_expert matrices of `shape` each: stored
/// in GGUF files as one 3-D tensor `gguf` (shape + {n_expert}) or as
/// per-expert tensors `gguf_expert` (a format string, {} the expert), and in
/// checkpoints as per-expert tensors `hf` (a format string likewise).
struct TensorEntry {
    std::string gguf;
    std::string hf;                  ///< "" when checkpoints never hold it (derived from the config)
    std::vector<int64_t> shape;
    TensorKind kind = TensorKind::Matrix;
    bool optional = false;           ///< a GGUF file may lack it (the builder copes)
    bool hf_add_one = false;         ///< Vector: checkpoints store w, the model uses 1 + w (Gemma's RMSNorms)
    bool hf_neg_exp = false;         ///< Vector: checkpoints store log(−a), the model uses a = −exp (A_log)
    /// The checkpoint's shape (outermost first) when it differs from `shape`
    /// by axes of size 1 (a depthwise conv1d's (C, 1, K)); empty: `shape`.
    std::vector<int64_t> hf_shape;
    bool keep_float = false;         ///< Matrix: llama.cpp's quantizer leaves it in float (expert routers)
    int64_t n_expert = 0;            ///< Experts
    std::string gguf_expert;         ///< Experts
};

class TensorTable {
public:
    /// A matrix (or embedding table) of ne = {K, N}.
    TensorEntry& matrix(std::string gguf, std::string hf, std::vector<int64_t> shape);
    /// A norm weight or bias of n floats.
    TensorEntry& vector(std::string gguf, std::string hf, int64_t n);
    /// A small F32 table of ne = shape (a conv1d's taps).
    TensorEntry& floats(std::string gguf, std::string hf, std::vector<int64_t> shape);
    /// An expert bank of n_expert matrices of ne = {K, N} (see TensorEntry).
    TensorEntry& experts(std::string gguf, std::string gguf_expert, std::string hf, std::vector<int64_t> shape,
                         int64_t n_expert);
    const std::vector<TensorEntry>& entries() const { return entries_; }
    std::vector<TensorEntry>& entries() { return entries_; }

private:
    std::vector<TensorEntry> entries_;
};

/// An expert bank as found in a store: the 3-D tensor, or the per-expert ones.
struct BoundBank {
    const Tensor* stacked = nullptr;
    std::vector<const Tensor*> experts;  ///< empty when stacked
};

/// A table's tensors looked up in a weight store, each checked against its
/// entry (shape; type: Matrix any matmul type, Vector F32). The builder reads
/// them by GGUF name. quern::Error naming the tensor for a missing one (unless
/// optional), a wrong shape or type.
class BoundWeights {
public:
    BoundWeights(const TensorTable& table, const WeightStore& store);
    /// The tensor bound to a Matrix or Vector entry; quern::Error when the table has
    /// no such entry or the (optional) tensor is absent.
    const Tensor& get(const std::string& gguf) const;
    /// As get(), null when an optional tensor is absent.
    const Tensor* find(const std::string& gguf) const;
    /// The bank bound to an Experts entry (by its 3-D GGUF name).
    const BoundBank& bank(const std::string& gguf) const;

private:
    std::map<std::string, const Tensor*> tensors_;
    std::map<std::string, BoundBank> banks_;
};

}  // namespace quern
