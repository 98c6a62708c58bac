// FP8 per-channel conversion of a model's layer matrices (fp8_weights.h).
#include "model/fp8_weights.h"

#include <cstring>
#include <regex>

#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/fp8.h"
#include "quant/reference.h"

namespace quern {

bool is_fp8_layer_matrix(const std::string& name) {
    static const std::regex re(
        R"(blk\.\d+\.(attn_q|attn_k|attn_v|attn_qkv|attn_output|ffn_gate|ffn_up|ffn_down|ffn_gate_exps|ffn_up_exps|ffn_down_exps)(\.\d+)?\.weight)");
    return std::regex_match(name, re);
}

WeightStore fp8_per_channel_weights(const WeightStore& ws, ThreadPool& pool) {
    WeightStore out;
    for (const auto& [name, t] : ws.all()) {
        const int64_t K = t.ne[0];
        if (!is_fp8_layer_matrix(name) || K % QK_F8 != 0) {
            out.add(t);
            continue;
        }
        const int64_t rows = t.nrows(), blocks = K / QK_F8;
        auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[static_cast<size_t>(rows * blocks) * sizeof(block_f8_b32)]);
        auto* dst = reinterpret_cast<block_f8_b32*>(buf.get());
        pool.parallel_for(rows, 16, [&](int64_t r0, int64_t r1, int) {
            std::vector<float> v(static_cast<size_t>(K));
            std::vector<uint8_t> q(static_cast<size_t>(K));
            for (int64_t r = r0; r < r1; ++r) {
                const int64_t i1 = r % t.ne[1], i2 = (r / t.ne[1]) % t.ne[2], i3 = r / (t.ne[1] * t.ne[2]);
                dequantize_row_ref(t.type, t.row(i1, i2, i3), v.data(), K);
                float scale = 1.0f;
                quantize_fp8_rows(v.data(), 1, K, q.data(), &scale);
                for (int64_t b = 0; b < blocks; ++b) {
                    block_f8_b32& blk = dst[r * blocks + b];
                    blk.d = scale;
                    std::memcpy(blk.qs, q.data() + b * QK_F8, QK_F8);
                }
            }
        });
        Tensor c = Tensor::contiguous(DType::F8_E4M3_B32, t.ne, buf.get(), name);
        out.add(c, std::shared_ptr<const void>(buf, buf.get()));
    }
    return out;
}

}  // namespace quern
