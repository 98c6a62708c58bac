// Quantization mixes: the GGUF file types llama.cpp's llama-quantize writes
// (LLAMA_FTYPE_*, stored as general.file_type) and the block type each one
// gives every tensor of a model. Q4_K_M, for instance, is Q4_K for most
// matrices, Q6_K for the output head and for the attention V and FFN down
// matrices of some layers (use_more_bits), and falls back to a 32-element
// block type where a row is not a whole number of 256-element blocks. The
// rules follow llama.cpp's llama_tensor_get_type (src/llama-quant.cpp, as
// vendored in llama-cpp-python 0.3.36) for the types below, so that a file
// quern quantizes has the tensor types llama-quantize would give it.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "core/dtype.h"

namespace quern {

/// A file type: its general.file_type number is llama.cpp's LLAMA_FTYPE_*.
enum class FileType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q8_0 = 7,
    Q5_0 = 8,
    Q5_1 = 9,
    Q2_K = 10,
    Q3_K_S = 11,
    Q3_K_M = 12,
    Q3_K_L = 13,
    Q4_K_S = 14,
    Q4_K_M = 15,
    Q5_K_S = 16,
    Q5_K_M = 17,
    Q6_K = 18,
    BF16 = 32,
};

/// The file type of a name as llama-quantize spells it, in any case
/// ("q4_k_m", "Q8_0", "f16"); nullopt for names it does not know.
std::optional<FileType> file_type_from_name(const std::string& name);
/// "Q4_K_M", "F16", ...
const char* file_type_name(FileType t);
/// Every name file_type_from_name takes, comma-separated (for help and errors).
const char* file_type_names();
/// The block type of the file type's matrices before the mix's rules.
DType file_type_base(FileType t);

/// The layer a GGUF tensor name gives ("blk.12.attn_q.weight": 12), or -1.
int tensor_layer(const std::string& name);

/// What the rules read of the model: from its GGUF metadata and tensor list.
struct MixModel {
    std::string arch;            ///< general.architecture
    int64_t n_layer = 0;         ///< {arch}.block_count
    int64_t n_gqa = 1;           ///< query heads per KV head
    int64_t n_expert = 0;        ///< {arch}.expert_count (0: dense)
    bool tied_embeddings = true; ///< no output.weight: token_embd is the head too
    int64_t n_attention_v = 0;   ///< tensors of attn_v / attn_qkv / attn_kv_b
    bool is_70b = false;         ///< a Llama of 80 layers (llama.cpp's LLM_TYPE_70B)
    bool has_imatrix = false;    ///< quantized with an importance matrix (changes Q4_0/Q5_0's early FFN down)
};

/// The type of tensor `name` (rows of ne0 elements; a tensor MixPlanner::
/// quantizable takes) in file type f, where it is the i_attention_v-th
/// attention-V tensor or the i_ffn_down-th FFN-down tensor of the file
/// (counted from 0; experts' FFN tensors take their layer from the name).
/// *fell_back as MixPlanner::choose.
DType mix_tensor_type(FileType f, const MixModel& m, const std::string& name, int64_t ne0, int64_t i_attention_v,
                      int64_t i_ffn_down, bool* fell_back = nullptr);

/// Chooses each tensor's type, in the file's tensor order (the rules count
/// attention V and FFN tensors as they go, as llama-quantize does).
class MixPlanner {
public:
    MixPlanner(FileType t, MixModel m) : t_(t), m_(std::move(m)) {}
    /// The type for tensor `name` of shape ne (n_dims dimensions) now of type
    /// `current`: `current` itself for tensors that stay as they are (norms,
    /// 1-D tensors, expert routers, conv kernels, ...). *fell_back is set
    /// when the mix's type did not fit the row length and a smaller block
    /// type (or F16) was taken. quern::Error for an expert tensor whose layer
    /// its name does not give.
    DType choose(const std::string& name, DType current, const std::array<int64_t, 4>& ne, int n_dims,
                 bool* fell_back = nullptr);
    /// Whether llama-quantize changes tensors of this name and shape at all.
    static bool quantizable(const std::string& name, int n_dims);
    /// Whether the rules count the tensor among MixModel::n_attention_v.
    static bool attention_v(const std::string& name);

private:
    FileType t_;
    MixModel m_;
    int64_t i_attention_v_ = 0, i_ffn_down_ = 0;
};

}  // namespace quern
