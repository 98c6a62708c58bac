// The layer program: what an architecture's builder writes once and every
// backend runs. A program is a static list of block-level ops over SSA
// values; each value is rows × width floats, one row per token of a forward
// pass (the row count is the pass's, the widths are fixed). The CPU
// interprets it op by op (backend/cpu/program_runner.h); the CUDA backend
// lowers it to fused kernels by rules that know ops, never architectures.
//
// The ops are those of the decoder-only transformers quern runs: embed,
// rms_norm, linear (one weight or a group sharing an input: Q|K|V,
// gate|up), attention (RoPE, the KV-cache write and attention as one op, with
// q/k norms, window, soft-cap and scale), glu, moe (router, top-k, expert
// banks), add, scale, softcap; select_rows cuts the pass down to the rows
// whose logits are wanted, and trace names a value for --verify.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace quern {

/// Run-time choices of how a program is computed (not what it computes).
struct ModelOptions {
    /// Quantized matmuls see their activations split into an 8-bit part and an
    /// 8-bit residual (two-level quantization), keeping logits within cosine
    /// 0.9999 of a float reference. false: one 8-bit quantization, as llama.cpp
    /// does (faster prefill, cosine ~0.99 on small models).
    bool precise_activations = true;
    /// When > 0: a forward pass of at least this many rows rounds the
    /// activations of its F8_E4M3_B32 matrix products to FP8 E4M3 with one
    /// scale per row (round_fp8_activation_rows, quant/fp8.h), as the CUDA
    /// prefill with --gpu-weights fp8 computes them (FP8 × FP8 on the tensor
    /// cores); smaller passes keep float activations, as the GPU's decode
    /// step does. The reference for `run --verify --gpu-weights fp8`
    /// (Session::fp8_activation_rows). 0: never (the default).
    int64_t fp8_activation_rows = 0;
};

/// Called with a named intermediate tensor of the last position of a forward
/// pass (host floats): "blk.N" is the residual stream after layer N (n_embd
/// floats), "logits" the output (n_vocab floats). Used by --verify to find
/// the first layer where two backends diverge.
using TraceFn = std::function<void(const std::string& name, const float* data, int64_t n)>;

/// Called, when set, with the input rows of every matrix product a CPU
/// forward pass computes: `weight` (an expert bank's stacked tensor, with
/// the expert's index; else the matrix itself, with expert −1) and `rows`
/// rows of weight.ne[0] floats each. `quern imatrix` sums their squares.
using ActivationFn = std::function<void(const Tensor& weight, int64_t expert, const float* x, int64_t rows)>;

/// An SSA value of a program (an index into Program::values).
struct Value {
    int32_t id = -1;
    bool valid() const { return id >= 0; }
};

enum class OpKind : uint8_t {
    Embed,       ///< out[r] = dequantize(table row tokens[r])
    RmsNorm,     ///< out = in0 / sqrt(mean(in0²) + eps) · weight (Zhang & Sennrich 2019), per group of
                 ///< `group` elements when group > 0 (weight: group floats)
    Linear,      ///< out = in0 · [W_0 | W_1 | ...]ᵀ (+ bias_i): piece i's outputs at its offset
    Attention,   ///< in0 = [q | k | v]; out = causal GQA attention (AttentionSpec), keys/values cached
    Glu,         ///< in0 = [gate | up]; out = act(gate) · up
    Gate,        ///< out = in0 · act(in1) (an output gate: gated attention, a gated norm); in1 of width 1
                 ///< gates each row as a whole
    DeltaNet,    ///< in0 = [q | k | v] pre-convolution, in1 = [b | a]; out = gated delta rule (DeltaNetSpec)
    Moe,         ///< out = Σ_slots w · expert(in0) over the router's top-k (MoeSpec)
    Add,         ///< out = in0 + in1
    Scale,       ///< out = in0 · scalar
    Softcap,     ///< out = scalar · tanh(in0 / scalar)
    SelectRows,  ///< out = the rows of in0 whose logits the pass wants (the head runs on those)
    Input,       ///< out = the pass's given rows of `width` floats (a draft head's trunk hidden states)
    Concat,      ///< out = [in0 | in1] per row
    Trace,       ///< reports in0's last row under `name` (TraceFn); no output
};

