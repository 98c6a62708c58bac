// Qwen3.5's multi-token-prediction (NextN) head: its draft program against
// the reference tools/make_hf_golden.py computes (transformers' decoder
// layer and RMSNorm with the head's weights, float64) at every position of
// the 64-token prompt, from the Hugging Face folder and from llama.cpp's GGUF
// of the same weights.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/program_runner.h"
#include "formats/gguf.h"
#include "hf_test_util.h"
#include "model/hf_model.h"
#include "runtime/session.h"
#include "runtime/speculative.h"
#include "runtime/verify.h"

namespace quern {
namespace {

using hf_test::argmax;
using hf_test::kDir;
namespace fs = std::filesystem;

std::unique_ptr<Model> load(const std::string& param) {
    const bool gguf = param.ends_with("/gguf");
    const std::string arch = gguf ? param.substr(0, param.size() - 5) : param;
    return gguf ? Model::from_gguf(std::make_shared<GgufFile>(kDir + arch + "/llamacpp-fp32.gguf"))
                : load_hf_model(kDir + arch + "/fp32");
}

class MtpHead : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpHead, DraftLogitsMatchTheReferenceAtEveryPosition) {
    const std::string arch = GetParam().substr(0, GetParam().find('/'));
    std::ifstream in(kDir + arch + "/golden.json");
    const nlohmann::json meta = nlohmann::json::parse(in);
    const auto tokens = meta["tokens"].get<std::vector<int32_t>>();
    const std::vector<float> ref = hf_test::read_logits(kDir + arch + "/" + meta["mtp"]["logits_file"].get<std::string>());
    auto model = load(GetParam());
    ASSERT_EQ(model->config().n_nextn, 1);
    const Program* draft = model->draft_program();
    ASSERT_NE(draft, nullptr);
    const int64_t n = static_cast<int64_t>(tokens.size()), V = model->config().n_vocab, E = model->config().n_embd;
    ASSERT_EQ(static_cast<int64_t>(ref.size()), (n - 1) * V);

