// Qwen3.5 (hybrid Gated DeltaNet) on the CPU beyond the golden logits
// (hf_golden_test.cpp): the recurrent state carried across calls — decoding
// token by token and a prompt cut into chunks give what one pass gives, the
// greedy continuation is transformers', truncating a session recomputes the
// state — and what is not there yet (batched passes, the GPU) says so.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "hf_test_util.h"
#include "model/hf_model.h"
#include "runtime/batch_runner.h"
#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"
#include "runtime/session.h"
#include "runtime/verify.h"

namespace quern {
namespace {

using hf_test::argmax;
using hf_test::kDir;
namespace fs = std::filesystem;

struct Fixture {
    std::unique_ptr<Model> model;
    std::vector<int32_t> tokens, greedy;
    std::vector<float> ref;  // transformers' logits at every position
};

/// The dense or the MoE checkpoint (fp32): "ARCH" loads the Hugging Face
/// folder, "ARCH/gguf" the same weights as llama.cpp's converter writes them
/// (tools/make_llamacpp_gguf.py: value heads reordered, A stored as -exp(A_log),
/// norms with the 1 added, the recurrent-layer mask as an array).
Fixture load(const std::string& param) {
    Fixture f;
    const bool gguf = param.size() > 5 && param.ends_with("/gguf");
    const std::string arch = gguf ? param.substr(0, param.size() - 5) : param;
    std::ifstream in(kDir + arch + "/golden.json");
    const nlohmann::json meta = nlohmann::json::parse(in);
    f.tokens = meta["tokens"].get<std::vector<int32_t>>();
    f.greedy = meta["greedy"].get<std::vector<int32_t>>();
    f.ref = hf_test::read_logits(kDir + arch + "/fp32.logits");
    f.model = gguf ? Model::from_gguf(std::make_shared<GgufFile>(kDir + arch + "/llamacpp-fp32.gguf"))
                   : load_hf_model(kDir + arch + "/fp32");
    return f;
}

class Qwen35 : public ::testing::TestWithParam<std::string> {};

TEST_P(Qwen35, DecodeTokenByTokenAndChunksMatchOnePass) {
    Fixture f = load(GetParam());
    const int64_t n = static_cast<int64_t>(f.tokens.size()), V = f.model->config().n_vocab;
    ASSERT_EQ(n, 64);
    ThreadPool pool(2);
    auto s = make_cpu_session(*f.model, 128, pool);
    std::vector<float> l(static_cast<size_t>(V));
    for (int64_t t = 0; t < n; ++t) {  // one token per call: the state carries everything before it
        s->eval(&f.tokens[static_cast<size_t>(t)], 1, l.data());
        const float* r = f.ref.data() + t * V;
        EXPECT_GE(cosine_similarity(l.data(), r, V), 0.9999) << "position " << t;
        EXPECT_EQ(argmax(l.data(), V), argmax(r, V)) << "position " << t;
    }
    for (int64_t cut : {1, 20, 63}) {  // two chunks
        s->clear();
        s->eval(f.tokens.data(), cut, nullptr);
        s->eval(f.tokens.data() + cut, n - cut, l.data());
        EXPECT_GE(cosine_similarity(l.data(), f.ref.data() + (n - 1) * V, V), 0.9999) << "cut at " << cut;
    }
}

TEST_P(Qwen35, GreedyContinuationIsTransformers) {
    Fixture f = load(GetParam());
    ThreadPool pool(2);
    auto s = make_cpu_session(*f.model, 128, pool);
    std::vector<float> l(static_cast<size_t>(f.model->config().n_vocab));
    s->eval(f.tokens.data(), static_cast<int64_t>(f.tokens.size()), l.data());
    std::vector<int32_t> got{static_cast<int32_t>(argmax(l.data(), static_cast<int64_t>(l.size())))};
    while (got.size() < f.greedy.size()) got.push_back(s->eval_greedy(got.back()));
    EXPECT_EQ(got, f.greedy);
}

TEST_P(Qwen35, TruncateRecomputesTheState) {
    Fixture f = load(GetParam());
    const int64_t n = static_cast<int64_t>(f.tokens.size()), V = f.model->config().n_vocab;
    ThreadPool pool(2);
    auto s = make_cpu_session(*f.model, 128, pool);
    std::vector<float> l(static_cast<size_t>(V));
    s->eval(f.tokens.data(), n, nullptr);
    s->truncate(30);  // keep the first 30 positions, as chat does with a shared prefix
    EXPECT_EQ(s->size(), 30);
    s->eval(f.tokens.data() + 30, n - 30, l.data());
    EXPECT_GE(cosine_similarity(l.data(), f.ref.data() + (n - 1) * V, V), 0.9999);
    EXPECT_EQ(argmax(l.data(), V), argmax(f.ref.data() + (n - 1) * V, V));
}

// Released checkpoints are the multimodal wrapper: model_type qwen3_5 with
// the text model's keys in text_config, its weights under
// model.language_model., a vision tower (model.visual.*) and the MTP head
// (mtp.*) beside it. The text model loads from it as from the text-only folder.
class Qwen35Wrapper : public hf_test::HfCheckpointCopy {};

TEST_F(Qwen35Wrapper, LoadsTheTextModelOfTheMultimodalCheckpoint) {
    const fs::path d = copy("qwen3_5", "fp32");
    nlohmann::json cfg;
    std::ifstream(d / "config.json") >> cfg;
    const nlohmann::json wrapper = {{"model_type", "qwen3_5"},
                                    {"architectures", {"Qwen3_5ForConditionalGeneration"}},
                                    {"tie_word_embeddings", false},
                                    {"vision_config", {{"depth", 1}}},
                                    {"text_config", cfg}};
    std::ofstream(d / "config.json") << wrapper.dump(1);
    hf_test::StFile st = hf_test::read_st(d / "model.safetensors");
    nlohmann::ordered_json h;
    for (auto& [name, info] : st.header.items())
        h[name.rfind("model.", 0) == 0 ? "model.language_model." + name.substr(6) : name] = info;
    const size_t end = st.data.size();
    for (const char* extra : {"model.visual.patch_embed.proj.weight"}) {  // (the fixture has its mtp.* head)
        h[extra] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {st.data.size(), st.data.size() + 8}}};
        st.data.append(8, '\0');
    }
    ASSERT_GT(st.data.size(), end);
    st.header = h;
    hf_test::write_st(d / "model.safetensors", st);