/// The op kind's name as Program::describe prints it ("rms_norm", "linear", ...).
const char* kind_name(OpKind k);

/// The gate activation of a gated FFN.
enum class GluAct : uint8_t {
    SiLU,      ///< SwiGLU (Shazeer 2020): silu(g) · u
    GeluTanh,  ///< GeGLU with GELU's tanh approximation (transformers' gelu_pytorch_tanh)
    Sigmoid,   ///< Gate only: x · sigmoid(g)
    /// Experts only: gpt-oss's clamped SwiGLU (OpenAI's reference
    /// implementation; transformers' GptOssExperts): g = min(gate, limit),
    /// u = clamp(up, −limit, limit), out = g · sigmoid(α · g) · (u + 1), with
    /// α and limit from MoeSpec (1.702 and 7).
    SwiGluOai,
};

/// One matrix of a Linear op: w has ne = {K, N} (K the input width, N its
/// output rows); bias, when present, N floats (F32).
struct LinearPiece {
    const Tensor* w = nullptr;
    const Tensor* bias = nullptr;
};

/// Rotary position embedding (Su et al. 2021) of an attention op. Pair i of
/// the first `dim` elements of each head turns at p · base^(-2i/dim) /
/// factors[i] (null factors: all 1). neox: pairs (x[i], x[i + dim/2]) (HF's
/// rotate_half); else (x[2i], x[2i+1]) (llama.cpp's GGUF llama files).
/// LongRoPE (Phi-3 128k): a sequence whose last position in a forward pass is
/// >= long_from turns by long_factors for that whole pass instead.
struct RopeSpec {
    int dim = 0;
    float base = 10000.0f;
    bool neox = false;
    const float* factors = nullptr;       ///< dim/2 floats or null
    const float* long_factors = nullptr;  ///< dim/2 floats or null (no LongRoPE)
    int64_t long_from = 0;
};

/// Causal grouped-query self-attention over a KV cache (Ainslie et al. 2023).
/// Input [q | k | v] per row: n_head · head_dim, then n_head_kv · head_dim
/// twice. In order: q/k per-head RMSNorm (q_norm/k_norm, head_dim F32 each,
/// when present), RoPE, the row's k and v written to the cache of layer
/// `kv_layer` at the row's position, then softmax(scale · q·k (soft-capped)) ·
/// v over the positions the row sees (window > 0: the last `window`
/// positions, itself included), each head's sink logit (when present) joining
/// its softmax denominator.
struct AttentionSpec {
    int kv_layer = 0;
    int n_head = 0, n_head_kv = 0, head_dim = 0;
    float scale = 0.0f;    ///< applied to q·k
    float softcap = 0.0f;  ///< > 0: scores s become softcap · tanh(s / softcap)
    int64_t window = 0;    ///< 0: the whole causal prefix
    RopeSpec rope;
    const Tensor* q_norm = nullptr;
    const Tensor* k_norm = nullptr;
    float norm_eps = 0.0f;
    /// n_head F32 logits, one per query head, in each head's softmax
    /// denominator with no value (attention sinks: gpt-oss); null: none.
    const Tensor* sinks = nullptr;
    int64_t q_dim() const { return int64_t{n_head} * head_dim; }
    int64_t kv_dim() const { return int64_t{n_head_kv} * head_dim; }
};

/// One bank of an expert layer: n_expert matrices of ne = {K, N}, each its
/// own 2-D tensor (`experts`: views into `stacked` when the file stores the
/// bank as one 3-D tensor of ne = {K, N, n_expert}, else own tensors).
struct ExpertBank {
    const Tensor* stacked = nullptr;
    std::vector<const Tensor*> experts;
    /// Per-expert output biases: F32 of ne = {N, n_expert} (row x is expert
    /// x's N floats), or null.
    const Tensor* bias = nullptr;
};

