#include "model/tensor_table.h"

#include <fmt/format.h>

#include "core/error.h"
#include "model/model.h"

namespace quern {

namespace {

TensorEntry entry(std::string gguf, std::string hf, std::vector<int64_t> shape, TensorKind kind) {
    TensorEntry e;
    e.gguf = std::move(gguf);
    e.hf = std::move(hf);
    e.shape = std::move(shape);
    e.kind = kind;
    return e;
}

}  // namespace

TensorEntry& TensorTable::matrix(std::string gguf, std::string hf, std::vector<int64_t> shape) {
    entries_.push_back(entry(std::move(gguf), std::move(hf), std::move(shape), TensorKind::Matrix));
    return entries_.back();
}

TensorEntry& TensorTable::vector(std::string gguf, std::string hf, int64_t n) {
    entries_.push_back(entry(std::move(gguf), std::move(hf), {n}, TensorKind::Vector));
    return entries_.back();
}

TensorEntry& TensorTable::floats(std::string gguf, std::string hf, std::vector<int64_t> shape) {
    entries_.push_back(entry(std::move(gguf), std::move(hf), std::move(shape), TensorKind::Vector));
    return entries_.back();
}

TensorEntry& TensorTable::experts(std::string gguf, std::string gguf_expert, std::string hf, std::vector<int64_t> shape,
                                  int64_t n_expert) {
    TensorEntry e = entry(std::move(gguf), std::move(hf), std::move(shape), TensorKind::Experts);
    e.n_expert = n_expert;
    e.gguf_expert = std::move(gguf_expert);
    entries_.push_back(std::move(e));
    return entries_.back();
}

BoundWeights::BoundWeights(const TensorTable& table, const WeightStore& ws) {
    const auto& mm = matmul_weight_types();
    const std::vector<DType> f32{DType::F32};
    for (const TensorEntry& e : table.entries()) {
        switch (e.kind) {
            case TensorKind::Matrix:
            case TensorKind::Vector: {
                const auto& types = e.kind == TensorKind::Matrix ? mm : f32;
                tensors_[e.gguf] = e.optional ? ws.optional(e.gguf, e.shape, types) : &ws.require(e.gguf, e.shape, types);
                break;
            }
            case TensorKind::Experts: {
                BoundBank b;
                std::vector<int64_t> s3 = e.shape;
                s3.push_back(e.n_expert);
                b.stacked = ws.optional(e.gguf, s3, mm);
                if (!b.stacked) {
                    if (!ws.find(fmt::format(fmt::runtime(e.gguf_expert), 0)))
                        fail("tensor '{}' is missing from the model (and so are the per-expert '{}')", e.gguf,
                             fmt::format(fmt::runtime(e.gguf_expert), 0));
                    for (int64_t x = 0; x < e.n_expert; ++x)
                        b.experts.push_back(&ws.require(fmt::format(fmt::runtime(e.gguf_expert), x), e.shape, mm));
                }
                banks_[e.gguf] = std::move(b);
                break;
            }
        }
    }
}

const Tensor* BoundWeights::find(const std::string& gguf) const {
    const auto it = tensors_.find(gguf);
    if (it == tensors_.end()) fail("the architecture's builder reads tensor '{}', which its tensor table lacks", gguf);
    return it->second;
}

const Tensor& BoundWeights::get(const std::string& gguf) const {
    const Tensor* t = find(gguf);
    if (!t) fail("tensor '{}' is missing from the model", gguf);
    return *t;
}

const BoundBank& BoundWeights::bank(const std::string& gguf) const {
    const auto it = banks_.find(gguf);
    if (it == banks_.end()) fail("the architecture's builder reads expert bank '{}', which its tensor table lacks", gguf);
    return it->second;
}

}  // namespace quern
