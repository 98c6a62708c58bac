#include "model/weights.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"

namespace quern {

void WeightStore::add(Tensor t, std::shared_ptr<const void> owner) {
    if (owner && std::find(owners_.begin(), owners_.end(), owner) == owners_.end()) owners_.push_back(owner);
    const std::string name = t.name;
    if (!tensors_.emplace(name, std::move(t)).second) fail("duplicate tensor '{}'", name);
}

const Tensor* WeightStore::find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

const Tensor* WeightStore::optional(const std::string& name, std::vector<int64_t> shape,
                                    const std::vector<DType>& allowed) const {
    const Tensor* t = find(name);
    if (!t) return nullptr;
    std::vector<int64_t> want = shape;
    want.resize(4, 1);
    for (int i = 0; i < 4; ++i) {
        if (t->ne[static_cast<size_t>(i)] != want[static_cast<size_t>(i)]) {
            std::vector<int64_t> got(t->ne.begin(), t->ne.end());
            while (got.size() > 1 && got.back() == 1) got.pop_back();
            fail("tensor '{}' has shape [{}], expected [{}]", name, fmt::join(got, ", "), fmt::join(shape, ", "));
        }
    }
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), t->type) == allowed.end()) {
        std::vector<std::string_view> names;
        for (DType d : allowed) names.push_back(dtype_name(d));
        fail("tensor '{}' has type {}, expected one of {}", name, dtype_name(t->type), fmt::join(names, ", "));
    }
    return t;
}

const Tensor& WeightStore::require(const std::string& name, std::vector<int64_t> shape,
                                   const std::vector<DType>& allowed) const {
    const Tensor* t = optional(name, std::move(shape), allowed);
    if (!t) fail("tensor '{}' is missing from the model", name);
    return *t;
}

}  // namespace quern
