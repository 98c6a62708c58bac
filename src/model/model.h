// Model: a transformer's configuration, its weights bound by name and shape,
// and the layer program its architecture builds from them (backend/program.h)
// — what every backend runs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/program.h"
#include "core/kv_cache.h"
#include "core/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"

namespace quern {

class GgufFile;
namespace cpu {
class ProgramRunner;
}

/// Weight types a matrix product may have on the CPU.
const std::vector<DType>& matmul_weight_types();

class Model {
public:
    ~Model();
    const ModelConfig& config() const { return cfg_; }
    const WeightStore& weights() const { return weights_; }
    /// The forward pass, as the architecture wrote it.
    const Program& program() const { return program_; }
    /// The NextN head's draft program (ArchDef::build_draft), or null when
    /// the model has none.
    const Program* draft_program() const { return draft_.ops.empty() ? nullptr : &draft_; }
    /// The program whose hidden rows (Program::hidden: n_embd floats per
    /// token, after the output norm) are what embeddings pool: program()
    /// itself when it names them, else the same model built to hand them out
    /// (ModelConfig::hidden_rows). CPU executors run it.
    const Program& embedding_program() const { return program_.hidden.valid() ? program_ : embedding_; }
    const ModelOptions& options() const { return opts_; }
    void set_options(const ModelOptions& o);
    /// Makes forward() report intermediate tensors of its last position to
    /// `t` (null: off, the default).
    void set_trace(TraceFn t);
    /// Makes forward() show every matrix product's input rows to `f`
    /// (ActivationFn; null: off, the default).
    void set_activation_observer(ActivationFn f);

    /// A KV cache for one sequence of up to n_ctx positions.
    KvCache make_cache(int64_t n_ctx) const {
        return KvCache(program_.n_kv_layers, n_ctx, program_.kv_dim, program_.state_floats());
    }

    /// Runs n tokens of one sequence on the CPU (cpu::ProgramRunner::forward):
    /// positions cache.size() .. cache.size()+n-1, their keys/values appended
    /// to `cache`; logits (n_vocab floats per row) for every token when
    /// all_logits, else for the last token only. Throws quern::Error when the
    /// cache would overflow or an id is out of range.
    void forward(const int32_t* tokens, int64_t n, KvCache& cache, float* logits, bool all_logits, ThreadPool& pool);

    /// Parameters (elements) and bytes of all weights.
    int64_t n_params() const;
    uint64_t n_bytes() const;

    /// Builds the model described by a GGUF file (kept open by the model).
    static std::unique_ptr<Model> from_gguf(std::shared_ptr<GgufFile> file);
    /// Builds a model from a config and weights made elsewhere (Hugging Face
    /// checkpoints, synthetic models): the architecture's tensor table binds
    /// the weights (quern::Error naming a missing or misshapen tensor) and
    /// its builder writes the program.
    static std::unique_ptr<Model> from_weights(const ModelConfig& cfg, WeightStore weights);

private:
    Model(ModelConfig cfg, WeightStore w);
    ModelConfig cfg_;
    WeightStore weights_;
    Program program_;
    Program draft_;      // empty without a NextN head
    Program embedding_;  // empty when program_ names its hidden rows
    ModelOptions opts_;
    TraceFn trace_;
    ActivationFn observe_;
    std::unique_ptr<cpu::ProgramRunner> runner_;  // forward()'s, made on first use
};

}  // namespace quern
