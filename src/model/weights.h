// WeightStore: the named tensors of a model, wherever their bytes live (a
// memory-mapped GGUF file, or buffers built in memory for synthetic models).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace quern {

class WeightStore {
public:
    /// Adds a tensor view; `owner` keeps its bytes alive (may be shared by many).
    void add(Tensor t, std::shared_ptr<const void> owner = nullptr);
    const Tensor* find(const std::string& name) const;
    /// Looks up `name` and checks its shape (innermost first; trailing 1s may be
    /// omitted) and, when `allowed` is non-empty, its type. Throws quern::Error
    /// naming the tensor, the expected and the found shape/type.
    const Tensor& require(const std::string& name, std::vector<int64_t> shape,
                          const std::vector<DType>& allowed = {}) const;
    /// Like require() but returns nullptr when the tensor is absent.
    const Tensor* optional(const std::string& name, std::vector<int64_t> shape,
                           const std::vector<DType>& allowed = {}) const;
    size_t size() const { return tensors_.size(); }
    const std::map<std::string, Tensor>& all() const { return tensors_; }

private:
    std::map<std::string, Tensor> tensors_;
    std::vector<std::shared_ptr<const void>> owners_;
};

}  // namespace quern
