#include "quant/mix.h"

#include <cctype>
#include <cstdio>

#include "core/error.h"

namespace quern {

namespace {

struct FileTypeName {
    FileType t;
    const char* name;
    DType base;
};

constexpr FileTypeName kTypes[] = {
    {FileType::Q4_0, "Q4_0", DType::Q4_0},     {FileType::Q4_1, "Q4_1", DType::Q4_1},
    {FileType::Q5_0, "Q5_0", DType::Q5_0},     {FileType::Q5_1, "Q5_1", DType::Q5_1},
    {FileType::Q8_0, "Q8_0", DType::Q8_0},     {FileType::Q2_K, "Q2_K", DType::Q2_K},
    {FileType::Q3_K_S, "Q3_K_S", DType::Q3_K}, {FileType::Q3_K_M, "Q3_K_M", DType::Q3_K},
    {FileType::Q3_K_L, "Q3_K_L", DType::Q3_K}, {FileType::Q4_K_S, "Q4_K_S", DType::Q4_K},
    {FileType::Q4_K_M, "Q4_K_M", DType::Q4_K}, {FileType::Q5_K_S, "Q5_K_S", DType::Q5_K},
    {FileType::Q5_K_M, "Q5_K_M", DType::Q5_K}, {FileType::Q6_K, "Q6_K", DType::Q6_K},
    {FileType::F16, "F16", DType::F16},        {FileType::BF16, "BF16", DType::BF16},
    {FileType::F32, "F32", DType::F32},
};

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// The tensor families the rules tell apart (llama.cpp's tensor_category),
// by name as GGUF files spell them.
enum class Family { Output, TokenEmbd, AttnV, AttnK, AttnQ, AttnOutput, FfnDown, Other };

Family family_of(const std::string& name) {
    if (name == "output.weight") return Family::Output;
    if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Family::TokenEmbd;
    // A fused QKV and MLA's kv_b count as V: they hold the values.
    if (contains(name, "attn_qkv.weight") || contains(name, "attn_kv_b.weight") || contains(name, "attn_v.weight"))
        return Family::AttnV;
    if (contains(name, "attn_k.weight")) return Family::AttnK;
    if (contains(name, "attn_q.weight")) return Family::AttnQ;
    if (contains(name, "attn_output.weight")) return Family::AttnOutput;
    if (contains(name, "ffn_up") || contains(name, "ffn_gate")) return Family::Other;
    if (contains(name, "ffn_down")) return Family::FfnDown;
    return Family::Other;
}

// The layers given more bits in the _M mixes: the first and last eighth,
// and every third in between.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

}  // namespace

std::optional<FileType> file_type_from_name(const std::string& name) {
    std::string up = name;
    for (char& c : up) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    for (const FileTypeName& f : kTypes)
        if (up == f.name) return f.t;
    return std::nullopt;
}

const char* file_type_name(FileType t) {
    for (const FileTypeName& f : kTypes)
        if (f.t == t) return f.name;
    return "?";
}

const char* file_type_names() {
    static const std::string names = [] {
        std::string s;
        for (const FileTypeName& f : kTypes) s += (s.empty() ? "" : ", ") + std::string(f.name);
        return s;
    }();
    return names.c_str();
}

DType file_type_base(FileType t) {
    for (const FileTypeName& f : kTypes)
        if (f.t == t) return f.base;
    fail("unknown file type {}", static_cast<uint32_t>(t));
}

int tensor_layer(const std::string& name) {
    int l = -1;
    return std::sscanf(name.c_str(), "blk.%d.", &l) == 1 ? l : -1;
}

bool MixPlanner::quantizable(const std::string& name, int n_dims) {
    if (n_dims < 2 || name.size() < 6 || name.compare(name.size() - 6, 6, "weight") != 0) return false;
    // Norms, expert routers and small or position tables stay as they are.
    for (const char* keep : {"_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                             "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
                             "indexer.q_proj.weight", "attn_rel_b.weight", ".position_embd", ".rel_pos",
                             ".patch_embd", ".patch_merger"})
        if (contains(name, keep)) return false;
    if (name == "position_embd.weight" || name == "token_types.weight") return false;
    if (name.rfind("time_mix_", 0) == 0 || contains(name, ".time_mix_")) return false;
    return true;
}

bool MixPlanner::attention_v(const std::string& name) { return family_of(name) == Family::AttnV; }

namespace {

// The mix's type for one tensor (before the row-length fallback).
DType mix_rule(FileType f, const MixModel& m_, const std::string& name, DType t, int64_t ne0, int64_t i_attention_v,
               int64_t i_ffn_down) {
    using F = FileType;
    const bool falcon = m_.arch == "falcon";
    const Family fam = family_of(name);
    if (fam == Family::Output || (m_.tied_embeddings && fam == Family::TokenEmbd)) {
        if (falcon || ne0 % dtype_info(t).block_size != 0) return DType::Q8_0;
        return t == DType::Q8_0 ? t : DType::Q6_K;
    }
    switch (fam) {
        case Family::TokenEmbd:
            return t;
        case Family::AttnV: {
            const int64_t i = i_attention_v, n = m_.n_attention_v;
            if (f == F::Q2_K) t = m_.n_gqa >= 4 ? DType::Q4_K : DType::Q3_K;
            else if (f == F::Q3_K_M) t = i < 2 ? DType::Q5_K : DType::Q4_K;
            else if (f == F::Q3_K_L) t = DType::Q5_K;
            else if ((f == F::Q4_K_M || f == F::Q5_K_M) && use_more_bits(i, n)) t = DType::Q6_K;
            else if (f == F::Q4_K_S && i < 4) t = DType::Q5_K;
            if (m_.is_70b && (t == DType::Q3_K || t == DType::Q4_K)) t = DType::Q5_K;
            if (m_.n_expert == 8) t = DType::Q8_0;
            return t;
        }
        case Family::AttnK:
            return m_.n_expert == 8 ? DType::Q8_0 : t;
        case Family::FfnDown: {
            // Expert banks are not in layer order in every file: their layer
            // comes from the name.
            int64_t i = i_ffn_down;
            const int64_t n = m_.n_layer;
            if (m_.n_expert > 1) {
                const int layer = tensor_layer(name);
                if (layer < 0 || layer >= n)
                    fail("'{}': no layer in [0, {}) in the name of an expert model's FFN tensor", name, n);
                i = layer;
            }
            if (f == F::Q2_K) t = DType::Q3_K;
            else if (f == F::Q3_K_M)
                t = i < n / 16 ? DType::Q5_K : (!falcon || use_more_bits(i, n)) ? DType::Q4_K : DType::Q3_K;
            else if (f == F::Q3_K_L) t = falcon ? DType::Q4_K : DType::Q5_K;
            else if (f == F::Q4_K_M) {
                if (falcon) t = i < n / 16 ? DType::Q6_K : use_more_bits(i, n) ? DType::Q5_K : DType::Q4_K;
                else if (use_more_bits(i, n)) t = DType::Q6_K;
            } else if (f == F::Q5_K_M && use_more_bits(i, n)) t = DType::Q6_K;
            else if (f == F::Q4_K_S && !falcon && i < n / 8) t = DType::Q5_K;
            // With importance weights the first eighth of FFN down gets the
            // types with a minimum (without, Q4_1/Q5_1 do worse there).
            else if ((f == F::Q4_0 || f == F::Q5_0) && m_.has_imatrix && i < n / 8)
                t = f == F::Q4_0 ? DType::Q4_1 : DType::Q5_1;
            return t;
        }
        case Family::AttnOutput:
            if (falcon) return f == F::Q3_K_L ? DType::Q4_K : t;
            if (m_.n_expert == 8)
                return (f == F::Q2_K || f == F::Q3_K_S || f == F::Q3_K_M || f == F::Q4_K_S || f == F::Q4_K_M)
                           ? DType::Q5_K
                           : t;
            if (f == F::Q2_K) return DType::Q3_K;
            if (f == F::Q3_K_M) return DType::Q4_K;
            if (f == F::Q3_K_L) return DType::Q5_K;
            return t;
        default:
            return t;
    }
}

}  // namespace

DType mix_tensor_type(FileType f, const MixModel& m, const std::string& name, int64_t ne0, int64_t i_attention_v,
                      int64_t i_ffn_down, bool* fell_back) {
    if (fell_back) *fell_back = false;
    const DType base = file_type_base(f);
    if (base == DType::F16 || base == DType::BF16 || base == DType::F32) return base;
    DType t = mix_rule(f, m, name, base, ne0, i_attention_v, i_ffn_down);
    if (ne0 % dtype_info(t).block_size != 0) {
        // A row that is no whole number of the type's blocks: the 32-element
        // type of about as many bits, else F16.
        if (fell_back) *fell_back = true;
        switch (t) {
            case DType::Q2_K:
            case DType::Q3_K: t = DType::Q4_0; break;
            case DType::Q4_K: t = DType::Q5_0; break;
            case DType::Q5_K: t = DType::Q5_1; break;
            case DType::Q6_K: t = DType::Q8_0; break;
            default: break;
        }
        if (ne0 % dtype_info(t).block_size != 0) t = DType::F16;
    }
    return t;
}

DType MixPlanner::choose(const std::string& name, DType current, const std::array<int64_t, 4>& ne, int n_dims,
                         bool* fell_back) {
    if (fell_back) *fell_back = false;
    if (!quantizable(name, n_dims)) return current;
    const DType t = mix_tensor_type(t_, m_, name, ne[0], i_attention_v_, i_ffn_down_, fell_back);
    // The counters advance as llama-quantize's: once per such tensor it changes.
    const Family fam = family_of(name);
    if (fam == Family::AttnV) ++i_attention_v_;
    if (fam == Family::FfnDown) ++i_ffn_down_;
    return t;
}

}  // namespace quern
