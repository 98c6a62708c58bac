// quern quantize IN OUT TYPE: a GGUF model or a Hugging Face folder
// quantized into one of llama-quantize's file types (model/quantize.h,
// model/hf_to_gguf.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/quantize.h"

namespace quern::cli {
namespace {

struct QuantizeCmdOptions {
    std::string in, out, type, imatrix;
    bool force = false, allow_requantize = false, json = false, dry_run = false;
    int threads = 0;
};

void quantize(const QuantizeCmdOptions& o) {
    const auto t = file_type_from_name(o.type);
    if (!t) fail("unknown type '{}' (use one of {})", o.type, file_type_names());
    namespace fs = std::filesystem;
    if (!fs::exists(o.in)) fail("no such file or folder: '{}'", o.in);
    if (!o.dry_run && fs::exists(o.out) && !o.force) fail("'{}' exists; pass --force to overwrite it", o.out);
    ThreadPool pool(o.threads);
    const bool tty = stderr_is_tty() && !o.json && !o.dry_run;
    QuantizeOptions qo;
    qo.type = *t;
    Imatrix im;
    if (!o.imatrix.empty()) {
        im = read_imatrix(o.imatrix);
        qo.imatrix = &im;
        qo.imatrix_file = o.imatrix;
        if (!o.json)
            std::fprintf(stderr, "quern: importance matrix %s: %zu matrices over %lld chunks%s%s\n", o.imatrix.c_str(),
                         im.entries.size(), static_cast<long long>(im.chunk_count), im.datasets.empty() ? "" : " of ",
                         im.datasets.empty() ? "" : im.datasets[0].c_str());
    }
    qo.dry_run = o.dry_run;
    // A quantized input is requantized with a warning (llama-quantize wants
    // --allow-requantize; here it only silences the warning).
    qo.allow_requantize = true;
    if (!o.allow_requantize)
        qo.on_requantize = [](const std::string& name, DType from, DType to) {
            std::fprintf(stderr,
                         "quern: warning: the input is already quantized ('%s' is %s): requantizing to %s rounds twice "
                         "and loses more than quantizing its F16/BF16 original would (--allow-requantize hides this)\n",
                         name.c_str(), dtype_name(from).data(), dtype_name(to).data());
        };
    const double t0 = now_seconds();
    const QuantizeReport r = quantize_gguf(o.in, o.out, qo, pool, [&](uint64_t d, uint64_t n) {
        if (tty) std::fprintf(stderr, "\rquern: quantizing %s %3.0f%%", o.out.c_str(), 100.0 * static_cast<double>(d) / static_cast<double>(n));
    });
    if (tty) std::fputc('\n', stderr);
    int64_t changed = 0, fell = 0, weighted = 0;
    for (const QuantizedTensor& q : r.tensors) changed += q.from != q.to, fell += q.fell_back, weighted += q.weighted;
    if (o.json) {
        nlohmann::json j{{"input", o.in},          {"output", o.out},        {"type", file_type_name(*t)},
                         {"bytes_in", r.bytes_in}, {"bytes_out", r.bytes_out}, {"seconds", now_seconds() - t0}};
        for (const QuantizedTensor& q : r.tensors)
            j["tensors"].push_back({{"name", q.name}, {"from", dtype_name(q.from)}, {"to", dtype_name(q.to)},
                                    {"fell_back", q.fell_back}, {"imatrix", q.weighted}});
        std::printf("%s\n", j.dump(1).c_str());
        return;
    }
    if (o.dry_run) {  // what the file would hold: tensors per type, and the size
        std::map<std::string, int> per;
        for (const QuantizedTensor& q : r.tensors) ++per[std::string(dtype_name(q.to))];
        std::printf("%s as %s (dry run, nothing written):\n", o.in.c_str(), file_type_name(*t));
        for (const auto& [name, count] : per) std::printf("  %-8s %4d tensors\n", name.c_str(), count);
        std::printf("  %.1f MiB of tensors -> %.1f MiB (%lld converted, %lld fall back to a smaller block type)\n",
                    r.bytes_in / 1048576.0, r.bytes_out / 1048576.0, static_cast<long long>(changed),
                    static_cast<long long>(fell));
        return;
    }
    std::fprintf(stderr,
                 "quern: wrote %s: %s, %zu tensors (%lld converted, %lld to a smaller block type where rows are not "
                 "whole blocks), %.1f MiB -> %.1f MiB in %.1f s\n",
                 o.out.c_str(), file_type_name(*t), r.tensors.size(), static_cast<long long>(changed),
                 static_cast<long long>(fell), r.bytes_in / 1048576.0, r.bytes_out / 1048576.0, now_seconds() - t0);
    if (qo.imatrix && weighted < changed)
        std::fprintf(stderr, "quern: %lld of %lld converted tensors had importance weights (the rest: not in %s)\n",
                     static_cast<long long>(weighted), static_cast<long long>(changed), o.imatrix.c_str());
}

}  // namespace
}  // namespace quern::cli

