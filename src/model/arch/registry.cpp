// The architecture families quern runs (arch.h). A new family is one file in
// this folder and one line here.
#include <fmt/format.h>

#include "model/arch/arch.h"

namespace quern {

namespace arch {
extern const ArchDef kLlama, kQwen2, kQwen3, kQwen3Moe, kQwen35, kQwen35Moe, kPhi3, kGemma2, kGemma3, kGranite,
    kGptOss;
}

namespace {

const std::vector<const ArchDef*>& registry() {
    static const std::vector<const ArchDef*> r{&arch::kLlama,  &arch::kQwen2,  &arch::kQwen3,
                                               &arch::kQwen3Moe, &arch::kQwen35, &arch::kQwen35Moe, &arch::kPhi3,
                                               &arch::kGemma2, &arch::kGemma3, &arch::kGranite, &arch::kGptOss};
    return r;
}

}  // namespace

const ArchDef* find_arch(std::string_view name) {
    for (const ArchDef* a : registry())
        if (a->name == name) return a;
    return nullptr;
}

const ArchDef* find_hf_arch(std::string_view model_type) {
    for (const ArchDef* a : registry())
        for (std::string_view t : a->hf_types)
            if (t == model_type) return a;
    return nullptr;
}

std::string_view hf_refusal(std::string_view model_type) {
    for (const ArchDef* a : registry())
        for (const auto& [t, why] : a->hf_refused)
            if (t == model_type) return why;
    return "";
}

std::string supported_archs(bool hf) {
    std::string s;
    for (const ArchDef* a : registry()) {
        if (!hf) s += (s.empty() ? "" : ", ") + std::string(a->name);
        else
            for (std::string_view t : a->hf_types) s += (s.empty() ? "" : ", ") + std::string(t);
    }
    return s;
}

}  // namespace quern
