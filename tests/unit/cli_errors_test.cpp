// The quern binary's answers to command lines a user gets wrong: a known
// command missing its argument is not reported as an unknown command; a
// context whose KV cache cannot fit in memory is refused, naming the flag;
// chat templates that do not parse or render, conflicting options; what
// --cpu-profile prints, and its refusal with --batch. Models are
// test-sized synthetic ones that quern synth writes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/memory.h"
#include "formats/gguf.h"

namespace {

namespace fs = std::filesystem;

struct Result {
    int rc;
    std::string err;
    std::string out;
};

std::string slurp(const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

/// Runs quern with `args` (shell words), `input` on its stdin; returns the
/// exit status, stderr and stdout.
Result run(const std::string& args, const std::string& input = "") {
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    const std::string tag = std::to_string(::getpid());
    const fs::path err = fs::temp_directory_path() / ("quern_cli_err_" + tag + ".txt");
    const fs::path in = fs::temp_directory_path() / ("quern_cli_in_" + tag + ".txt");
    const fs::path out = fs::temp_directory_path() / ("quern_cli_out_" + tag + ".txt");
    std::ofstream(in, std::ios::binary) << input;
    const int rc = std::system(("'" + quern + "' " + args + " <'" + in.string() + "' >'" + out.string() + "' 2>'" +
                                err.string() + "'")
                                   .c_str());
    Result r{rc, slurp(err), slurp(out)};
    fs::remove(err);
    fs::remove(in);
    fs::remove(out);
    return r;
}

/// A scratch folder for this test process, removed at exit.
const fs::path& scratch() {
    static const struct Dir {
        fs::path p = fs::temp_directory_path() / ("quern_cli_" + std::to_string(::getpid()));
        Dir() { fs::create_directories(p); }
        ~Dir() {
            std::error_code ec;
            fs::remove_all(p, ec);
        }
    } d;
    return d.p;
}

fs::path write_file(const std::string& name, const std::string& text) {
    const fs::path p = scratch() / name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
}

/// How often `what` occurs in `s`.
size_t count(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
}

/// A test-sized synthetic model (quern synth --tiny; byte-level tokenizer, no
/// chat template), written once per test process.
const std::string& tiny_model() {
    static const std::string path = [] {
        const fs::path p = scratch() / "tiny.gguf";
        const Result r = run("synth smollm2-135m --tiny --quant Q8_0 -o '" + p.string() + "'");
        EXPECT_EQ(r.rc, 0) << r.err;
        return p.string();
    }();
    return path;
}

/// The tiny model with tokenizer.ggml.add_bos_token true (its BOS text
/// returned in *bos_text), written once per test process.
const std::string& bos_model(std::string* bos_text = nullptr) {
    using namespace quern;
    static std::string text;
    static const std::string path = [] {
        const GgufFile in(tiny_model());
        GgufWriter w;
        for (const GgufKV& kv : in.metadata())
            if (kv.key != "tokenizer.ggml.add_bos_token" && kv.key != "general.alignment") w.set(kv.key, kv.value);
        w.set_bool("tokenizer.ggml.add_bos_token", true);
        for (const GgufTensorInfo& t : in.tensors()) w.add_tensor(t.name, t.type, t.ne, t.n_dims, in.data(t));
        const fs::path p = scratch() / "tiny-bos.gguf";
        w.write(p.string());
        text = in.get_string_array("tokenizer.ggml.tokens")[static_cast<size_t>(in.get_int("tokenizer.ggml.bos_token_id"))];
        return p.string();
    }();
    if (bos_text) *bos_text = text;
    return path;
}

bool have_quern() { return fs::exists(std::string(QUERN_BINARY_DIR) + "/quern"); }

TEST(CliErrors, MissingArgumentOfAKnownCommand) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    for (const char* cmd : {"inspect", "inspect --json", "perplexity -c 64"}) {
        const Result r = run(cmd);
        EXPECT_NE(r.rc, 0) << cmd;
        EXPECT_EQ(r.err.find("unknown command"), std::string::npos) << cmd << ": " << r.err;
        EXPECT_NE(r.err.find("is required"), std::string::npos) << cmd << ": " << r.err;
    }
    const Result r = run("frobnicate");
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.err.find("unknown command 'frobnicate'"), std::string::npos) << r.err;
}

