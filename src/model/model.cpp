#include "model/model.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"

namespace quern {

std::unique_ptr<Model> make_llama(const ModelConfig& cfg, WeightStore w);  // arch/llama.cpp

const std::vector<DType>& matmul_weight_types() {
    static const std::vector<DType> k{DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,        DType::Q4_1,
                                      DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K,        DType::Q3_K,
                                      DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F8_E4M3_B32, DType::NVFP4};
    return k;
}

int64_t Model::n_params() const {
    int64_t n = 0;
    for (const auto& [name, t] : weights_.all()) n += t.nelements();
    return n;
}

uint64_t Model::n_bytes() const {
    uint64_t n = 0;
    for (const auto& [name, t] : weights_.all()) n += t.nbytes();
    return n;
}

std::unique_ptr<Model> Model::from_gguf(std::shared_ptr<GgufFile> file) {
    ModelConfig cfg = ModelConfig::from_gguf(*file);
    WeightStore w;
    for (const auto& info : file->tensors()) w.add(file->tensor_view(info), file);
    if (!cfg.rope_freq_factors.empty() && !w.find("rope_freqs.weight")) {
        // RoPE scaling given by keys (Gemma 3's rope.scaling.type linear): the
        // forward pass reads the per-pair divisors as a tensor.
        const int64_t n = static_cast<int64_t>(cfg.rope_freq_factors.size());
        auto buf = std::shared_ptr<float[]>(new float[static_cast<size_t>(n)]);
        std::copy(cfg.rope_freq_factors.begin(), cfg.rope_freq_factors.end(), buf.get());
        w.add(Tensor::contiguous(DType::F32, {n, 1, 1, 1}, buf.get(), "rope_freqs.weight"),
              std::shared_ptr<const void>(buf, buf.get()));
    }
    return from_weights(cfg, std::move(w));
}

std::unique_ptr<Model> Model::from_weights(const ModelConfig& cfg, WeightStore weights) {
    cfg.validate();
    if (cfg.arch == "llama" || cfg.arch == "qwen2" || cfg.arch == "qwen3" || cfg.arch == "qwen3moe" ||
        cfg.arch == "phi3" || cfg.arch == "gemma2" || cfg.arch == "gemma3")
        return make_llama(cfg, std::move(weights));
    fail("model architecture '{}' is not supported", cfg.arch);
}

void Model::forward_batch(const SeqBatch*, int, PagedKvPool&, ThreadPool&) {
    fail("the '{}' architecture has no batched forward pass (serving is not supported for it yet)", cfg_.arch);
}

}  // namespace quern