    ThreadPool pool(2);
    // The trunk's hidden rows (after the output norm) of every position.
    cpu::ProgramRunner trunk(model->program());
    KvCache tc = model->make_cache(n);
    std::vector<float> logits(static_cast<size_t>(V)), hidden(static_cast<size_t>(n * E));
    trunk.forward(tokens.data(), n, tc, logits.data(), false, pool, nullptr, hidden.data());
    // The head at positions 0 .. n-2: token p+1 with hidden row p.
    cpu::ProgramRunner head(*draft);
    KvCache hc(draft->n_kv_layers, n, draft->kv_dim, 0);
    std::vector<float> out(static_cast<size_t>((n - 1) * V));
    head.forward(tokens.data() + 1, n - 1, hc, out.data(), true, pool, hidden.data());
    double worst = 1.0;
    for (int64_t p = 0; p < n - 1; ++p) {
        const float* a = out.data() + p * V;
        const float* r = ref.data() + p * V;
        const double cs = cosine_similarity(a, r, V);
        worst = std::min(worst, cs);
        EXPECT_GE(cs, 0.9999) << "position " << p;
        EXPECT_EQ(argmax(a, V), argmax(r, V)) << "position " << p;
    }
    std::printf("%s MTP head: %lld positions, worst cosine 1 - %.2e\n", GetParam().c_str(),
                static_cast<long long>(n - 1), 1.0 - worst);
}

/// Greedy continuation of `prompt` by n tokens, without drafts.
std::vector<int32_t> plain_greedy(Model& m, const std::vector<int32_t>& prompt, int n, ThreadPool& pool) {
    auto s = make_cpu_session(m, 128, pool);
    std::vector<float> l(static_cast<size_t>(m.config().n_vocab));
    s->eval(prompt.data(), static_cast<int64_t>(prompt.size()), l.data());
    std::vector<int32_t> out{static_cast<int32_t>(argmax(l.data(), static_cast<int64_t>(l.size())))};
    while (static_cast<int>(out.size()) < n) out.push_back(s->eval_greedy(out.back()));
    return out;
}

/// The same with the NextN head drafting k per round.
std::vector<int32_t> spec_greedy(Model& m, const std::vector<int32_t>& prompt, int n, int k, ThreadPool& pool,
                                 SpecStats* stats = nullptr, int64_t n_ctx = 128) {
    auto s = make_cpu_session(m, n_ctx, pool);
    Speculator sp(*s, make_mtp_drafter(make_cpu_draft_session(m, n_ctx, pool)), k, 1);
    SamplingParams p;
    p.temperature = 0;
    Sampler sampler(p, m.config().n_vocab);
    std::vector<float> l(static_cast<size_t>(m.config().n_vocab));
    sp.eval(prompt.data(), static_cast<int64_t>(prompt.size()), l.data());
    std::vector<int32_t> out{sampler.sample(l.data())};
    sampler.accept(out.back());
    while (static_cast<int>(out.size()) < n) {
        std::vector<int32_t> got;
        sp.step(out.back(), sampler, got);
        EXPECT_GE(got.size(), 1u);
        EXPECT_LE(got.size(), static_cast<size_t>(k + 1));
        for (int32_t t : got) {
            sampler.accept(t);
            out.push_back(t);
        }
    }
    out.resize(static_cast<size_t>(n));
    if (stats) *stats = sp.stats();
    return out;
}

// Greedy output is the model's own whatever the drafts: every k, the dense
// and the MoE model, from either file.
TEST_P(MtpHead, GreedySpeculativeDecodingGivesTheSameTokens) {
    auto model = load(GetParam());
    ThreadPool pool(2);
    const std::vector<int32_t> prompt{3, 141, 59, 26, 5, 35, 89, 79, 32, 38, 46, 26};
    const auto want = plain_greedy(*model, prompt, 40, pool);
    for (int k : {1, 2, 4}) {
        SpecStats st;
        EXPECT_EQ(spec_greedy(*model, prompt, 40, k, pool, &st), want) << "k = " << k;
        EXPECT_GT(st.rounds, 0);
        EXPECT_GT(st.accepted, 0) << "the fixture's head is distilled from the trunk: some drafts are right";
        EXPECT_EQ(st.drafted, st.rounds * k);  // room for every round's drafts in 128 positions
        std::printf("%s k=%d: %lld of %lld drafts kept (%.0f%%), %.2f tokens per pass\n", GetParam().c_str(), k,
                    static_cast<long long>(st.accepted), static_cast<long long>(st.drafted), 100 * st.acceptance(),
                    static_cast<double>(st.emitted) / static_cast<double>(st.rounds));
    }
}

// The head drafting the model's own greedy continuation is always right:
// a sequence the model generated, replayed as the prompt's continuation,
// keeps every draft when the head happens to agree and none when it does
// not — both paths run in the test above; here the end of the context
// bounds the drafts and the output still matches.
TEST_P(MtpHead, DraftsShrinkAtTheEndOfTheContext) {
    auto model = load(GetParam());
    ThreadPool pool(2);
    const std::vector<int32_t> prompt{7, 8, 9, 10, 11};
    const auto want = plain_greedy(*model, prompt, 27, pool);
    SpecStats st;
    // 5 + 27 - 1 = 31 positions filled at the end of a 32-position context.
    EXPECT_EQ(spec_greedy(*model, prompt, 27, 4, pool, &st, 32), want);
    EXPECT_LT(st.drafted, st.rounds * 4);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, MtpHead,
                         ::testing::Values("qwen3_5", "qwen3_5_moe", "qwen3_5/gguf", "qwen3_5_moe/gguf"),
                         [](const auto& info) {
                             std::string s = info.param;
                             std::replace(s.begin(), s.end(), '/', '_');
                             return s;
                         });

// A config that declares the head with a file saved without it (as
// transformers' save_pretrained writes one) loads without drafts.
class MtpHeadAbsent : public hf_test::HfCheckpointCopy {};

TEST_F(MtpHeadAbsent, ADeclaredButMissingHeadIsNoHead) {
    const auto d = copy("qwen3_5", "fp32");
    hf_test::StFile st = hf_test::read_st(d / "model.safetensors");
    nlohmann::ordered_json h;
    int moved = 0;  // out of the way under a name the loader ignores (the bytes stay covered)
    for (auto& [name, info] : st.header.items()) {
        const bool mtp = name.starts_with("mtp.");
        h[mtp ? "model.visual." + name : name] = info;
        moved += mtp;
    }
    ASSERT_GT(moved, 0);
    st.header = h;
    hf_test::write_st(d / "model.safetensors", st);
    auto model = load_hf_model(d.string());
    EXPECT_EQ(model->config().n_nextn, 0);
    EXPECT_EQ(model->draft_program(), nullptr);
    EXPECT_NE(load_hf_model(kDir + "qwen3_5/fp32")->draft_program(), nullptr);
}

// quern run --spec mtp: the same greedy text; a model without a head is
// refused with what to do.
TEST_F(MtpHeadAbsent, QuernRunSpecMtpGivesTheSameText) {
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    if (!fs::exists(quern)) GTEST_SKIP() << quern << " is not built";
    const auto d = copy("qwen3_5", "fp32");
    std::ofstream(d / "tokenizer.json") << hf_test::byte_tokenizer_json();
    const fs::path out = dir_ / "out.txt", err = dir_ / "err.txt";
    auto run = [&](const std::string& model, const std::string& flags, int want_rc) {
        const std::string cmd = "'" + quern + "' run -m '" + model + "' -p 'hello there' -n 24 --temp 0 --ignore-eos -t 2 " +
                                flags + " >'" + out.string() + "' 2>'" + err.string() + "'";
        const int rc = std::system(cmd.c_str());
        std::ifstream e(err);
        const std::string text((std::istreambuf_iterator<char>(e)), {});
        EXPECT_EQ(rc != 0, want_rc != 0) << cmd << "\n" << text;
        std::ifstream o(out);
        return std::pair{std::string((std::istreambuf_iterator<char>(o)), {}), text};
    };
    const auto plain = run(d.string(), "", 0);
    ASSERT_FALSE(plain.first.empty());
    for (const char* k : {"--spec-draft 1", "--spec-draft 3"}) {
        const auto spec = run(d.string(), std::string("--spec mtp ") + k, 0);
        EXPECT_EQ(spec.first, plain.first) << k;
        EXPECT_NE(spec.second.find("speculative decoding mtp"), std::string::npos) << spec.second;
    }
    const auto headless = copy("qwen3_5", "bf16", "headless");  // saved without the head
    std::ofstream(headless / "tokenizer.json") << hf_test::byte_tokenizer_json();
    const auto none = run(headless.string(), "--spec mtp", 1);
    EXPECT_NE(none.second.find("no multi-token-prediction head"), std::string::npos) << none.second;
}

}  // namespace
}  // namespace quern