// The check behind -c / --kv-tokens (make_cpu_session, the serving engine).
TEST(CliErrors, KvCacheLargerThanMemoryIsRefused) {
    if (quern::available_memory_bytes() == 0) GTEST_SKIP() << "available memory unknown here";
    try {
        // 32 layers x 1024 floats x 2 x 4 bytes = 256 KiB per position: 2^30 positions need 256 TiB.
        quern::check_kv_cache_fits(int64_t{1} << 30, 32, 1024, 4, "-c");
        FAIL() << "no error";
    } catch (const std::exception& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("KV cache for 1073741824 tokens needs 262144.00 GiB"), std::string::npos) << m;
        EXPECT_NE(m.find("lower -c"), std::string::npos) << m;
    }
    EXPECT_NO_THROW(quern::check_kv_cache_fits(1024, 32, 1024, 4, "-c"));  // 256 MiB
}

TEST(CliErrors, ChatTemplateSyntaxErrorNamesTheFile) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    const fs::path bad = write_file("bad.jinja", "{% for m in messages %}\n{{ m.content }\n{% endfor %}\n");
    const Result r = run("chat -m '" + tiny_model() + "' --chat-template-file '" + bad.string() + "'", "hi\n");
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.err.find(bad.string() + ": TemplateSyntaxError"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("line 2"), std::string::npos) << r.err;
}

TEST(CliErrors, ChatTemplateAndChatTemplateFileExcludeEachOther) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    const fs::path t = write_file("ok.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
    for (const char* cmd : {"chat", "serve"}) {
        const Result r = run(std::string(cmd) + " -m '" + tiny_model() + "' --chat-template chatml --chat-template-file '" +
                             t.string() + "'");
        EXPECT_NE(r.rc, 0) << cmd;
        EXPECT_NE(r.err.find("excludes"), std::string::npos) << cmd << ": " << r.err;
    }
    const Result r = run("template --chat-template chatml --chat-template-file '" + t.string() + "' --messages -", "[]");
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.err.find("excludes"), std::string::npos) << r.err;
}

// A template that fails on every message: each failure is reported, the chat
// goes on, and the exit status says that no message got a reply.
TEST(CliErrors, ChatFailsWhenTheTemplateFailsOnEveryMessage) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    const fs::path t = write_file("raise.jinja", "{{ raise_exception('no way') }}");
    const std::string args = "chat -m '" + tiny_model() + "' --device cpu --temp 0 -n 2 --chat-template-file '" + t.string() + "'";
    const Result r = run(args, "hi\nthere\n");
    EXPECT_NE(r.rc, 0) << r.err;
    EXPECT_EQ(count(r.err, "no way"), 3u) << r.err;  // once per message, once in the final error
    EXPECT_NE(r.err.find("no message got a reply"), std::string::npos) << r.err;
    // Without a failing template the same chat succeeds.
    const Result ok = run("chat -m '" + tiny_model() + "' --device cpu --temp 0 -n 2", "hi\nthere\n");
    EXPECT_EQ(ok.rc, 0) << ok.err;
}

TEST(CliErrors, TokenizeRefusesAnUnknownPreTokenizer) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    const Result r = run("tokenize -m '" + tiny_model() + "' --pre no-such-pre -p hi");
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.err.find("unknown pre-tokenizer 'no-such-pre'"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("llama3"), std::string::npos) << r.err;  // the known names
    EXPECT_EQ(run("tokenize -m '" + tiny_model() + "' --pre llama3 -p hi").rc, 0);
}

