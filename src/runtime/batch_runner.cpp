#include "runtime/batch_runner.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/program_runner.h"
#include "runtime/memory.h"

namespace quern {

namespace {

/// The CPU runner: the model's program on the host (cpu::ProgramRunner::
/// forward_batch), the cache in host floats.
class CpuBatchRunner final : public BatchRunner {
public:
    CpuBatchRunner(Model& model, ThreadPool& pool) : model_(model), pool_(pool), runner_(model.program()) {}
    const ModelConfig& config() const override { return model_.config(); }
    std::string backend_name() const override { return "CPU"; }
    std::unique_ptr<PagedKvPool> make_kv_pool(int64_t n_blocks, int64_t block_size, const char* flag) override {
        const auto& c = model_.config();
        check_kv_cache_fits(n_blocks * block_size, c.n_layer, c.kv_dim(), sizeof(float), flag);
        return std::make_unique<PagedKvPool>(c.n_layer, c.kv_dim(), n_blocks, block_size);
    }
    void forward_batch(const SeqBatch* seqs, int n_seqs, PagedKvPool& kv) override {
        // SeqBatch::greedy: the program writes logits (into buffers kept
        // between steps), the argmax is taken here.
        std::vector<SeqBatch>& b = batch_;
        b.assign(seqs, seqs + n_seqs);
        const auto nv = static_cast<size_t>(model_.config().n_vocab);
        size_t used = 0;
        for (SeqBatch& q : b)
            if (q.greedy && !q.logits) {
                if (used == tmp_.size()) tmp_.emplace_back(nv);
                q.logits = tmp_[used++].data();
            }
        runner_.set_options(model_.options());
        runner_.forward_batch(b.data(), n_seqs, kv.store(), pool_);
        for (const SeqBatch& q : b)
            if (q.greedy) *q.greedy = static_cast<int32_t>(std::max_element(q.logits, q.logits + nv) - q.logits);
    }

private:
    Model& model_;
    ThreadPool& pool_;
    cpu::ProgramRunner runner_;
    std::vector<std::vector<float>> tmp_;  // logits of greedy rows
    std::vector<SeqBatch> batch_;          // the step's rows with those buffers (kept between steps)
};

class BorrowedRunner final : public BatchRunner {
public:
    explicit BorrowedRunner(BatchRunner& r) : r_(r) {}
    const ModelConfig& config() const override { return r_.config(); }
    std::string backend_name() const override { return r_.backend_name(); }
    std::unique_ptr<PagedKvPool> make_kv_pool(int64_t n_blocks, int64_t block_size, const char* flag) override {
        return r_.make_kv_pool(n_blocks, block_size, flag);
    }
    void forward_batch(const SeqBatch* seqs, int n_seqs, PagedKvPool& kv) override {
        r_.forward_batch(seqs, n_seqs, kv);
    }

private:
    BatchRunner& r_;
};

}  // namespace

std::unique_ptr<BatchRunner> borrow_runner(BatchRunner& r) { return std::make_unique<BorrowedRunner>(r); }

std::unique_ptr<BatchRunner> make_cpu_batch_runner(Model& model, ThreadPool& pool) {
    return std::make_unique<CpuBatchRunner>(model, pool);
}

}  // namespace quern