/// A mixture-of-experts FFN (Shazeer et al. 2017; top-k routing): router logits
/// r = in0 · routerᵀ (+ router_bias), p = softmax(r), the n_used experts of
/// largest p (ties: lower index first), weights p_j (divided by their sum
/// when renormalize: the softmax of the chosen logits alone, as gpt-oss
/// computes it); out = Σ_j w_j · down_j(act(gate_j · x, up_j · x)), each
/// product plus its bank's bias row j when the bank has biases.
struct MoeSpec {
    const Tensor* router = nullptr;       ///< ne = {n_embd, n_expert}
    const Tensor* router_bias = nullptr;  ///< n_expert F32, or null
    ExpertBank gate, up, down;
    int n_expert = 0, n_used = 0;
    int64_t n_ff = 0;  ///< an expert's FFN width
    bool renormalize = true;
    GluAct act = GluAct::SiLU;
    float glu_alpha = 0.0f, glu_limit = 0.0f;  ///< act SwiGluOai's α and clamp limit
};

/// Gated DeltaNet linear attention (Yang et al. 2024, "Gated Delta Networks:
/// Improving Mamba2 with Delta Rule"; transformers' Qwen3_5GatedDeltaNet).
/// Per row, in order:
///   1. a causal depthwise conv1d of kernel `conv_kernel` over the row's
///      [q | k | v] (conv_dim = 2·n_k_heads·head_k + n_v_heads·head_v
///      channels) and the conv_kernel − 1 rows before it (the sequence's conv
///      state; zeros before position 0), then SiLU;
///   2. q and k of each key head L2-normalised (x · rsqrt(Σx² + 1e-6)), q
///      scaled by 1/sqrt(head_k);
///   3. per value head h (its key head: h / (n_v/n_k), or h % n_k with
///      kv_tiled, llama.cpp's GGUF order): β = sigmoid(b_h), decay
///      g = a_coef_h · softplus(a_h + dt_bias_h) (a_coef = −exp(A_log)), then
///      the state S_h (head_k × head_v) becomes S·exp(g); S += k ⊗ β(v − Sᵀk);
///      the output is Sᵀq (head_v floats).
/// The conv and delta-rule states are the sequence's recurrent state, slot
/// `state_layer` (DeltaNetSpec::state_floats() floats).
struct DeltaNetSpec {
    int state_layer = 0;
    int n_k_heads = 0, n_v_heads = 0, head_k = 0, head_v = 0, conv_kernel = 0;
    bool kv_tiled = false;
    const Tensor* conv = nullptr;     ///< ne = {conv_kernel, conv_dim}, F32 (channel c's taps, oldest first)
    const Tensor* a_coef = nullptr;   ///< n_v_heads F32: −exp(A_log)
    const Tensor* dt_bias = nullptr;  ///< n_v_heads F32
    int64_t key_dim() const { return int64_t{n_k_heads} * head_k; }
    int64_t value_dim() const { return int64_t{n_v_heads} * head_v; }
    int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
    int64_t state_floats() const {
        return (conv_kernel - 1) * conv_dim() + int64_t{n_v_heads} * head_k * head_v;
    }
};

struct Op {
    OpKind kind = OpKind::Embed;
    Value out;                      ///< invalid for Trace
    Value in[2];
    int layer = -1;                 ///< the decoder layer the op belongs to (-1: embedding or head)
    const Tensor* weight = nullptr; ///< Embed: the table; RmsNorm: the weight (F32, width floats)
    float eps = 0.0f;               ///< RmsNorm
    int64_t group = 0;              ///< RmsNorm: elements per normalised group (0: the whole row)
    float scalar = 0.0f;            ///< Scale: the factor; Softcap: the cap
    GluAct act = GluAct::SiLU;      ///< Glu, Gate
    std::vector<LinearPiece> pieces;  ///< Linear
    int spec = -1;                  ///< index into Program::attention (Attention), moe (Moe), delta_net (DeltaNet)
    std::string name;               ///< Trace
};

struct ValueInfo {
    int64_t width = 0;
    bool head = false;  ///< on the selected rows (after SelectRows), not the pass's rows
    int def = -1;       ///< the op that produces it
};

/// A whole forward pass: token ids in, logits of the selected rows out.
struct Program {
    Program() = default;
    Program(Program&&) = default;
    Program& operator=(Program&&) = default;
    Program(const Program&) = delete;  // ops point into `views` and `constants`