// --device auto may pick either device, so GPU-only options on a CPU run are a
// warning (once), not an error.
TEST(CliErrors, GpuOnlyOptionsOnTheCpuWarnOnce) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    const std::string m = " -m '" + tiny_model() + "' --device cpu";
    const std::string warning = "ignores the GPU-only option";
    Result r = run("run" + m + " -p hi -n 2 --temp 0 --kv-tokens 64 --gpu-mem 0.5 --no-cuda-graph");
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(count(r.err, warning), 1u) << r.err;
    EXPECT_NE(r.err.find("--kv-tokens, --gpu-mem, --no-cuda-graph"), std::string::npos) << r.err;
    r = run("chat" + m + " -n 2 --temp 0 --no-cuda-graph", "hi\n");
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(count(r.err, warning + " --no-cuda-graph"), 1u) << r.err;
    r = run("bench" + m + " -p 4 -n 4 -r 3 --kv-tokens 64");
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(count(r.err, warning + " --kv-tokens"), 1u) << r.err;
    r = run("run" + m + " -p hi -n 2 --temp 0");
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(count(r.err, warning), 0u) << r.err;
}

TEST(CliErrors, DashReadsThePromptOrTextFromStdin) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    const std::string m = " -m '" + tiny_model() + "'";
    Result r = run("run" + m + " --device cpu -n 2 --temp 0 -f -", "hello");
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.err.find("prompt 5 tokens"), std::string::npos) << r.err;  // byte-level vocabulary, no BOS
    std::string text;
    for (int i = 0; i < 8; ++i) text += "The quick brown fox jumps over the lazy dog. ";
    r = run("perplexity" + m + " -c 32 -f -", text);
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.err.find("stdin: 360 tokens"), std::string::npos) << r.err;
    r = run("perplexity" + m + " -c 32 -f -", "");
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.err.find("fewer than one chunk"), std::string::npos) << r.err;
}

// --device cuda on a machine without a GPU fails before any model is loaded
// or built, saying what to do (skipped where a GPU exists).
TEST(CliErrors, DeviceCudaWithoutAGpuFailsFirst) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    if (std::system("nvidia-smi -L > /dev/null 2>&1") == 0) GTEST_SKIP() << "a GPU is present";
    for (const std::string cmd : {"run --device cuda -m /nonexistent.gguf -p hi -n 1",
                                  "bench --device cuda --synthetic llama3-8b -p 8 -n 0 -r 1",
                                  "serve --device cuda -m /nonexistent.gguf --port 0"}) {
        const Result r = run(cmd);
        EXPECT_NE(r.rc, 0) << cmd;
        // Not "cannot open /nonexistent.gguf": the device is checked first.
        EXPECT_NE(r.err.find("--device cpu"), std::string::npos) << cmd << ": " << r.err;
        EXPECT_EQ(r.err.find("nonexistent"), std::string::npos) << cmd << ": " << r.err;
    }
}

TEST(CliErrors, BenchTakesAHuggingFaceFolder) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    const std::string dir = std::string(QUERN_SOURCE_DIR) + "/tests/data/hf/llama/fp32";
    Result r = run("bench -m '" + dir + "' --device cpu -p 4 -n 2 -r 1");
    EXPECT_EQ(r.rc, 0) << r.err;
    r = run("bench -m '" + dir + "/config.json' --device cpu -p 0 -n 2 -r 1");
    EXPECT_EQ(r.rc, 0) << r.err;
    r = run("bench -m '" + dir + "' --device cpu --batch 2 -p 4 -n 2");
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.err.find("--batch needs a GGUF file"), std::string::npos) << r.err;
}

// -p, -n and -d take lists, as llama-bench's do: every pp and tg test at
// every depth, one JSON row each with its depth.
TEST(CliErrors, BenchTakesListsOfTests) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    const std::string dir = std::string(QUERN_SOURCE_DIR) + "/tests/data/hf/llama/fp32";
    Result r = run("bench -m '" + dir + "' --device cpu -p 4,8 -n 2 -d 0,3 -r 1 --json");
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    std::vector<std::string> tests;
    for (const auto& row : j) tests.push_back(row["test"].get<std::string>() + "/" + std::to_string(row["n_depth"].get<int>()));
    EXPECT_EQ(tests, (std::vector<std::string>{"pp4/0", "pp8/0", "tg2/0", "pp4 @ d3/3", "pp8 @ d3/3", "tg2 @ d3/3"}));
    r = run("bench -m '" + dir + "' --device cpu -p 4,-1 -n 2");
    EXPECT_NE(r.rc, 0);
}

}  // namespace