    auto wrapped = load_hf_model(d.string());
    auto plain = load_hf_model(kDir + "qwen3_5/fp32");
    ThreadPool pool(1);
    const std::vector<int32_t> toks{5, 17, 200, 3, 99};
    const auto V = static_cast<size_t>(plain->config().n_vocab);
    std::vector<float> a(V), b(V);
    KvCache ca = wrapped->make_cache(8);
    KvCache cb = plain->make_cache(8);
    wrapped->forward(toks.data(), 5, ca, a.data(), false, pool);
    plain->forward(toks.data(), 5, cb, b.data(), false, pool);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), V * sizeof(float)));
}

// llama.cpp's converter writes the recurrent-layer mask beside the interval;
// the mask decides (a mask that disagrees with the tensors is refused naming
// the tensor), and one of the wrong length is refused naming the key.
TEST(Qwen35Gguf, TheRecurrentLayerMaskDecides) {
    const GgufFile src(kDir + "qwen3_5/llamacpp-fp32.gguf");
    const auto rewrite = [&](const std::vector<bool>& mask) {
        GgufWriter w;
        for (const GgufKV& kv : src.metadata())
            if (kv.key == "qwen35.attention.recurrent_layers")
                w.set_bool_array(kv.key, mask);
            else if (kv.key != "general.alignment")
                w.set(kv.key, kv.value);
        for (const GgufTensorInfo& t : src.tensors()) w.add_tensor(t.name, t.type, t.ne, t.n_dims, src.data(t));
        const fs::path out = fs::temp_directory_path() / "quern_qwen35_mask.gguf";
        w.write(out.string());
        std::string err;
        try {
            Model::from_gguf(std::make_shared<GgufFile>(out.string()));
        } catch (const Error& e) {
            err = e.what();
        }
        fs::remove(out);
        return err;
    };
    // Four trunk layers and the NextN block (full attention).
    EXPECT_EQ(rewrite({true, true, true, false, false}), "");
    const std::string swapped = rewrite({false, true, true, true, false});  // the interval alone: layer 3 is full
    EXPECT_NE(swapped.find("blk.0."), std::string::npos) << swapped;
    const std::string short_mask = rewrite({true, true, true, false});
    EXPECT_NE(short_mask.find("recurrent_layers has 4 entries for 5 blocks"), std::string::npos) << short_mask;
}