void add_quantize_command(CLI::App& app) {
    using namespace quern::cli;
    auto o = std::make_shared<QuantizeCmdOptions>();
    CLI::App* cmd = app.add_subcommand("quantize", "Quantize a GGUF model or a Hugging Face folder into a GGUF file type");
    cmd->add_option("input", o->in,
                    "GGUF file (F32 / F16 / BF16; a quantized one is requantized with a warning), or a Hugging Face "
                    "folder (safetensors BF16 / F16 / F32, FP8 / NVFP4 dequantized; its tokenizer.json)")
        ->required();
    cmd->add_option("output", o->out, "GGUF file to write")->required();
    cmd->add_option("type", o->type, std::string("File type: ") + quern::file_type_names())->required();
    cmd->add_flag("--force", o->force, "Overwrite the output file if it exists");
    cmd->add_option("--imatrix", o->imatrix,
                    "Importance matrix (quern imatrix, or llama-imatrix's GGUF / .dat): scales chosen to keep the "
                    "columns that matter most accurate")
        ->check(CLI::ExistingFile);
    cmd->add_flag("--allow-requantize", o->allow_requantize,
                  "Requantize an already quantized input without the warning (each rounding loses accuracy)");
    add_threads_option(cmd, o->threads);
    cmd->add_flag("--json", o->json, "Print what each tensor became as JSON on stdout");
    cmd->add_flag("--dry-run", o->dry_run, "Show the types and the size the file would have; write nothing");
    cmd->footer(
        "A Hugging Face folder is written as llama.cpp's converter writes it (expert banks stacked, Llama q/k rows\n"
        "permuted, tokenizer and chat template in the metadata), so the file runs in llama.cpp too.\n"
        "The per-tensor types follow llama-quantize's mixes (Q4_K_M: Q6_K for the output head and for some layers'\n"
        "attention V and FFN down matrices); the tensors equal llama-quantize's, with or without --imatrix.\n"
        "Examples:\n"
        "  quern quantize model-f16.gguf model-q4_k_m.gguf Q4_K_M\n"
        "  quern quantize ~/models/Qwen2.5-7B-Instruct qwen2.5-7b-q4_k_m.gguf Q4_K_M   # a Hugging Face folder\n"
        "  quern imatrix -m model-f16.gguf -f calibration.txt -o imatrix.gguf\n"
        "  quern quantize model-f16.gguf model-q3_k_m.gguf Q3_K_M --imatrix imatrix.gguf\n"
        "  quern quantize model-f16.gguf - Q3_K_M --dry-run      # the types and size, nothing written\n"
        "  quern synth llama3-1b --quant F16 -o l1b-f16.gguf && quern quantize l1b-f16.gguf l1b-q8_0.gguf q8_0\n"
        "  quern quantize model-f16.gguf out.gguf Q5_K_M --force --json | jq '.tensors[] | .to' | sort | uniq -c");
    cmd->callback([o] { quantize(*o); });
}