// quern chat piped: stdout holds the replies only; /help, an unknown command
// (not sent to the model), /system, /save and /load work and report on
// stderr; a reply cut by -n says so; a trailing backslash joins lines.
namespace {

// quern quantize: an existing output needs --force, an unknown type lists
// the known ones, a folder is refused with what to do, and a file is written.
TEST(CliErrors, QuantizeRefusesOverwritingAndUnknownTypes) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    const std::string out = (scratch() / "q.gguf").string();
    Result r = run("quantize '" + tiny_model() + "' '" + out + "' Q4_K_Z");
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.err.find("unknown type 'Q4_K_Z'"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("Q4_K_M"), std::string::npos) << r.err;
    r = run("quantize '" + scratch().string() + "' '" + out + "' Q8_0");  // a folder, but no model's
    EXPECT_NE(r.err.find("config.json is missing"), std::string::npos) << r.err;
    r = run("quantize '" + tiny_model() + "' '" + out + "' q8_0");  // the tiny model is Q8_0 already: nothing to requantize
    EXPECT_EQ(r.rc, 0) << r.err;
    r = run("quantize '" + tiny_model() + "' '" + out + "' Q8_0");
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.err.find("pass --force"), std::string::npos) << r.err;
    // --dry-run: the types and the size, nothing written.
    const std::string none = (scratch() / "never.gguf").string();
    r = run("quantize '" + tiny_model() + "' '" + none + "' Q4_K_M --dry-run --allow-requantize");
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find("dry run, nothing written"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("MiB of tensors"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(none));
    // A quantized input is requantized, with a warning that --allow-requantize hides.
    r = run("quantize '" + tiny_model() + "' '" + out + "' Q4_K_M --force");
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.err.find("already quantized"), std::string::npos) << r.err;
    r = run("quantize '" + tiny_model() + "' '" + out + "' Q4_K_M --force --allow-requantize");
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.err.find("already quantized"), std::string::npos) << r.err;
}

// One BOS rule: a prompt that begins with the BOS text of a model that adds
// BOS gets one BOS, not two (run warns); template -m with --template FILE
// renders the model's bos_token.
TEST(CliErrors, PromptsGetOneBos) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    std::string bos;
    const std::string m = bos_model(&bos);
    ASSERT_FALSE(bos.empty());
    const auto prompt_tokens = [](const std::string& err) {
        const size_t at = err.rfind("prompt ");
        return at == std::string::npos ? -1 : std::atoi(err.c_str() + at + 7);
    };
    Result plain = run("run -m '" + m + "' --device cpu -p hello -n 1 --temp 0");
    Result with = run("run -m '" + m + "' --device cpu -p '" + bos + "hello' -n 1 --temp 0");
    ASSERT_EQ(plain.rc, 0) << plain.err;
    ASSERT_EQ(with.rc, 0) << with.err;
    EXPECT_GT(prompt_tokens(plain.err), 0) << plain.err;
    EXPECT_EQ(prompt_tokens(with.err), prompt_tokens(plain.err)) << with.err;
    EXPECT_NE(with.err.find("not added a second time"), std::string::npos) << with.err;
    EXPECT_EQ(plain.err.find("not added a second time"), std::string::npos) << plain.err;
    const fs::path tf = write_file("bos.jinja", "[{{ bos_token }}]{% for m in messages %}{{ m.content }}{% endfor %}");
    const fs::path msgs = write_file("msgs.json", R"([{"role": "user", "content": "hi"}])");
    const Result t = run("template -m '" + m + "' --template '" + tf.string() + "' --messages '" + msgs.string() + "'");
    EXPECT_EQ(t.rc, 0) << t.err;
    EXPECT_NE(t.out.find("[" + bos + "]hi"), std::string::npos) << t.out;
}

