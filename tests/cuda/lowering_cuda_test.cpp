// The lowering of each synthetic preset's decode step (tiny, Q4_K_M): the
// kernels its CUDA graph launches, in order, against the listing committed
// in tests/data/lowering/. A change to the fusion rules, the GEMV choice or
// the attention variant shows up here as a diff of kernel names. When a
// change is intended, rerun with LOWERING_LISTING_OUT=DIR to write the new
// listings there, and commit them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "backend/block_plan.h"
#include "backend/cuda/executor.h"
#include "model/model.h"
#include "model/synth.h"

namespace quern {
namespace {

#ifndef QUERN_SOURCE_DIR
#define QUERN_SOURCE_DIR "."
#endif

std::vector<std::string> read_lines(const std::string& path) {
    std::ifstream f(path);
    std::vector<std::string> out;
    for (std::string l; std::getline(f, l);)
        if (!l.empty()) out.push_back(l);
    return out;
}

TEST(CudaLowering, DecodeStepOfEveryPresetMatchesItsListing) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const char* out_dir = std::getenv("LOWERING_LISTING_OUT");
    const std::string dir = std::string(QUERN_SOURCE_DIR) + "/tests/data/lowering/";
    int checked = 0;
    for (const SynthPreset& p : synth_presets()) {
        SCOPED_TRACE(p.name);
        SynthModel sm = make_synthetic(synth_tiny(p), "Q4_K_M", 7);
        auto model = Model::from_weights(sm.cfg, std::move(sm.weights));
        if (!cuda_unsupported(model->program()).empty()) continue;
        cuda::SessionOptions o;
        o.verbose = false;
        cuda::CudaExecutor x(model->program(), o);
        x.make_kv_storage(8, 16, "test");
        const std::vector<std::string> got = x.decode_kernels();
        EXPECT_GT(got.size(), 4u);
        if (out_dir) {
            std::filesystem::create_directories(out_dir);
            std::ofstream f(std::string(out_dir) + "/" + p.name + ".txt");
            for (const auto& k : got) f << k << "\n";
        }
        const std::vector<std::string> want = read_lines(dir + p.name + ".txt");
        EXPECT_EQ(got, want) << "the decode step of " << p.name << " launches other kernels than "
                             << dir + p.name + ".txt lists";
        ++checked;
    }
    EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace quern
