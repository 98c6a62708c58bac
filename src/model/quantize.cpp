#include "model/quantize.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "formats/gguf.h"
#include "quant/reference.h"

namespace quern {

namespace {

/// What the mix rules read of the model (MixModel), from its metadata.
MixModel mix_model(const GgufFile& f) {
    MixModel m;
    m.arch = f.get_string("general.architecture", "");
    const std::string a = m.arch + ".";
    m.n_layer = f.get_int(a + "block_count", 0);
    m.n_expert = f.get_int(a + "expert_count", 0);
    // Head counts may be per layer (arrays): the largest of each.
    const auto heads = [&](const std::string& key) -> int64_t {
        const GgufValue* v = f.find(key);
        if (!v) return 0;
        if (v->type != GgufType::ARRAY) return v->as_int();
        int64_t best = 0;
        for (const GgufValue& x : v->as_array().items) best = std::max(best, x.as_int());
        return best;
    };
    const int64_t h = heads(a + "attention.head_count"), kv = heads(a + "attention.head_count_kv");
    m.n_gqa = h > 0 && kv > 0 ? h / kv : 1;
    m.tied_embeddings = f.find_tensor("output.weight") == nullptr;
    for (const GgufTensorInfo& t : f.tensors()) m.n_attention_v += MixPlanner::attention_v(t.name);
    m.is_70b = m.arch == "llama" && m.n_layer == 80;
    return m;
}

}  // namespace

QuantizeReport quantize_gguf(const std::string& in, const std::string& out, const QuantizeOptions& opts,
                             ThreadPool& pool,
                             const std::function<void(uint64_t done, uint64_t total)>& progress) {
    std::error_code ec;
    if (!opts.dry_run && std::filesystem::equivalent(in, out, ec)) fail("the output file is the input file '{}'", in);
    GgufFile f(in);
    MixPlanner plan(opts.type, mix_model(f));
    QuantizeReport rep;
    // llama-quantize's tensor order: the tensors outside layers, then layer
    // by layer, by name within each (the mix's counters follow it too).
    std::vector<const GgufTensorInfo*> infos;
    for (const GgufTensorInfo& t : f.tensors()) infos.push_back(&t);
    std::stable_sort(infos.begin(), infos.end(), [&](const GgufTensorInfo* a, const GgufTensorInfo* b) {
        const int la = tensor_layer(a->name), lb = tensor_layer(b->name);
        return la != lb ? la < lb : a->name < b->name;
    });
    // The types first, so that a refusal comes before any work.
    bool warned = false;
    for (const GgufTensorInfo* tp : infos) {
        const GgufTensorInfo& t = *tp;
        QuantizedTensor q{t.name, t.type, t.type};
        q.to = plan.choose(t.name, t.type, t.ne, t.n_dims, &q.fell_back);
        if (q.to != q.from) {
            if (!quant_ref_supports(q.from) || !quant_ref_supports(q.to))
                fail("tensor '{}': quern cannot convert {} to {}", t.name, dtype_name(q.from), dtype_name(q.to));
            if (dtype_is_quantized(q.from) && !opts.allow_requantize)
                fail("tensor '{}' is already quantized ({}); requantizing to {} loses accuracy twice: start from an "
                     "F16/BF16/F32 file, or pass --allow-requantize",
                     t.name, dtype_name(q.from), dtype_name(q.to));
            if (dtype_is_quantized(q.from) && opts.on_requantize && !warned) {
                opts.on_requantize(t.name, q.from, q.to);
                warned = true;
            }
        }
        rep.tensors.push_back(q);
    }

    GgufWriter w;
    for (const GgufKV& kv : f.metadata()) {
        const std::string& k = kv.key;
        if (k == "general.file_type" || k == "general.quantization_version" || k == "general.alignment" ||
            k.rfind("split.", 0) == 0)
            continue;
        w.set(k, kv.value);
    }
    if (f.find("general.alignment")) w.set_alignment(static_cast<uint32_t>(f.alignment()));
    w.set_u32("general.quantization_version", 2);
    w.set_u32("general.file_type", static_cast<uint32_t>(opts.type));

    // Each converted tensor is made when the writer reaches it: one tensor's
    // bytes in memory at a time.
    for (size_t i = 0; i < infos.size(); ++i) {
        const GgufTensorInfo& t = *infos[i];
        const QuantizedTensor& q = rep.tensors[i];
        rep.bytes_in += t.nbytes;
        const uint8_t* src = f.data(t);
        const int64_t n = t.ne[0], rows = t.ne[1] * t.ne[2] * t.ne[3];
        rep.bytes_out += row_size(q.to, n) * static_cast<uint64_t>(rows);
        if (q.to == q.from) {
            w.add_tensor(t.name, q.to, t.ne, t.n_dims, src);
            continue;
        }
        w.add_tensor(t.name, q.to, t.ne, t.n_dims, [&pool, src, q, n, rows](uint8_t* dst) {
            const size_t rs_in = row_size(q.from, n), rs_out = row_size(q.to, n);
            pool.parallel_for(rows, std::max<int64_t>(1, 65536 / std::max<int64_t>(n, 1)), [&](int64_t r0, int64_t r1, int) {
                std::vector<float> row(static_cast<size_t>(n));
                for (int64_t r = r0; r < r1; ++r) {
                    dequantize_row_ref(q.from, src + rs_in * static_cast<size_t>(r), row.data(), n);
                    quantize_row_ref(q.to, row.data(), dst + rs_out * static_cast<size_t>(r), n);
                }
            });
        });
    }
    if (opts.dry_run) return rep;
    w.write(out, [&](uint64_t d, uint64_t total) {
        if (progress) progress(d, total);
    });
    return rep;
}

}  // namespace quern
