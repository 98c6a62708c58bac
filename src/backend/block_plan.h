// A layer program recognised as the shape the GPU backend's fused kernels
// compute: an embedding (optionally scaled), a stack of pre-norm decoder
// blocks, and an output head. Each block is
//
//   h = RMSNorm(x); a = Linear_o(Mixer(h)); [a = RMSNorm(a)]; [a = s·a]; x = x + a
//   h = RMSNorm(x); f = Linear_down(Glu(Linear_gate|up(h))) or Moe(h) [+ SharedExpert(h)];
//                   [f = RMSNorm(f)]; [f = s·f]; x = x + f
//
// where the mixer is attention, Attention(Linear_qkv(h)) [· sigmoid(Linear_gate(h))]
// (an output gate), or Gated DeltaNet, Gate(RMSNorm_groups(DeltaNet(Linear_qkv(h),
// Linear_b|a(h))), Linear_z(h), SiLU); and the shared expert, beside routed
// experts, Gate(Linear_down(Glu(Linear_gate|up(h))), Linear_1(h), Sigmoid).
//
// and the head RMSNorm → Linear → [Scale] → [Softcap] on the selected rows. A
// draft head's program opens with a NextN prologue instead of the bare
// embedding: Linear_eh(Concat(RMSNorm(embed), RMSNorm(Input))). Which
// kernels run it — a norm folded into the next GEMV's activation, a GEMV
// adding its output into the residual stream and leaving the next norm's
// activation, Q|K|V and gate|up read in one launch, RoPE + KV write +
// attention in one kernel — is decided from the ops' properties (weight
// types, post-norms, expert layers), never from an architecture's name. A
// program of another shape is refused with the first op that does not fit.
#pragma once
#include <string>
#include <vector>

#include "backend/program.h"

namespace quern {

struct BlockPlanLayer {
    const Tensor* attn_norm = nullptr;
    std::vector<LinearPiece> qkv;        ///< Q|K|V rows in output order; biases on all or none
                                         ///< (DeltaNet: its [q | k | v] projection)
    const AttentionSpec* attn = nullptr; ///< null in a DeltaNet layer
    std::vector<LinearPiece> attn_gate;  ///< attention output gate rows (sigmoid), q_dim in all; or empty
    // A Gated DeltaNet layer (attn null): the spec, the output gate z
    // (value_dim rows), the [b | a] projection (2·n_v_heads rows), the
    // per-value-head RMSNorm (head_v floats); wo is its output projection.
    const DeltaNetSpec* delta = nullptr;
    const Tensor* delta_z = nullptr;
    std::vector<LinearPiece> delta_ba;
    const Tensor* delta_norm = nullptr;
    const Tensor* wo = nullptr;
    const Tensor* post_attn_norm = nullptr;  ///< or null
    float attn_out_scale = 1.0f;             ///< the attention branch's factor before its residual add
    const Tensor* ffn_norm = nullptr;
    std::vector<LinearPiece> gate_up;    ///< dense FFN: gate rows then up rows (no biases)
    const Tensor* down = nullptr;        ///< dense FFN
    GluAct act = GluAct::SiLU;           ///< dense FFN, or the experts' (moe->act)
    const MoeSpec* moe = nullptr;        ///< expert FFN instead of gate_up/down
    // A shared expert beside the routed ones (moe): gate|up, down, and its
    // per-token gate (one row of n_embd: out += sigmoid(h·w) · expert(h)).
    std::vector<LinearPiece> shexp_gate_up;
    const Tensor* shexp_down = nullptr;
    const Tensor* shexp_gate = nullptr;
    const Tensor* post_ffn_norm = nullptr;   ///< or null
    float ffn_out_scale = 1.0f;              ///< the FFN branch's factor before its residual add
    std::string trace;                   ///< the name the program traces the residual stream under, or ""
    bool qkv_bias() const { return qkv.front().bias != nullptr; }
    bool shared_expert() const { return shexp_down != nullptr; }
};

struct BlockPlan {
    const Tensor* embd = nullptr;
    float embd_scale = 0.0f;  ///< 0: not scaled
    // A NextN (multi-token-prediction) draft head's program (ArchDef::
    // build_draft) opens with x = eh_proj · [RMSNorm(embed) | RMSNorm(hidden
    // row given with the pass)] before its decoder block; null otherwise.
    const Tensor* nextn_enorm = nullptr;
    const Tensor* nextn_hnorm = nullptr;
    const Tensor* nextn_eh_proj = nullptr;  ///< 2·n_embd → n_embd
    bool draft() const { return nextn_eh_proj != nullptr; }
    std::vector<BlockPlanLayer> layers;
    const Tensor* out_norm = nullptr;
    const Tensor* output = nullptr;
    float logit_scale = 1.0f;    ///< logits × this before the soft-cap
    float final_softcap = 0.0f;  ///< 0: none
    std::string logits_trace;    ///< "" when the program does not trace its logits

    // Shapes every layer shares (the plan refuses programs whose layers differ).
    int64_t n_vocab = 0, n_embd = 0, n_layer = 0;
    int64_t n_kv_layers = 0;                      ///< attention layers (KV-cache layers 0 .. n_kv_layers − 1)
    int64_t n_head = 0, n_head_kv = 0, head_dim = 0;  ///< of the attention layers
    int64_t n_ff = 0;                             ///< dense layers' FFN width (0: none)
    int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;  ///< expert layers' (0: none)
    float rms_eps = 0.0f;         ///< of every RMSNorm of the blocks and the head
    bool post_norms = false;      ///< some block normalizes a branch's output
    bool branch_scales = false;   ///< some block scales a branch's output
    bool moe = false;             ///< some block has an expert FFN
    int64_t n_ff_shexp = 0;       ///< the shared experts' FFN width (0: none)
    bool gates = false;           ///< some attention output is gated
    // DeltaNet layers (the first one's spec: the plan refuses layers that differ).
    const DeltaNetSpec* delta = nullptr;
    bool hybrid() const { return delta != nullptr; }
    int64_t q_dim() const { return n_head * head_dim; }
    int64_t kv_dim() const { return n_head_kv * head_dim; }
};

/// Recognises `p` (which must outlive the plan). quern::Error naming the
/// first op that does not fit the shape above, or shapes that differ from
/// layer to layer.
BlockPlan plan_blocks(const Program& p);

/// The first thing the CUDA backend does not compute in `p`, in words ("a
/// program that is not a stack of pre-norm decoder blocks: ...", "attention
/// heads of 80 elements", "an attention output bias", ...), or "" when it
/// runs it. Covers the program's shape, the head size (32, 64, 96, 128, 256),
/// the GQA ratio (<= 16), dimensions divisible by 32 and, for expert layers,
/// at most 1024 experts with 1 to 16 used per token; not the weight types.
/// Compiled in every build.
std::string cuda_unsupported(const Program& p);

}  // namespace quern
