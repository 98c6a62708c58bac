#include "runtime/batch_runner.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/program_runner.h"
#include "core/error.h"
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

class ExecutorRunner final : public BatchRunner {
public:
    ExecutorRunner(const Model& m, std::unique_ptr<BatchExecutor> x) : cfg_(m.config()), x_(std::move(x)) {}
    const ModelConfig& config() const override { return cfg_; }
    std::string backend_name() const override { return x_->device_name(); }
    std::unique_ptr<PagedKvPool> make_kv_pool(int64_t n_blocks, int64_t block_size, const char* flag) override {
        x_->make_kv_storage(n_blocks, block_size, flag);
        blocks_ = n_blocks, block_size_ = block_size;
        return std::make_unique<PagedKvPool>(cfg_.n_layer, cfg_.kv_dim(), n_blocks, block_size, /*host_storage=*/false);
    }
    void forward_batch(const SeqBatch* seqs, int n_seqs, PagedKvPool& kv) override {
        if (kv.n_blocks() != blocks_ || kv.block_size() != block_size_)
            fail("forward_batch: the KV pool was not made by this runner's make_kv_pool");
        x_->forward_batch(seqs, n_seqs);
    }
    int64_t graph_replays() const override { return x_->graph_replays(); }

private:
    ModelConfig cfg_;
    std::unique_ptr<BatchExecutor> x_;
    int64_t blocks_ = 0, block_size_ = 0;
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
    int64_t graph_replays() const override { return r_.graph_replays(); }

private:
    BatchRunner& r_;
};

}  // namespace

std::unique_ptr<BatchRunner> make_executor_runner(const Model& model, std::unique_ptr<BatchExecutor> executor) {
    return std::make_unique<ExecutorRunner>(model, std::move(executor));
}

std::unique_ptr<BatchRunner> borrow_runner(BatchRunner& r) { return std::make_unique<BorrowedRunner>(r); }

std::unique_ptr<BatchRunner> make_cpu_batch_runner(Model& model, ThreadPool& pool) {
    return std::make_unique<CpuBatchRunner>(model, pool);
}

}  // namespace quern
