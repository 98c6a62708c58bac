// The layer program (backend/program.h) and its block plan
// (backend/block_plan.h): the builder's shape checks, the programs every
// architecture writes, and which of them the CUDA backend takes.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "backend/block_plan.h"
#include "backend/program.h"
#include "core/error.h"
#include "model/hf_model.h"
#include "model/model.h"
#include "model/synth.h"

namespace quern {
namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(Program, BuilderRefusesMisshapenOpsNamingTheTensor) {
    std::vector<float> emb(16 * 8), w(8 * 4), norm(4, 1.0f);
    const Tensor te = Tensor::contiguous(DType::F32, {8, 16, 1, 1}, emb.data(), "token_embd.weight");
    const Tensor tw = Tensor::contiguous(DType::F32, {8, 4, 1, 1}, w.data(), "blk.0.attn_q.weight");
    const Tensor tn = Tensor::contiguous(DType::F32, {4, 1, 1, 1}, norm.data(), "blk.0.attn_norm.weight");
    ProgramBuilder b(16, 1, 8);
    const Value x = b.embed(te);
    EXPECT_EQ(b.linear(x, tw).id, 1);
    // A norm of width 4 over a value of width 8.
    EXPECT_NE(error_of([&] { b.rms_norm(x, tn, 1e-5f); }).find("blk.0.attn_norm.weight"), std::string::npos);
    // A matrix whose rows do not match its input.
    const Value y = b.linear(x, tw);
    EXPECT_NE(error_of([&] { b.linear(y, tw); }).find("'blk.0.attn_q.weight' has rows of 8"), std::string::npos);
    // Attention over a value that is not q|k|v.
    AttentionSpec s;
    s.n_head = 2, s.n_head_kv = 1, s.head_dim = 4, s.scale = 0.5f;
    EXPECT_NE(error_of([&] { b.attention(y, s); }).find("expected q|k|v"), std::string::npos);
    // The output must be the selected rows' logits.
    EXPECT_NE(error_of([&] { b.finish(x); }).find("logits"), std::string::npos);
    // Equal constant tables share one copy.
    EXPECT_EQ(b.constant({1.0f, 2.0f}), b.constant({1.0f, 2.0f}));
    EXPECT_NE(b.constant({1.0f, 2.0f}), b.constant({1.0f, 3.0f}));
}

// Every synthetic preset: its program is a stack of decoder blocks the GPU
// takes, one per layer, with the expected ops; gpt-oss's sinks and biased
// experts are refused by name (the CPU runs it) until the GPU has them.
TEST(Program, EveryPresetLowersToDecoderBlocks) {
    for (const SynthPreset& full : synth_presets()) {
        const SynthPreset p = synth_tiny(full);
        SynthModel sm = make_synthetic(p, "Q8_0", 2);
        auto m = Model::from_weights(sm.cfg, std::move(sm.weights));
        const Program& prog = m->program();
        if (p.cfg.arch == "gpt-oss") {
            EXPECT_EQ(cuda_unsupported(prog), "attention sinks (gpt-oss)");
            EXPECT_THROW(plan_blocks(prog), Error);
            continue;
        }
        EXPECT_EQ(cuda_unsupported(prog), "") << p.name;
        const BlockPlan plan = plan_blocks(prog);
        if (p.cfg.has_recurrent_state()) {  // DeltaNet layers and gated attention (Qwen3.5)
            int64_t full = 0;
            for (int64_t il = 0; il < p.cfg.n_layer; ++il) full += !p.cfg.recurrent(il);
            EXPECT_TRUE(plan.hybrid()) << p.name;
            EXPECT_TRUE(plan.gates) << p.name;
            EXPECT_EQ(plan.n_kv_layers, full) << p.name;
            EXPECT_EQ(plan.n_layer, p.cfg.n_layer) << p.name;
            EXPECT_EQ(plan.n_ff_shexp > 0, p.cfg.moe()) << p.name;
            continue;
        }
        EXPECT_EQ(plan.n_layer, p.cfg.n_layer) << p.name;
        EXPECT_EQ(plan.moe, p.cfg.moe()) << p.name;
        EXPECT_EQ(plan.post_norms, p.cfg.arch == "gemma2" || p.cfg.arch == "gemma3") << p.name;
        EXPECT_EQ(plan.final_softcap, p.cfg.final_softcap) << p.name;
        EXPECT_EQ(plan.layers.back().trace, "blk." + std::to_string(p.cfg.n_layer - 1)) << p.name;
        const std::string d = prog.describe();
        EXPECT_NE(d.find("blk.0 attention"), std::string::npos) << d;
        EXPECT_NE(d.find("select_rows"), std::string::npos) << d;
    }
}

// A Qwen3.5 preset's NextN draft head (its own program: the prologue
// eh_proj · [RMSNorm(embed) | RMSNorm(given row)], one attention block, the
// shared head) is recognised with its three prologue tensors, and the GPU
// runs it.
TEST(Program, DraftHeadPlansWithItsNextnPrologue) {
    for (const char* name : {"qwen3.5-27b", "qwen3.5-35b-a3b"}) {
        SynthModel sm = make_synthetic(synth_tiny(synth_preset(name)), "Q8_0", 3);
        auto m = Model::from_weights(sm.cfg, std::move(sm.weights));
        ASSERT_NE(m->draft_program(), nullptr) << name;
        const BlockPlan trunk = plan_blocks(m->program()), head = plan_blocks(*m->draft_program());
        EXPECT_FALSE(trunk.draft()) << name;
        ASSERT_TRUE(head.draft()) << name;
        const std::string L = std::to_string(sm.cfg.n_layer);
        EXPECT_EQ(head.nextn_enorm->name, "blk." + L + ".nextn.enorm.weight") << name;
        EXPECT_EQ(head.nextn_hnorm->name, "blk." + L + ".nextn.hnorm.weight") << name;
        EXPECT_EQ(head.nextn_eh_proj->name, "blk." + L + ".nextn.eh_proj.weight") << name;
        EXPECT_EQ(head.n_layer, 1) << name;
        EXPECT_EQ(head.n_kv_layers, 1) << name;
        EXPECT_FALSE(head.hybrid()) << name;
        EXPECT_EQ(head.n_embd, trunk.n_embd) << name;
        EXPECT_EQ(cuda_unsupported(*m->draft_program()), "") << name;
    }
}

// The Hugging Face test checkpoints, LongRoPE ones included, lower too; a
// program of another shape is refused by name.
TEST(Program, CheckpointsLowerAndOtherShapesAreRefused) {
    namespace fs = std::filesystem;
    for (const char* dir : {"llama/fp32", "phi3_longrope/fp32", "gemma3/fp32", "qwen3_moe/fp32", "granite/fp32", "qwen3_5/fp32",
                            "qwen3_5_moe/fp32"}) {
        auto m = load_hf_model((fs::path(QUERN_SOURCE_DIR) / "tests/data/hf_gpu" / dir).string());
        EXPECT_EQ(cuda_unsupported(m->program()), "") << dir;
    }
    std::vector<float> emb(16 * 8), norm(8, 1.0f);
    const Tensor te = Tensor::contiguous(DType::F32, {8, 16, 1, 1}, emb.data(), "token_embd.weight");
    const Tensor tn = Tensor::contiguous(DType::F32, {8, 1, 1, 1}, norm.data(), "output_norm.weight");
    ProgramBuilder b(16, 1, 8);
    const Value x = b.embed(te);
    const Program p = b.finish(b.linear(b.rms_norm(b.select_rows(b.scale(b.scale(x, 2.0f), 2.0f)), tn, 1e-5f), te));
    EXPECT_NE(cuda_unsupported(p).find("not a stack of pre-norm decoder blocks"), std::string::npos)
        << cuda_unsupported(p);
}

}  // namespace
}  // namespace quern
