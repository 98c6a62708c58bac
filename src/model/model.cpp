#include "model/model.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/program_runner.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "model/arch/arch.h"

namespace quern {

const std::vector<DType>& matmul_weight_types() {
    static const std::vector<DType> k{DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,        DType::Q4_1,
                                      DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K,        DType::Q3_K,
                                      DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F8_E4M3_B32, DType::NVFP4,
                                      DType::MXFP4};
    return k;
}

Model::Model(ModelConfig cfg, WeightStore w) : cfg_(std::move(cfg)), weights_(std::move(w)) {
    const ArchDef* def = find_arch(cfg_.arch);
    if (!def) fail("model architecture '{}' is not supported (supported: {})", cfg_.arch, supported_archs(false));
    TensorTable table;
    def->tensors(cfg_, table);
    const BoundWeights bound(table, weights_);
    program_ = def->build(cfg_, bound);
    if (cfg_.n_nextn > 0 && def->build_draft) draft_ = def->build_draft(cfg_, bound);
    if (!program_.hidden.valid()) {  // the same model handing out its rows, for embeddings
        ModelConfig rows = cfg_;
        rows.hidden_rows = true;
        embedding_ = def->build(rows, bound);
    }
}

Model::~Model() = default;

void Model::set_options(const ModelOptions& o) {
    opts_ = o;
    if (runner_) runner_->set_options(o);
}

void Model::set_trace(TraceFn t) {
    trace_ = std::move(t);
    if (runner_) runner_->set_trace(trace_);
}

void Model::set_activation_observer(ActivationFn f) {
    observe_ = std::move(f);
    if (runner_) runner_->set_activation_observer(observe_);
}

void Model::forward(const int32_t* tokens, int64_t n, KvCache& cache, float* logits, bool all_logits,
                    ThreadPool& pool) {
    if (!runner_) {
        runner_ = std::make_unique<cpu::ProgramRunner>(program_);
        runner_->set_options(opts_);
        runner_->set_trace(trace_);
        runner_->set_activation_observer(observe_);
    }
    runner_->forward(tokens, n, cache, logits, all_logits, pool);
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
    return from_weights(cfg, std::move(w));
}

std::unique_ptr<Model> Model::from_weights(const ModelConfig& cfg, WeightStore weights) {
    cfg.validate();
    return std::unique_ptr<Model>(new Model(cfg, std::move(weights)));
}

}  // namespace quern