TEST(CliChat, CommandsAndPipedOutput) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    const fs::path saved = scratch() / "conversation.json";
    const std::string input = "/help\n/bogus thing\nhi\n/system Be brief.\n/save " + saved.string() +
                              "\n/clear\n/load " + saved.string() + "\n/save\nline one\\\nline two\n//slash\n";
    const Result r = run("chat -m '" + tiny_model() + "' --device cpu --temp 0 -n 3", input);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out.find("> "), std::string::npos) << r.out;  // no echo of the input
    EXPECT_EQ(count(r.out, "\n"), 3u) << r.out;               // three replies, one line each
    EXPECT_NE(r.err.find("/save FILE"), std::string::npos) << r.err;  // the help
    EXPECT_NE(r.err.find("unknown command /bogus"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("/save needs a file name"), std::string::npos) << r.err;
    EXPECT_EQ(count(r.err, "stopped at the limit of 3 tokens"), 3u) << r.err;
    const auto conv = nlohmann::json::parse(slurp(saved));
    ASSERT_EQ(conv.size(), 3u) << conv.dump();
    EXPECT_EQ(conv[0]["role"], "system");
    EXPECT_EQ(conv[0]["content"], "Be brief.");
    EXPECT_EQ(conv[1]["content"], "hi");
    EXPECT_EQ(conv[2]["role"], "assistant");
    EXPECT_NE(r.err.find("loaded from " + saved.string() + ": 3 messages"), std::string::npos) << r.err;
    // a bad file is reported and the chat goes on
    const fs::path bad = write_file("bad.json", "{\"not\": \"a list\"}");
    const Result b = run("chat -m '" + tiny_model() + "' --device cpu --temp 0 -n 2", "/load " + bad.string() + "\nhi\n");
    EXPECT_EQ(b.rc, 0) << b.err;
    EXPECT_NE(b.err.find("must hold a list of messages"), std::string::npos) << b.err;
}

// A thinking model's reasoning (a template whose generation prompt opens
// <think>, so the whole reply of the random tiny model is reasoning) goes
// to stderr when stdout is piped: stdout keeps only answers (here empty
// lines), and the conversation keeps the answer without the reasoning.
TEST(CliChat, ReasoningStaysOffStdoutWhenPiped) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    const fs::path tf = write_file(
        "think.jinja",
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}");
    const fs::path saved = scratch() / "thinking.json";
    const Result r = run("chat -m '" + tiny_model() + "' --device cpu --temp 0 -n 6 --chat-template-file '" +
                             tf.string() + "'",
                         "hi\n/save " + saved.string() + "\n");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out, "\n") << r.out;
    const auto conv = nlohmann::json::parse(slurp(saved));
    ASSERT_EQ(conv.size(), 2u) << conv.dump();
    EXPECT_EQ(conv[1]["content"], "");
    const Result plain = run("chat -m '" + tiny_model() + "' --device cpu --temp 0 -n 6", "hi\n");
    EXPECT_GT(plain.out.size(), 1u) << plain.out;  // the same model without <think>: its text is the answer
}

}  // namespace

// --cpu-profile: a table per kind of pass, matrix products by weight role and
// type with the bytes and GB/s they read, the other ops by kind; with --batch
// (whose passes it does not time) it is refused with what to run instead.
TEST(CliErrors, CpuProfilePrintsEveryOpAndIsRefusedWithBatch) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    const Result r = run("bench -m '" + tiny_model() + "' --device cpu -p 8 -n 4 -r 1 -t 1 --cpu-profile");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.err.find("CPU profile of decode steps"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("CPU profile of prompt passes"), std::string::npos) << r.err;
    for (const char* label : {"ffn_down Q8_0", "attn_q Q8_0", "attention", "rms_norm", "total"})
        EXPECT_NE(r.err.find(label), std::string::npos) << label << " missing:\n" << r.err;
    EXPECT_NE(r.err.find("GB/s"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("blk."), std::string::npos) << "labels keep the layer number:\n" << r.err;
    const Result b = run("bench -m '" + tiny_model() + "' --device cpu --batch 2 -p 8 -n 4 --cpu-profile");
    EXPECT_NE(b.rc, 0);
    EXPECT_NE(b.err.find("without --batch"), std::string::npos) << b.err;
}
