#include "runtime/batch_runner.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/executor.h"
#include "core/error.h"

namespace quern {

namespace {

class ExecutorRunner final : public BatchRunner {
public:
    ExecutorRunner(const Model& m, std::unique_ptr<Executor> x) : cfg_(m.config()), x_(std::move(x)) {}
    const ModelConfig& config() const override { return cfg_; }
    std::string backend_name() const override { return x_->device_name(); }
    std::unique_ptr<PagedKvPool> make_kv_pool(int64_t n_blocks, int64_t block_size, const char* flag) override {
        blocks_ = x_->make_kv_storage(n_blocks, block_size, flag);
        block_size_ = block_size;
        return std::make_unique<PagedKvPool>(cfg_.n_layer, cfg_.kv_dim(), blocks_, block_size, /*host_storage=*/false);
    }
    void make_state_slots(int64_t n) override { x_->make_state_slots(n); }
    void copy_state_slot(int32_t from, int32_t to) override { x_->copy_state_slot(from, to); }
    void forward_batch(const SeqBatch* seqs, int n_seqs, PagedKvPool& kv) override {
        if (kv.n_blocks() != blocks_ || kv.block_size() != block_size_)
            fail("forward_batch: the KV pool was not made by this runner's make_kv_pool");
        ForwardBatch b;
        b.seqs = seqs;
        b.n_seqs = n_seqs;
        b.invariant = true;
        x_->forward(b);
    }
    int64_t graph_replays() const override { return x_->graph_replays(); }

private:
    ModelConfig cfg_;
    std::unique_ptr<Executor> x_;
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
    void make_state_slots(int64_t n) override { r_.make_state_slots(n); }
    void copy_state_slot(int32_t from, int32_t to) override { r_.copy_state_slot(from, to); }
    void forward_batch(const SeqBatch* seqs, int n_seqs, PagedKvPool& kv) override {
        r_.forward_batch(seqs, n_seqs, kv);
    }
    int64_t graph_replays() const override { return r_.graph_replays(); }

private:
    BatchRunner& r_;
};

}  // namespace

std::unique_ptr<BatchRunner> make_executor_runner(const Model& model, std::unique_ptr<Executor> executor) {
    return std::make_unique<ExecutorRunner>(model, std::move(executor));
}

std::unique_ptr<BatchRunner> borrow_runner(BatchRunner& r) { return std::make_unique<BorrowedRunner>(r); }

std::unique_ptr<BatchRunner> make_cpu_batch_runner(Model& model, ThreadPool& pool) {
    return make_executor_runner(model, cpu::make_executor(model.program(), model.options(), pool));
}

}  // namespace quern
