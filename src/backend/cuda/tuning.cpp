#include "backend/cuda/tuning.h"

#include <algorithm>
#include <cstdlib>

namespace quern::cuda {

namespace {

const char* env(const char* name) {
    const char* e = std::getenv(name);
    return e && *e ? e : nullptr;
}

int64_t env_int(const char* name, int64_t def) {
    const char* e = env(name);
    return e ? std::atoll(e) : def;
}

/// "A=1,B@2=3" as (name, value) pairs.
std::vector<std::pair<std::string, int>> pairs(const char* s) {
    std::vector<std::pair<std::string, int>> v;
    const std::string str = s ? s : "";
    for (size_t i = 0; i < str.size();) {
        size_t j = str.find(',', i);
        if (j == std::string::npos) j = str.size();
        const std::string item = str.substr(i, j - i);
        if (const size_t eq = item.find('='); eq != std::string::npos)
            v.emplace_back(item.substr(0, eq), std::atoi(item.c_str() + eq + 1));
        i = j + 1;
    }
    return v;
}

}  // namespace

const Tuning& tuning() {
    static const Tuning t = [] {
        Tuning x;
        if (const char* e = env("QUERN_CUDA_SKIP")) x.skip = e;
        x.gemv_config = pairs(env("QUERN_GEMV_CONFIG"));
        x.prefill_chunk = std::max<int64_t>(0, env_int("QUERN_CUDA_PREFILL_CHUNK", 0));
        x.prefill_tile = std::max<int64_t>(0, env_int("QUERN_CUDA_PREFILL_TILE", 0));
        x.gemm_tune = env_int("QUERN_CUDA_GEMM_TUNE", 0) != 0;
        x.bq_rows = env_int("QUERN_CUDA_BQ_ROWS", -1);
        x.bq_wgmma = static_cast<int>(env_int("QUERN_CUDA_BQ_WGMMA", -1));
        x.qw = env_int("QUERN_CUDA_QW", 0) != 0 ? 1 : 0;
        x.qw_rows = env_int("QUERN_CUDA_QW_ROWS", -1);
        x.fp8_cublas = env_int("QUERN_CUDA_FP8_CUBLAS", 0) != 0;
        x.bq_blocks_per_sm = static_cast<int>(std::max<int64_t>(0, env_int("QUERN_CUDA_BQ_BLOCKS_PER_SM", 0)));
        x.paged_splits = static_cast<int>(std::max<int64_t>(0, env_int("QUERN_CUDA_PAGED_SPLITS", 0)));
        x.dq_tokens = static_cast<int>(env_int("QUERN_CUDA_DQ_TOKENS", 0));
        x.delta_chunk_rows = static_cast<int>(std::max<int64_t>(0, env_int("QUERN_CUDA_DELTA_CHUNK_ROWS", 32)));
        x.delta_col_groups = static_cast<int>(env_int("QUERN_CUDA_DELTA_COL_GROUPS", 0));
        if (x.delta_col_groups != 1 && x.delta_col_groups != 2 && x.delta_col_groups != 4) x.delta_col_groups = 0;
        return x;
    }();
    return t;
}

}  // namespace quern::cuda