// The serving engine: each sequence's recurrent state in its slot, snapshots
// of it at block boundaries for the prefix cache. 32 requests of mixed lengths,
// some sharing a prompt start, in steps of a small token budget over a KV
// pool too small for all of them (preemption recomputes a sequence) give
// exactly the tokens each gives alone, with and without the prefix cache and
// with speculative rounds.
TEST_P(Qwen35, ServingGivesEachRequestItsOwnTokens) {
    Fixture f = load(GetParam());
    std::string tag = GetParam();
    std::replace(tag.begin(), tag.end(), '/', '_');
    const fs::path tj = fs::temp_directory_path() / ("quern_qwen35_tok_" + tag + ".json");
    std::ofstream(tj) << hf_test::byte_tokenizer_json();
    auto tok = Tokenizer::from_file(tj.string());
    fs::remove(tj);
    constexpr int kRequests = 32;
    const auto run = [&](Engine& e, int n) { return hf_test::run_mixed_requests(e, f.tokens, n); };
    EngineOptions o;
    o.n_ctx = 64;
    o.n_parallel = 1;
    o.n_threads = 2;
    std::vector<std::vector<int32_t>> alone;
    {
        auto e = make_engine(*f.model, *tok, o);  // one sequence at a time
        alone = run(*e, kRequests);
    }
    o.n_parallel = 8;
    o.token_budget = 9;
    o.kv_tokens = 64;  // 4 blocks for 8 sequences of up to 54 positions: preemption
    auto e = make_engine(*f.model, *tok, o);
    const auto together = run(*e, kRequests);
    for (int i = 0; i < kRequests; ++i) EXPECT_EQ(together[static_cast<size_t>(i)], alone[static_cast<size_t>(i)]) << "request " << i;
    EXPECT_GT(e->stats().preemptions, 0);
    // Requests sharing a prompt start resume from a snapshot of the state
    // at a block boundary of it.
    EXPECT_GT(e->stats().prompt_tokens_cached, 0);
    // Without the prefix cache, the same tokens again.
    o.prefix_cache = false;
    auto cold = make_engine(*f.model, *tok, o);
    const auto recomputed = run(*cold, kRequests);
    for (int i = 0; i < kRequests; ++i) EXPECT_EQ(recomputed[static_cast<size_t>(i)], alone[static_cast<size_t>(i)]) << "request " << i;
    EXPECT_EQ(cold->stats().prompt_tokens_cached, 0);
    // Fewer state snapshots (--state-snapshots): the same tokens; none: no
    // prefix resumes (a recurrent model needs the state after the prefix).
    o.prefix_cache = true;
    for (int snaps : {1, 0}) {
        o.state_snapshots = snaps;
        auto few = make_engine(*f.model, *tok, o);
        const auto got = run(*few, kRequests);
        for (int i = 0; i < kRequests; ++i)
            EXPECT_EQ(got[static_cast<size_t>(i)], alone[static_cast<size_t>(i)]) << "request " << i << ", " << snaps;
        if (snaps == 0) EXPECT_EQ(few->stats().prompt_tokens_cached, 0);
    }
    o.state_snapshots = -1;
    // Speculative rounds (the NextN head drafting 1 or 3 per round; the state
    // rolled back past rejected drafts), with preemption and the prefix
    // cache: the same tokens.
    o.prefix_cache = true;
    for (int k : {1, 3}) {
        o.spec_draft = k;
        auto spec = make_engine(*f.model, *tok, o);
        const auto drafted = run(*spec, kRequests);
        for (int i = 0; i < kRequests; ++i)
            EXPECT_EQ(drafted[static_cast<size_t>(i)], alone[static_cast<size_t>(i)]) << "request " << i << ", k = " << k;
        const EngineStats st = spec->stats();
        EXPECT_GT(st.spec_drafted, 0) << "k = " << k;
        EXPECT_GT(st.spec_accepted, 0) << "k = " << k << ": the fixture's head is distilled, some drafts are right";
        EXPECT_LT(st.spec_accepted, st.spec_drafted) << "k = " << k;
        EXPECT_GT(st.preemptions, 0) << "k = " << k;
        std::printf("%s serving, k = %d: %lld of %lld drafts kept, %lld steps (plain: %lld)\n", GetParam().c_str(), k,
                    static_cast<long long>(st.spec_accepted), static_cast<long long>(st.spec_drafted),
                    static_cast<long long>(st.steps), static_cast<long long>(e->stats().steps));
    }
}

// Malformed configs fail at load with the key and what is wrong.
TEST_F(Qwen35Wrapper, MalformedConfigsAreRefusedByName) {
    const auto with = [&](const std::string& tag, const std::function<void(nlohmann::json&)>& change) {
        const fs::path d = copy("qwen3_5", "fp32", tag);
        nlohmann::json cfg;
        std::ifstream(d / "config.json") >> cfg;
        change(cfg);
        std::ofstream(d / "config.json") << cfg.dump(1);
        return load_error(d);
    };
    EXPECT_NE(with("a", [](nlohmann::json& c) { c["layer_types"] = {"linear_attention", "full_attention"}; })
                  .find("must list 4 layer types"),
              std::string::npos);
    EXPECT_NE(with("b", [](nlohmann::json& c) { c["layer_types"][1] = "sliding_attention"; }).find("layer type"),
              std::string::npos);
    EXPECT_NE(with("c", [](nlohmann::json& c) { c["linear_num_value_heads"] = 3; }).find("value heads"),
              std::string::npos);
    EXPECT_NE(with("d", [](nlohmann::json& c) { c["hidden_act"] = "gelu"; }).find("hidden_act"), std::string::npos);
    // A conv1d of the wrong kernel size: the tensor and both shapes are named.
    const std::string e = with("e", [](nlohmann::json& c) { c["linear_conv_kernel_dim"] = 3; });
    EXPECT_NE(e.find("linear_attn.conv1d.weight"), std::string::npos) << e;
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, Qwen35,
                         ::testing::Values("qwen3_5", "qwen3_5_moe", "qwen3_5/gguf", "qwen3_5_moe/gguf"),
                         [](const auto& info) {
                             std::string n = info.param;
                             std::replace(n.begin(), n.end(), '/', '_');
                             return n;
                         });

}  // namespace
}  // namespace quern