    std::vector<Op> ops;
    std::vector<ValueInfo> values;
    std::vector<AttentionSpec> attention;
    std::vector<MoeSpec> moe;
    std::vector<DeltaNetSpec> delta_net;
    Value logits;          ///< n_vocab floats per selected row
    /// The residual stream before the output norm, every row of the pass
    /// (n_embd floats): what a multi-token-prediction head reads of the
    /// trunk. Invalid for programs that do not name it.
    Value hidden;
    int64_t n_vocab = 0;
    int n_kv_layers = 0;   ///< KV-cache layers the attention ops write (kv_layer < n_kv_layers)
    int64_t kv_dim = 0;    ///< floats per position of one KV-cache layer (K or V)
    /// Floats of a sequence's recurrent state (the DeltaNet ops' slots back
    /// to back, in state_layer order); 0: the program keeps none.
    int64_t state_floats() const;
    /// Where state slot `layer` starts in that state.
    int64_t state_offset(int layer) const;
    /// Row slices and per-expert views of the model's tensors, and constant
    /// tables (RoPE factors), owned by the program.
    std::deque<Tensor> views;
    std::deque<std::vector<float>> constants;

    int64_t width(Value v) const { return values[static_cast<size_t>(v.id)].width; }
    /// One line per op ("blk.3 linear attn_q+attn_k+attn_v -> v12 [768]"),
    /// for tests and --verbose listings.
    std::string describe() const;
};

/// Writes a Program op by op, checking shapes as it goes: every mismatch is
/// a quern::Error naming the op, the tensor and both shapes, raised while the
/// model loads rather than when it runs.
class ProgramBuilder {
public:
    ProgramBuilder(int64_t n_vocab, int n_kv_layers, int64_t kv_dim);

    /// Ops added from here on belong to decoder layer il (-1: none).
    void set_layer(int il) { layer_ = il; }

    Value embed(const Tensor& table);
    /// group > 0: each group of `group` elements normalised on its own, w of
    /// group floats (a per-head norm).
    Value rms_norm(Value x, const Tensor& w, float eps, int64_t group = 0);
    Value linear(Value x, std::vector<LinearPiece> pieces);
    Value linear(Value x, const Tensor& w, const Tensor* bias = nullptr) {
        return linear(x, std::vector<LinearPiece>{LinearPiece{&w, bias}});
    }
    Value attention(Value qkv, const AttentionSpec& spec);
    Value glu(Value gate_up, GluAct act);
    /// x · act(gate), elementwise (equal widths), or each row of x times
    /// act of its one gate value (gate width 1). act: SiLU or Sigmoid.
    Value gate(Value x, Value gate, GluAct act);
    /// The gated delta rule of `spec` (its state_layer the next free slot
    /// when < 0): qkv of spec.conv_dim() floats, ba of 2 · n_v_heads.
    Value delta_net(Value qkv, Value ba, DeltaNetSpec spec);
    Value moe(Value x, MoeSpec spec);
    Value add(Value a, Value b);
    Value scale(Value x, float s);
    Value softcap(Value x, float cap);
    Value select_rows(Value x);
    void trace(Value x, std::string name);
    /// Rows of `width` floats the pass supplies (SeqBatch::hidden_in), one
    /// per token; at most one per program.
    Value input(int64_t width);
    /// [a | b] per row (both on the pass's rows or both on the selected ones).
    Value concat(Value a, Value b);
    /// Marks the program's output (and, when valid, the value passes may
    /// hand out as Program::hidden); the program is then complete.
    Program finish(Value logits, Value hidden = {});

    /// Rows [r0, r0 + rows) of matrix i2 (ne[2] index) of `t` as a 2-D
    /// tensor owned by the program (a fused Q|K|V or gate|up matrix split
    /// into its parts; one expert of a 3-D bank).
    const Tensor& rows_view(const Tensor& t, int64_t i2, int64_t r0, int64_t rows, std::string name);
    /// A constant table owned by the program (the same address for equal
    /// tables).
    const float* constant(std::vector<float> v);

private:
    Value emit(Op op, int64_t width, bool head);
    const ValueInfo& info(Value v) const;
    Program p_;
    int layer_ = -1;
};

}  // namespace quern
