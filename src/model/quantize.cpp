#include "model/quantize.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/hf_model.h"
#include "model/hf_to_gguf.h"
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

QuantizeSource gguf_quantize_source(const std::string& path) {
    auto f = std::make_shared<GgufFile>(path);
    QuantizeSource src;
    src.mix = mix_model(*f);
    for (const GgufTensorInfo& t : f->tensors()) {
        const uint8_t* data = f->data(t);
        const size_t rs = row_size(t.type, t.ne[0]);
        src.tensors.push_back({t.name, t.type, t.ne, static_cast<int>(t.n_dims),
                               [data, rs](int64_t r) { return data + rs * static_cast<size_t>(r); }, data});
    }
    src.write_metadata = [f](GgufWriter& w) {
        for (const GgufKV& kv : f->metadata()) {
            const std::string& k = kv.key;
            if (k == "general.file_type" || k == "general.quantization_version" || k == "general.alignment" ||
                k.rfind("split.", 0) == 0)
                continue;
            w.set(k, kv.value);
        }
        if (f->find("general.alignment")) w.set_alignment(static_cast<uint32_t>(f->alignment()));
    };
    src.owner = f;
    return src;
}

QuantizeReport quantize_gguf(const std::string& in, const std::string& out, const QuantizeOptions& opts,
                             ThreadPool& pool,
                             const std::function<void(uint64_t done, uint64_t total)>& progress) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!opts.dry_run && fs::equivalent(in, out, ec)) fail("the output file is the input file '{}'", in);
    const QuantizeSource src = is_hf_model_path(in) || fs::is_directory(in) ? hf_quantize_source(in)
                                                                             : gguf_quantize_source(in);
    MixModel mm = src.mix;
    mm.has_imatrix = opts.imatrix != nullptr;
    MixPlanner plan(opts.type, mm);
    QuantizeReport rep;
    // llama-quantize's tensor order: the tensors outside layers, then layer
    // by layer, by name within each (the mix's counters follow it too).
    std::vector<const QuantizeSource::Tensor*> infos;
    for (const QuantizeSource::Tensor& t : src.tensors) infos.push_back(&t);
    std::stable_sort(infos.begin(), infos.end(), [&](const QuantizeSource::Tensor* a, const QuantizeSource::Tensor* b) {
        const int la = tensor_layer(a->name), lb = tensor_layer(b->name);
        return la != lb ? la < lb : a->name < b->name;
    });
    // The types first, so that a refusal comes before any work.
    bool warned = false;
    for (const QuantizeSource::Tensor* tp : infos) {
        const QuantizeSource::Tensor& t = *tp;
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
        } else if (static_cast<uint32_t>(q.to) >= kDTypeQuernBase) {
            fail("tensor '{}' would stay in quern's own {} layout, which a GGUF file cannot hold", t.name,
                 dtype_name(q.to));
        }
        rep.tensors.push_back(q);
    }
    // Which converted matrices have importance weights ({ne0, n_expert}
    // floats, made when the tensor is written), checked before any work too.
    if (opts.imatrix) {
        for (size_t i = 0; i < infos.size(); ++i) {
            const QuantizeSource::Tensor& t = *infos[i];
            QuantizedTensor& q = rep.tensors[i];
            const size_t have = opts.imatrix->importance_size(t.name, t.ne[2]);
            if (q.to == q.from || have == 0) continue;
            if (static_cast<int64_t>(have) != t.ne[0] * t.ne[2]) {
                // The token embedding never meets a matrix product: an entry
                // of another width there is someone else's, as llama.cpp says.
                if (t.name == "token_embd.weight") continue;
                fail("the importance matrix has {} weights for '{}', which needs {} ({} columns × {} experts): it "
                     "was made from another model",
                     have, t.name, t.ne[0] * t.ne[2], t.ne[0], t.ne[2]);
            }
            q.weighted = true;
        }
    }

    GgufWriter w;
    src.write_metadata(w);
    w.set_u32("general.quantization_version", 2);
    w.set_u32("general.file_type", static_cast<uint32_t>(opts.type));
    if (opts.imatrix) {  // what llama-quantize records (strings cut at 127 bytes, as it does)
        w.set_string("quantize.imatrix.file", opts.imatrix_file.substr(0, 127));
        if (!opts.imatrix->datasets.empty())
            w.set_string("quantize.imatrix.dataset", opts.imatrix->datasets[0].substr(0, 127));
        w.set_u32("quantize.imatrix.entries_count", static_cast<uint32_t>(opts.imatrix->entries.size()));
        if (opts.imatrix->chunk_count > 0)
            w.set_u32("quantize.imatrix.chunks_count", static_cast<uint32_t>(opts.imatrix->chunk_count));
    }

    // Each converted tensor is made when the writer reaches it: one tensor's
    // bytes in memory at a time.
    for (size_t i = 0; i < infos.size(); ++i) {
        const QuantizeSource::Tensor& t = *infos[i];
        const QuantizedTensor& q = rep.tensors[i];
        const int64_t n = t.ne[0], rows = t.ne[1] * t.ne[2] * t.ne[3];
        const size_t rs_in = row_size(q.from, n), rs_out = row_size(q.to, n);
        rep.bytes_in += rs_in * static_cast<uint64_t>(rows);
        rep.bytes_out += rs_out * static_cast<uint64_t>(rows);
        if (q.to == q.from && t.contiguous) {
            w.add_tensor(t.name, q.to, t.ne, t.n_dims, t.contiguous);
            continue;
        }
        const int64_t rows_per_expert = t.ne[1];
        const Imatrix* im = q.weighted ? opts.imatrix : nullptr;
        w.add_tensor(t.name, q.to, t.ne, t.n_dims, [&pool, &t, q, n, rows, rs_in, rs_out, im, rows_per_expert](uint8_t* dst) {
            const std::vector<float> importance = im ? im->importance(q.name, t.ne[2]) : std::vector<float>{};
            const float* imp = importance.empty() ? nullptr : importance.data();
            pool.parallel_for(rows, std::max<int64_t>(1, 65536 / std::max<int64_t>(n, 1)), [&](int64_t r0, int64_t r1, int) {
                std::vector<float> row(static_cast<size_t>(n));
                for (int64_t r = r0; r < r1; ++r) {
                    uint8_t* d = dst + rs_out * static_cast<size_t>(r);
                    if (q.to == q.from) {  // rows gathered as they are
                        std::memcpy(d, t.row(r), rs_out);
                        continue;
                    }
                    dequantize_row_ref(q.from, t.row(r), row.data(), n);
                    // An expert's rows take its own slice of the weights.
                    const float* w_row = imp ? imp + (r / rows_per_expert) * n : nullptr;
                    quantize_row_weighted(q.to, row.data(), d, n, w_row);
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
