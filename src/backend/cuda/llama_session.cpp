// The Llama-family forward pass for one decode token on the GPU, and the
// Session that drives it (see session.h). Llama, Qwen2 (q/k/v biases), Qwen3
// (per-head q/k RMSNorm), Phi-3 (fused projections, sliding window), Gemma 2/3
// and the expert models Mixtral and Qwen3-MoE share it: the biases, norms
// and window are applied inside the attention kernel (AttentionExtras,
// ops.h); fused weights already hold q|k|v and gate|up rows in the order the
// concatenated uploads use.
//
// One decode step, for the token in DecodeControl::cur at DecodeControl::pos
// (all kernels read both from device memory, so the step is captured once as
// a CUDA graph and replayed for every token):
//
//   x = token_embd[cur]                                   get_row
//   per layer:
//     xn, xq = RMSNorm(x (+= h), attn_norm)               rms_norm_q8_1 (residual folded in)
//     [q | k | v] = W_qkv · xq                            one GEMV per run of equal weight types
//     rotate q, k; store k, v at pos;                     decode_attention_rope (split-K with RoPE and
//     a, aq = attention(q, cache[0..pos]), Q8_1(a)          the KV write fused; quantizes in its combine,
//                                                           or in the split kernel when one split covers pos)
//     h = W_o · aq                                        gemv
//     xn, xq = RMSNorm(x += h, ffn_norm)                  rms_norm_q8_1
//     [gate | up] = W_gate_up · xq                        one GEMV when the types match
//     fq = Q8_1(SiLU(gate) · up)                          swiglu_q8_1
//     h = W_down · fq                                     gemv
//   (mixture-of-experts layers, Mixtral / Qwen3-MoE: in place of the FFN
//    above, with every expert id on the device)
//     r = W_router · xq                                   gemv (float or quantized router)
//     ids[k], w[k] = top-k of softmax(r), renormalised    moe_route (one block, as the CPU's moe_route)
//     g_s, u_s = W_gate/up[ids[s]] · xq for slots s < k   gemv_indexed: one launch per bank, grid.y = slot
//     fq = Q8_1(SiLU(g) · u) over the k·n_ff_exp values   swiglu_q8_1 (one row; slot s at s·n_ff_exp)
//     y_s = W_down[ids[s]] · fq_s                         gemv_indexed with per-slot activations
//     h = Σ_s w_s · y_s                                   moe_weighted_sum (h added by the next norm)
//   xn, xq = RMSNorm(x += h, output_norm); logits = W_out · xq; sampled = argmax or sample_token
//   pos += 1; cur = next prompt token or sampled          advance_decode_position (greedy: in
//                                                           argmax's final launch, argmax_advance)
//   The sampled token also goes to mapped host memory, which the host reads
//   after the step; a step whose token the device fed back needs no upload.
//
// When every matrix reads the quantized activation (fuse_norm_; not F32 /
// F16 / BF16 / F8_E4M3_B32 matrices; never with expert layers), the RMSNorms
// have no launch of their own: the lookup (get_row_norm) and the output and
// down projections (gemv_residual_norm: x += W·a in their epilogue) leave the
// next norm's activation quantized without its scale and Σx² in partial
// sums, and the GEMVs that read that activation apply the scale
// (DeferredNormScale, gemv.h); h is unused. Most decode kernels trigger
// their successor's launch before their own PDL wait (launch.cuh).
//
// With precise activations (the default, as on the CPU) every quantized
// activation has two levels (gemv.h), keeping the logits within cosine
// ~0.9999 of a float reference; --fast-act uses one.
// Weight matrices that share an input and a type are concatenated at upload
// (Q|K|V, gate|up) so that one launch reads them all. Every weight type the
// CPU runs has a GEMV (FP8 / NVFP4 checkpoints' F8_E4M3_B32 and NVFP4
// included: the first reads the float activation, the second the quantized
// one, gemv_takes_quantized_activation); an embedding table of a type get_row
// lacks is dequantized to F16 at upload.
//
// Prompts (eval with n >= kPrefillMinTokens, session.h) take the batched
// prefill path instead where the model allows it (prefill_supported_): the
// positions are processed prefill_chunk at a time, each chunk through every
// layer at once with matrix-matrix products (PrefillGemm, gemm.h: weights
// dequantized to BF16, cuBLASLt on the tensor cores) and the row-batched
// kernels of ops.h ("prefill"):
//
//   X[r] = token_embd[tokens[pos0 + r]] (· embd_scale)   get_rows
//   per layer:
//     XN = RMSNorm(X (+= HRES), attn_norm) in BF16        rms_norm_bf16, n rows
//     QKV = XN · W_qkvᵀ                                   PrefillGemm per piece
//     bias, q/k norm, RoPE; K, V -> cache rows pos0..     prefill_rope_kv_store
//     A = causal attention(Q, cache[0 .. pos0 + r])       prefill_attention (tensor cores: ops_flash.cu)
//     H = A · W_oᵀ (HRES = RMSNorm(H, post_attn_norm))    PrefillGemm (+ rms_norm_q8_1)
//     XN = RMSNorm(X += HRES, ffn_norm) in BF16           rms_norm_bf16
//     GU = XN · W_gate_upᵀ; F = SiLU|GELU(G) · U in BF16  PrefillGemm, glu_rows_bf16
//                                  (passes of <= 32 rows on bq layouts: bq_gemm_glu, one launch)
//     H = F · W_downᵀ (HRES = RMSNorm(H, post_ffn_norm))
//   last chunk, last row only: RMSNorm(x += h, output_norm), logits = W_out · xq
//   with the decode step's GEMV (and soft-capping).
// The KV cache then holds what the token-by-token path would have written
// (up to rounding: BF16 GEMM inputs instead of the Q8_1 activations of the
// GEMVs), so decoding continues from it with the captured step.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/gpu_support.h"
#include "backend/cuda/bq_gemm.h"
#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/session.h"
#include "backend/cuda/weights.h"
#include "core/error.h"
#include "backend/cpu/moe_route.h"
#include "core/fp16.h"
#include "quant/reference.h"
#include "runtime/batch_runner.h"

namespace quern::cuda {

int device_count() { return CudaContext::device_count(); }

namespace {

/// A matrix (or several concatenated along N) and where its rows land in the
/// output vector.
struct Piece {
    DeviceWeight w;
    int64_t offset = 0;  // first output element
};

struct LayerWeights {
    const float* attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    const float* qkv_bias = nullptr;  // [q | k | v] biases (Qwen2), or null
    const float* q_norm = nullptr;    // head_dim weights (Qwen3), or null
    const float* k_norm = nullptr;
    const float* post_attn_norm = nullptr;  // Gemma: RMSNorm of the attention / FFN output
    const float* post_ffn_norm = nullptr;   //   before its residual add, or null
    std::vector<Piece> qkv;      // outputs into [q | k | v]
    Piece wo;
    std::vector<Piece> gate_up;  // outputs into [gate | up]
    Piece down;
    // Mixture of experts (gate_up and down empty): the router (n_expert
    // rows) and the three expert banks, each one matrix of n_expert × rows
    // (expert e's rows first at e · rows; gemv_indexed).
    bool moe = false;
    Piece router;
    DeviceWeight exp_gate, exp_up, exp_down;
    // Batches: one BF16 copy of all Q|K|V (gate|up) pieces, rows stacked in
    // output order (type BF16, owning the pieces' copies), or empty.
    DeviceWeight qkv_bf16, gate_up_bf16;
};

/// Host memory pinned for asynchronous copies (freed with cudaFreeHost).
class PinnedBuffer {
public:
    PinnedBuffer() = default;
    explicit PinnedBuffer(size_t bytes, unsigned flags = cudaHostAllocDefault) {
        QUERN_CUDA_CHECK(cudaHostAlloc(&p_, bytes, flags));
    }
    ~PinnedBuffer() {
        if (p_) cudaFreeHost(p_);
    }
    PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
    PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
        std::swap(p_, o.p_);
        return *this;
    }
    template <class T>
    T* as() const {
        return static_cast<T*>(p_);
    }

private:
    void* p_ = nullptr;
};

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

class LlamaCudaSession final : public Session, public BatchRunner {
public:
    LlamaCudaSession(const Model& model, const SessionOptions& opt);
    ~LlamaCudaSession() override;

    const ModelConfig& config() const override { return cfg_; }
    std::string backend_name() const override { return ctx_.name(); }
    int64_t n_ctx() const override { return n_ctx_; }
    int64_t size() const override { return n_past_; }
    void truncate(int64_t n) override {
        n_past_ = std::clamp<int64_t>(n, 0, n_past_);
        fed_ = false;
    }
    void eval(const int32_t* tokens, int64_t n, float* logits) override;
    int32_t eval_greedy(int32_t token) override;
    int32_t eval_sample(int32_t token, Sampler& sampler) override;
    void eval_traced(const int32_t* tokens, int64_t n, float* logits, const TraceFn& trace) override;
    int64_t fp8_activation_rows() const override {
        return opt_.fp8_weights && prefill_supported_ ? kPrefillMinTokens : 0;
    }

    // BatchRunner (make_batch_runner): several sequences' rows per pass over
    // a paged KV cache in device memory (see the top of the file).
    std::unique_ptr<PagedKvPool> make_kv_pool(int64_t n_blocks, int64_t block_size, const char* flag) override;
    void forward_batch(const SeqBatch* seqs, int n_seqs, PagedKvPool& kv) override;
    /// Readies the session for batches: the row scratch, and resident BF16
    /// copies of the dense matrices (as memory allows). quern::Error when the
    /// model has no batched path on this GPU.
    void prepare_batches();
    /// Passes replayed from CUDA graphs so far (batch_graph_replays).
    int64_t graph_replays() const { return graph_replays_; }

private:
    void upload_weights(const Model& model);
    /// f(w) for every layer matrix (Q/K/V, output, gate/up, down; with
    /// `experts`, the expert banks too), in layer order.
    template <class F>
    void for_each_layer_matrix(F&& f, bool experts) {
        for (auto& L : layers_) {
            for (auto& p : L.qkv) f(p.w);
            f(L.wo.w);
            for (auto& p : L.gate_up) f(p.w);
            f(L.down.w);
            if (experts) {
                f(L.exp_gate);
                f(L.exp_up);
                f(L.exp_down);
            }
        }
    }
    std::vector<Piece> upload_group(const std::vector<const Tensor*>& ts);
    /// bq layouts of the expert banks (bq_gemm.h), once every weight is on
    /// the device; see its definition.
    void make_expert_bq();
    /// An expert bank of layer il: the 3-D tensor blk.il.<bank>_exps, or the
    /// per-expert 2-D tensors blk.il.<bank>.E concatenated (one type).
    DeviceWeight upload_bank(const WeightStore& ws, int64_t il, const char* bank);
    const float* upload_f32(const Tensor& t);

    /// Queues one decode step on the stream (head: the output projection and
    /// argmax too). With `trace`, synchronizes after each layer and reports
    /// the residual stream (never during capture).
    /// What a step does after the layers: nothing (a prompt token whose
    /// logits nobody reads), greedy argmax, or sample_token.
    enum Head { kNoHead = 0, kArgmax = 1, kSample = 2 };
    /// short_ctx: attention as one split per KV head with no combine launch
    /// (AttentionExtras::one_split), for steps at positions < short_ctx_.
    void enqueue_step(Head head, const TraceFn* trace, bool short_ctx = false);
    void mm(const Piece& p, const float* xf, QuantizedActivation& xq, float* y);
    /// Replays (capturing on first use) the step graph with or without head
    /// for a step at position pos: a graph of its own for pos < short_ctx_
    /// (enqueue_step's short_ctx form).
    void run_step(Head head, int64_t pos);
    /// Uploads tokens[0..n) to positions n_past_.. and sets the control block
    /// so that the next step evaluates position n_past_.
    void begin(const int32_t* tokens, int64_t n);
    /// LongRoPE: the frequencies for a call whose last position is `last`.
    void select_rope(int64_t last);
    /// Readies the device for one decode step of `token` at n_past_: nothing
    /// when the previous step fed it itself (fed_), else begin().
    void begin_one(int32_t token);
    /// After a synchronized greedy or sampled step at position p (n_past_ now
    /// p + 1): the token it picked, from the mapped host slot; the device has
    /// fed it back (fed_).
    int32_t took_step(int64_t p);

    /// Batched prefill (see the top of the file): whether eval of n tokens
    /// takes it, the whole eval, and one chunk of n rows at positions pos0..
    /// (tokens already on the device; head: logits of the last row into logits_).
    bool use_prefill(int64_t n) const;
    void prefill(const int32_t* tokens, int64_t n, float* logits);
    void prefill_chunk(int64_t pos0, int64_t n, bool head);
    /// The layers over n rows whose token ids are on the device (dtokens):
    /// one sequence's positions pos0 .. pos0+n−1 over the session's cache
    /// (paged null), or rows of several sequences over the paged cache. The
    /// residual stream is left in px_ (+ the last HRES not yet added).
    void layer_rows(const int32_t* dtokens, int64_t n, int64_t pos0, const PagedRows* paged);
    struct BatchSegment {
        int seq;
        int64_t off, n;  // rows off .. off+n−1 of the sequence's new tokens
    };
    void batch_pass(const SeqBatch* seqs, const std::vector<BatchSegment>& segs);
    /// Layer L's q/k/v biases and q/k norms for the RoPE kernels (window and
    /// soft-cap left at their defaults).
    AttentionExtras attention_extras(const LayerWeights& L) const;
    /// The expert FFN of layer L for n prefill rows: xb (n × n_embd BF16,
    /// normalized) → out (n × n_embd floats). See the top of the file.
    void prefill_moe(const LayerWeights& L, const uint16_t* xb, int64_t n, float* out);
    /// Whether prefill_moe routes layer L's rows on the device and multiplies
    /// each bank in one grouped launch (bq or dq), with no host round trip.
    bool moe_on_device(const LayerWeights& L) const;
    /// Allocates the prefill scratch on first use; false (and the batched
    /// path off for this session) when the GPU has no room for it.
    bool ensure_prefill_scratch();

    ModelConfig cfg_;
    SessionOptions opt_;
    CudaContext ctx_;
    int levels_ = 2;
    int64_t n_ctx_ = 0;
    int64_t n_past_ = 0;
    KvType kv_type_ = KvType::F16;

    // RMSNorms folded into the GEMVs around them (gemv_residual_norm and
    // DeferredNormScale, gemv.h) when every matrix reads the quantized
    // activation; else one rms_norm_q8_1 launch per norm.
    // QUERN_CUDA_FUSE_NORM=0 turns it off.
    bool fuse_norm_ = false;
    DeviceBuffer ss_parts_;  // n_embd/32 partial sums of x²

    std::vector<DeviceBuffer> owned_;  // norm weights, embedding table
    std::vector<LayerWeights> layers_;
    DType embd_type_ = DType::F32;
    const void* embd_ = nullptr;
    const float* out_norm_ = nullptr;
    const float* inv_freq_ = nullptr;    // rope_dim/2 floats: cpu::rope_inv_freq
    const float* inv_freq_local_ = nullptr;  // sliding-window layers' table (Gemma: own base, maybe unscaled)
    // LongRoPE (ModelConfig::longrope()): the short and long tables; the
    // live one (inv_freq_, inv_freq_local_) holds the long one while
    // rope_long_live_.
    const float* rope_short_ = nullptr;
    const float* rope_long_ = nullptr;
    bool rope_long_live_ = false;
    int64_t rope_call_last_ = -1;  // eval_traced: its whole call's last position (begin() is called twice)
    Piece output_;

    // Batched prefill: whether the model allows it (weight types with a
    // prefill GEMM, a supported head size), rows per chunk, and its scratch
    // (allocated on first use: decode-only sessions never pay for it).
    bool prefill_supported_ = false;
    int64_t prefill_rows_ = 0;
    std::unique_ptr<PrefillGemm> gemm_;
    DeviceBuffer px_, ph_, phpost_, pqkv_, pattn_, pgu_;
    // Expert prefill (n·k grouped rows, + 16 rows of padding): router logits,
    // the grouped rows' inputs (BF16), gate|up outputs, gated values (BF16)
    // and down outputs; the routing (grouped row of each entry, row of each
    // grouped row, weights) on the device and its host staging.
    DeviceBuffer pmoe_logits_, pmoe_xg_, pmoe_gu_, pmoe_g_, pmoe_y_, pmoe_route_;
    PinnedBuffer hmoe_logits_, hmoe_route_;

    DeviceBuffer kv_;  // per layer: K then V, n_ctx rows of kv_dim elements
    size_t kv_layer_bytes_ = 0;
    // Batches (BatchRunner): the paged cache (per layer: K then V, f16, rows
    // of kv_dim; row = block · block_size + offset), its geometry, the
    // pass's ids/positions/tables on the device, and the head's rows and logits.
    DeviceBuffer pkv_;
    size_t pkv_layer_bytes_ = 0;
    int64_t pkv_blocks_ = 0, pkv_block_size_ = 0;
    // The output head runs on at most kHeadRows rows at a time: its BF16
    // inputs, logits and argmaxes (device and pinned host copies).
    static constexpr int64_t kHeadRows = 256;
    static constexpr int64_t kSplitRows = 128;  // passes up to this long may split attention keys
    DeviceBuffer bints_, bhead_x_, blogits_, bgreedy_, bargmax_, bsplit_;
    int64_t bsplit_floats_ = 0;
    PinnedBuffer hgreedy_;
    std::vector<int32_t> bhost_;              // the pass's integers on the host (batch_pass)
    // Passes of single rows replayed as CUDA graphs (make_batch_runner):
    // the most rows a captured pass takes (0: none), the graphs by (padded
    // rows, key bucket) with the times each pair was seen before capture,
    // and the fixed device buffer their integers live in.
    static constexpr int64_t kGraphRows = 256;
    static constexpr int64_t kGraphInts = int64_t{1} << 20;
    int64_t graph_rows_ = 0;
    std::map<std::pair<int64_t, int64_t>, std::pair<cudaGraphExec_t, int>> bgraphs_;
    DeviceBuffer bgints_;
    int64_t graph_replays_ = 0;
    void clear_batch_graphs();
    /// Runs layer_rows(d, n, 0, pr) as the graph of (n, keys), capturing it
    /// on the pair's second pass; false (nothing ran) on its first pass and
    /// when its capture failed (the pair then always runs uncaptured).
    bool replay_layers(const int32_t* d, int64_t n, int64_t keys, const PagedRows& pr);
    std::vector<const SeqBatch*> head_seq_;   // the sequence of each head row
    bool batches_ready_ = false;
    bool batch_runner_ = false;  // made by make_batch_runner (prepare_batches)

    // Per-step activations.
    DeviceBuffer x_, h_, hpost_, xn_, qkv_, attn_, gu_, ffh_, logits_, attn_scratch_, argmax_scratch_, tokens_, ctl_;
    QuantizedActivation xq_embd_, xq_attn_, xq_ff_;
    // Mixture of experts: router logits (n_expert), the chosen ids and
    // weights (n_expert_used each, written by moe_route on the device), the
    // experts' outputs (n_expert_used rows of n_embd) and the SwiGLU
    // activation of all chosen experts as ONE quantized row of
    // n_expert_used × n_ff_exp elements (slot s's elements at s·n_ff_exp).
    DeviceBuffer moe_logits_, moe_ids_, moe_w_, moe_y_;
    QuantizedActivation xq_moe_;
    PinnedBuffer host_ctl_, host_tokens_;
    // The sampled token of each step, written by the step's last kernel into
    // mapped host memory (slot pos & 1; advance_decode_position): read after
    // the step without a copy in the stream.
    PinnedBuffer host_out_;
    int32_t* host_out_dev_ = nullptr;
    // fed_: the device's control block already holds position fed_pos_ with
    // token fed_tok_ (a greedy or sampled step fed its own output back), so
    // the next step of that token needs no upload.
    bool fed_ = false;
    int64_t fed_pos_ = 0;
    int32_t fed_tok_ = 0;

    cudaGraphExec_t graph_[3][2] = {};  // [Head][short context]
    // Steps at positions below this run attention as one split per KV head
    // with no combine launch (QUERN_CUDA_SHORT_CTX, default 128: at most two
    // tiles, both requested before the kernel's wait; 0: never).
    int64_t short_ctx_ = 128;
    DeviceBuffer sampling_;    // one DeviceSampling
    PinnedBuffer host_sampling_;

    // QUERN_CUDA_PROFILE=1: steps run uncaptured with CUDA events between the
    // ops; the destructor prints the GPU time per op kind (µs per decode
    // step, and µs per batched-prefill chunk with the GEMMs' dequantization
    // and cuBLASLt time apart).
    struct Profile {
        std::vector<std::pair<std::string, double>> ms;  // op name -> total ms
        int64_t count = 0;                               // steps or chunks
        int64_t rows = 0;                                // prefill: positions
    };
    bool profile_ = false;
    // Expert layers of a prompt chunk route on the device and multiply each
    // bank in one grouped launch (QUERN_CUDA_MOE_GROUPED=0: host routing and
    // one GEMM per expert, for comparison).
    bool moe_grouped_ = true;
    // Passes whose gate|up products run on bq_gemm compute the gated values
    // in that launch (bq_gemm_glu; QUERN_CUDA_BQ_GLU=0: the products, then
    // glu_rows_bf16, for comparison).
    bool bq_glu_ = true;
    // Decode passes of the batch runner fold RoPE and the KV write into the
    // paged attention (paged_rope_attention; QUERN_CUDA_ROPE_FOLD=0: two
    // launches, for comparison).
    bool rope_fold_ = true;
    std::vector<std::pair<const char*, cudaEvent_t>> marks_;
    Profile prof_decode_, prof_prefill_, prof_batch_, prof_batch_prompt_;  // batch: passes of one row per sequence, others
    double batch_wall_ms_ = 0;  // host time of the profiled decode batch passes
    void mark(const char* what);
    void collect_profile(Profile& p);
    static void print_profile(const Profile& p, const char* what);
};

void LlamaCudaSession::mark(const char* what) {
    if (!profile_) return;
    cudaEvent_t e;
    QUERN_CUDA_CHECK(cudaEventCreate(&e));
    QUERN_CUDA_CHECK(cudaEventRecord(e, ctx_.stream()));
    marks_.emplace_back(what, e);
}

void LlamaCudaSession::collect_profile(Profile& prof) {
    if (marks_.empty()) return;
    QUERN_CUDA_CHECK(cudaEventSynchronize(marks_.back().second));
    for (size_t i = 1; i < marks_.size(); ++i) {
        float ms = 0;
        QUERN_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second));
        const std::string name = marks_[i].first;
        auto it = std::find_if(prof.ms.begin(), prof.ms.end(), [&](const auto& p) { return p.first == name; });
        if (it == prof.ms.end()) prof.ms.emplace_back(name, ms);
        else it->second += ms;
    }
    for (auto& m : marks_) cudaEventDestroy(m.second);
    marks_.clear();
    ++prof.count;
}

void LlamaCudaSession::print_profile(const Profile& p, const char* what) {
    if (p.count == 0) return;
    double total = 0;
    for (const auto& e : p.ms) total += e.second;
    std::fprintf(stderr, "quern: CUDA profile over %lld %s (kernel time between events, us per %s):\n",
                 static_cast<long long>(p.count), what, what);
    for (const auto& e : p.ms)
        std::fprintf(stderr, "  %-12s %9.1f us  %5.1f%%\n", e.first.c_str(), 1000.0 * e.second / p.count,
                     100.0 * e.second / total);
    std::fprintf(stderr, "  %-12s %9.1f us\n", "total", 1000.0 * total / p.count);
    if (p.rows > 0)
        std::fprintf(stderr, "  %lld positions: %.1f tok/s of kernel time\n", static_cast<long long>(p.rows),
                     p.rows / (total / 1000.0));
}

LlamaCudaSession::LlamaCudaSession(const Model& model, const SessionOptions& opt)
    : cfg_(model.config()), opt_(opt), ctx_(opt.device) {
    const auto& c = cfg_;
    if (const std::string why = cuda_unsupported_feature(c); !why.empty())
        fail("the CUDA backend does not compute {} yet (use --device cpu)", why);
    if (c.head_dim == 256 && !opt.f16_kv) fail("the CUDA decode attention needs an f16 KV cache for heads of 256");
    levels_ = model.options().precise_activations ? 2 : 1;
    if (const char* p = std::getenv("QUERN_CUDA_PROFILE"); p && *p && *p != '0') profile_ = true;
    if (const char* p = std::getenv("QUERN_CUDA_SHORT_CTX"); p && *p) short_ctx_ = std::max(0LL, std::atoll(p));
    if (const char* p = std::getenv("QUERN_CUDA_MOE_GROUPED"); p && *p == '0') moe_grouped_ = false;
    if (const char* p = std::getenv("QUERN_CUDA_BQ_GLU"); p && *p == '0') bq_glu_ = false;
    if (const char* p = std::getenv("QUERN_CUDA_ROPE_FOLD"); p && *p == '0') rope_fold_ = false;
    kv_type_ = opt.f16_kv ? KvType::F16 : KvType::F32;
    if (opt.n_ctx < 1 || opt.n_ctx > (int64_t{1} << 24)) fail("KV-cache size {} out of range", opt.n_ctx);

    upload_weights(model);
    if (opt.fp8_weights) {
        // FP8 with per-channel scales (--gpu-weights fp8), converted on the
        // device one matrix at a time.
        // A matrix that does not fit twice (old and new during its
        // conversion) stays as it is, with a note.
        bool kept = false;
        const auto fp8 = [&](DeviceWeight& w) {
            if (!w.q || !gemm_weight_type_supported(w.type) || w.K % 32 != 0) return;
            try {
                w = to_fp8_rows(w, ctx_.stream());
            } catch (const Error&) {
                cudaGetLastError();
                if (!kept && opt.verbose)
                    std::fprintf(stderr, "quern: not enough GPU memory to convert every matrix to FP8; some keep "
                                         "their own type\n");
                kept = true;
            }
        };
        for_each_layer_matrix(fp8, /*experts=*/true);
    }
    if (c.moe()) make_expert_bq();

    // Activations and scratch.
    const auto fbuf = [](int64_t n) { return DeviceBuffer(static_cast<size_t>(n) * sizeof(float)); };
    x_ = fbuf(c.n_embd);
    h_ = fbuf(c.n_embd);
    if (c.post_norms) hpost_ = fbuf(c.n_embd);
    xn_ = fbuf(c.n_embd);
    qkv_ = fbuf(c.q_dim() + 2 * c.kv_dim());
    attn_ = fbuf(c.q_dim());
    const int64_t moe_ff = c.moe() ? c.n_expert_used * c.n_ff_exp : 0;  // gate (or up) of all chosen experts
    gu_ = fbuf(2 * (c.moe() ? moe_ff : c.n_ff));
    ffh_ = fbuf(c.moe() ? moe_ff : c.n_ff);
    if (c.moe()) {
        moe_logits_ = fbuf(c.n_expert);
        moe_ids_ = DeviceBuffer(static_cast<size_t>(c.n_expert_used) * sizeof(int32_t));
        moe_w_ = fbuf(c.n_expert_used);
        moe_y_ = fbuf(c.n_expert_used * c.n_embd);
        xq_moe_ = QuantizedActivation(moe_ff, levels_);
    }
    logits_ = fbuf(c.n_vocab);
    argmax_scratch_ = DeviceBuffer(argmax_scratch_bytes(c.n_vocab));
    xq_embd_ = QuantizedActivation(c.n_embd, levels_);
    xq_attn_ = QuantizedActivation(c.q_dim(), levels_);
    if (!c.moe()) xq_ff_ = QuantizedActivation(c.n_ff, levels_);
    {
        // Every GEMV must read the quantized activation (F8_E4M3_B32, like
        // the float types, reads floats: FP8 models keep the norm launches).
        const auto q8 = [](const Piece& p) { return gemv_takes_quantized_activation(p.w.type); };
        bool all_q = q8(output_);
        for (const auto& L : layers_) {
            for (const auto* ps : {&L.qkv, &L.gate_up})
                for (const Piece& p : *ps) all_q = all_q && q8(p);
            all_q = all_q && q8(L.wo) && q8(L.down);
        }
        const char* e = std::getenv("QUERN_CUDA_FUSE_NORM");
        // Post-norms (Gemma) normalize a branch's output before its residual
        // add, which the GEMV epilogue cannot do: those models keep the
        // launches. So do expert layers, whose output is a weighted sum of
        // several GEMVs (moe_weighted_sum) rather than one GEMV's epilogue.
        fuse_norm_ = all_q && !c.post_norms && !c.moe() && !(e && std::string(e) == "0");
        ss_parts_ = fbuf(c.n_embd / 32);
    }
    ctl_ = DeviceBuffer(sizeof(DecodeControl));
    host_ctl_ = PinnedBuffer(sizeof(DecodeControl));
    host_out_ = PinnedBuffer(2 * sizeof(int32_t), cudaHostAllocMapped);
    QUERN_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_out_dev_), host_out_.as<void>(), 0));
    {
        // Batched prefill needs a prefill GEMM for every layer matrix (the
        // output head stays a GEMV: one row) and a head size the prefill
        // attention takes; other models evaluate prompts token by token.
        // Expert layers group their rows by expert (prefill_moe).
        const auto g = [](const Piece& p) { return gemm_weight_type_supported(p.w.type); };
        bool ok = opt.batched_prefill && prefill_attention_head_dim_supported(static_cast<int>(c.head_dim)) &&
                  opt.prefill_chunk >= 1;
        for (const auto& L : layers_) {
            for (const Piece& p : L.qkv) ok = ok && g(p);
            ok = ok && g(L.wo);
            if (L.moe) {
                ok = ok && g(L.router) && gemm_weight_type_supported(L.exp_gate.type) &&
                     gemm_weight_type_supported(L.exp_up.type) && gemm_weight_type_supported(L.exp_down.type);
            } else {
                for (const Piece& p : L.gate_up) ok = ok && g(p);
                ok = ok && g(L.down);
            }
        }
        const char* e = std::getenv("QUERN_CUDA_PREFILL");
        prefill_supported_ = ok && !(e && std::string(e) == "0");
    }

    // KV cache: as requested, capped by --gpu-mem.
    const size_t elem = kv_type_ == KvType::F16 ? 2 : 4;
    const size_t per_token = 2 * static_cast<size_t>(c.n_layer * c.kv_dim()) * elem;
    int64_t n_ctx = opt.n_ctx;
    if (opt.gpu_mem_fraction > 0) {
        size_t free_b = 0, total_b = 0;
        QUERN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        const double used = static_cast<double>(total_b - free_b);
        const double budget = opt.gpu_mem_fraction * static_cast<double>(total_b) - used;
        // Attention scratch grows with n_ctx too (partials per split), bounded by 128 splits.
        const double scratch = static_cast<double>(decode_attention_scratch_bytes(1 << 20, static_cast<int>(c.n_head),
                                                                                  static_cast<int>(c.head_dim)));
        const auto fit = static_cast<int64_t>((budget - scratch) / static_cast<double>(per_token));
        if (fit < 1)
            fail("--gpu-mem {}: the weights already use {:.2f} of {:.2f} GiB; nothing is left for the KV cache",
                 opt.gpu_mem_fraction, gib(used), gib(static_cast<double>(total_b)));
        n_ctx = std::min(n_ctx, fit);
    }
    n_ctx_ = n_ctx;
    kv_layer_bytes_ = static_cast<size_t>(n_ctx) * static_cast<size_t>(c.kv_dim()) * elem;
    try {
        kv_ = DeviceBuffer(2 * kv_layer_bytes_ * static_cast<size_t>(c.n_layer));
    } catch (const Error&) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        QUERN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        fail("the KV cache for {} tokens needs {:.2f} GiB but the GPU has {:.2f} GiB free (lower -c or use --gpu-mem)",
             n_ctx, gib(static_cast<double>(2 * kv_layer_bytes_ * static_cast<size_t>(c.n_layer))),
             gib(static_cast<double>(free_b)));
    }
    attn_scratch_ = DeviceBuffer(
        decode_attention_scratch_bytes(static_cast<int>(n_ctx), static_cast<int>(c.n_head), static_cast<int>(c.head_dim)));
    tokens_ = DeviceBuffer(static_cast<size_t>(n_ctx + 1) * sizeof(int32_t));
    sampling_ = DeviceBuffer(sizeof(DeviceSampling));
    host_sampling_ = PinnedBuffer(sizeof(DeviceSampling));
    host_tokens_ = PinnedBuffer(static_cast<size_t>(n_ctx + 1) * sizeof(int32_t));
    if (opt.verbose)
        std::fprintf(stderr, "quern: CUDA %s: KV cache %lld tokens (%s, %.2f GiB)\n", ctx_.name().c_str(),
                     static_cast<long long>(n_ctx), kv_type_ == KvType::F16 ? "f16" : "f32",
                     gib(static_cast<double>(kv_.size())));
}

LlamaCudaSession::~LlamaCudaSession() {
    for (auto& gh : graph_)
        for (auto& g : gh)
            if (g) cudaGraphExecDestroy(g);
    clear_batch_graphs();
    if (profile_) {
        print_profile(prof_decode_, "step");
        print_profile(prof_prefill_, "chunk");
        print_profile(prof_batch_, "decode batch pass");
        print_profile(prof_batch_prompt_, "prompt batch pass");
        if (prof_batch_.count > 0)
            std::fprintf(stderr, "  host wall time %.1f us per decode batch pass\n", 1000.0 * batch_wall_ms_ / prof_batch_.count);
    }
}

std::vector<Piece> LlamaCudaSession::upload_group(const std::vector<const Tensor*>& ts) {
    // Runs of consecutive matrices of one type become one concatenated matrix.
    std::vector<Piece> out;
    int64_t offset = 0;
    for (size_t i = 0; i < ts.size();) {
        size_t j = i + 1;
        while (j < ts.size() && ts[j]->type == ts[i]->type && ts[j]->ne[0] == ts[i]->ne[0]) ++j;
        Piece p;
        p.offset = offset;
        if (j == i + 1) {
            p.w = upload_weight(ctx_, *ts[i]);
        } else {
            int64_t rows = 0;
            for (size_t k = i; k < j; ++k) rows += ts[k]->nrows();
            const size_t rb = ts[i]->row_bytes();
            std::vector<uint8_t> cat(rb * static_cast<size_t>(rows));
            size_t at = 0;
            std::string name;
            for (size_t k = i; k < j; ++k) {
                for (int64_t r = 0; r < ts[k]->nrows(); ++r, at += rb) std::memcpy(cat.data() + at, ts[k]->row(r), rb);
                name += (name.empty() ? "" : "+") + ts[k]->name;
            }
            p.w = upload_weight(ctx_, Tensor::contiguous(ts[i]->type, {ts[i]->ne[0], rows, 1, 1}, cat.data(), name));
        }
        offset += p.w.N;
        out.push_back(std::move(p));
        i = j;
    }
    return out;
}

DeviceWeight LlamaCudaSession::upload_bank(const WeightStore& ws, int64_t il, const char* bank) {
    const auto& c = cfg_;
    const bool down = std::strcmp(bank, "ffn_down") == 0;
    const int64_t K = down ? c.n_ff_exp : c.n_embd, rows = down ? c.n_embd : c.n_ff_exp;
    const std::string name3 = fmt::format("blk.{}.{}_exps.weight", il, bank);
    if (const Tensor* t = ws.find(name3)) {
        if (t->ne[0] != K || t->ne[1] != rows || t->ne[2] != c.n_expert || t->ne[3] != 1)
            fail("tensor '{}' has shape [{}, {}, {}, {}], expected [{}, {}, {}]", name3, t->ne[0], t->ne[1], t->ne[2],
                 t->ne[3], K, rows, c.n_expert);
        return upload_weight(ctx_, *t);  // ne[2] flattened into N: expert e's rows at e·rows
    }
    std::vector<const Tensor*> ts;
    for (int64_t e = 0; e < c.n_expert; ++e) {
        const std::string n = fmt::format("blk.{}.{}.{}.weight", il, bank, e);
        const Tensor* t = ws.find(n);
        if (!t) fail("tensor '{}' (or '{}') is missing", name3, n);
        if (t->ne[0] != K || t->nrows() != rows)
            fail("tensor '{}' has {} × {} elements, expected {} × {}", n, t->ne[0], t->nrows(), K, rows);
        ts.push_back(t);
    }
    std::vector<Piece> ps = upload_group(ts);
    if (ps.size() != 1)
        fail("layer {}: the {} experts' matrices have different types; the CUDA backend needs one type per bank", il,
             bank);
    return std::move(ps[0].w);
}

const float* LlamaCudaSession::upload_f32(const Tensor& t) {
    DeviceBuffer b(t.nbytes());
    b.upload(t.data, t.nbytes(), ctx_.stream());
    owned_.push_back(std::move(b));
    return owned_.back().as<float>();
}

void LlamaCudaSession::upload_weights(const Model& model) {
    const auto& c = cfg_;
    const WeightStore& ws = model.weights();
    const auto get = [&](const std::string& n) -> const Tensor& {
        const Tensor* t = ws.find(n);
        if (!t) fail("tensor '{}' is missing", n);
        return *t;
    };
    const Tensor& emb = get("token_embd.weight");
    if (cuda_get_row_type_supported(emb.type)) {
        DeviceBuffer b(emb.nbytes());
        b.upload(emb.data, emb.nbytes(), ctx_.stream());
        embd_type_ = emb.type;
        owned_.push_back(std::move(b));
    } else {
        std::vector<uint16_t> f16(static_cast<size_t>(emb.nelements()));
        std::vector<float> row(static_cast<size_t>(emb.ne[0]));
        for (int64_t r = 0; r < emb.nrows(); ++r) {
            dequantize_row_ref(emb.type, emb.row(r), row.data(), emb.ne[0]);
            for (int64_t i = 0; i < emb.ne[0]; ++i)
                f16[static_cast<size_t>(r * emb.ne[0] + i)] = fp32_to_fp16(row[static_cast<size_t>(i)]);
        }
        DeviceBuffer b(f16.size() * 2);
        b.upload(f16.data(), f16.size() * 2, ctx_.stream());
        embd_type_ = DType::F16;
        owned_.push_back(std::move(b));
    }
    embd_ = owned_.back().data();
    out_norm_ = upload_f32(get("output_norm.weight"));
    {  // RoPE inverse frequencies (with rope_freqs.weight's factors when present)
        const Tensor* rf = ws.find("rope_freqs.weight");
        if (rf && (rf->type != DType::F32 || rf->nelements() < c.rope_dim / 2))
            fail("rope_freqs.weight must be F32 with at least {} elements", c.rope_dim / 2);
        const float* ff = rf ? static_cast<const float*>(rf->data) : nullptr;
        const auto table = [&](float base, const float* factors) {
            std::vector<float> inv(static_cast<size_t>(std::max<int64_t>(1, c.rope_dim / 2)), 0.0f);
            cpu::rope_inv_freq(static_cast<int>(c.rope_dim), base, factors, inv.data());
            DeviceBuffer b(inv.size() * sizeof(float));
            b.upload(inv.data(), inv.size() * sizeof(float), ctx_.stream());
            owned_.push_back(std::move(b));
            return owned_.back().as<float>();
        };
        if (c.longrope()) {
            // LongRoPE: every layer turns by the short or the long table,
            // chosen per call from its last position (begin): the kernels
            // read a live copy that begin() overwrites when the choice
            // changes; the batch runner's rows pick theirs (PagedRows).
            rope_short_ = table(c.rope_base, c.rope_factors_short.data());
            rope_long_ = table(c.rope_base, c.rope_factors_long.data());
            inv_freq_ = inv_freq_local_ = table(c.rope_base, c.rope_factors_short.data());
        } else {
            inv_freq_ = table(c.rope_base, ff);
            // As the CPU forward pass: local layers turn at their own base, and
            // without the factors when they apply to global layers only.
            inv_freq_local_ = table(c.rope_base_local > 0.0f ? c.rope_base_local : c.rope_base,
                                    c.rope_factors_global_only ? nullptr : ff);
        }
    }
    const Tensor* out = ws.find("output.weight");
    output_.w = upload_weight(ctx_, out ? *out : emb);

    layers_.resize(static_cast<size_t>(c.n_layer));
    for (int64_t il = 0; il < c.n_layer; ++il) {
        auto n = [&](const char* s) { return fmt::format("blk.{}.{}.weight", il, s); };
        LayerWeights& L = layers_[static_cast<size_t>(il)];
        L.attn_norm = upload_f32(get(n("attn_norm")));
        L.ffn_norm = upload_f32(get(n("ffn_norm")));
        // Phi-3's fused projections hold q|k|v and gate|up rows already in
        // the order the concatenated uploads use.
        L.qkv = c.fused_qkv ? upload_group({&get(n("attn_qkv"))})
                            : upload_group({&get(n("attn_q")), &get(n("attn_k")), &get(n("attn_v"))});
        L.wo.w = upload_weight(ctx_, get(n("attn_output")));
        if (c.moe()) {
            L.moe = true;
            L.router.w = upload_weight(ctx_, get(n("ffn_gate_inp")));
            if (L.router.w.K != c.n_embd || L.router.w.N != c.n_expert)
                fail("{}: {} × {}, expected {} × {}", n("ffn_gate_inp"), L.router.w.K, L.router.w.N, c.n_embd,
                     c.n_expert);
            L.exp_gate = upload_bank(ws, il, "ffn_gate");
            L.exp_up = upload_bank(ws, il, "ffn_up");
            L.exp_down = upload_bank(ws, il, "ffn_down");
        } else {
            L.gate_up = c.fused_gate_up ? upload_group({&get(n("ffn_up"))})
                                        : upload_group({&get(n("ffn_gate")), &get(n("ffn_up"))});
        }
        if (c.qkv_bias) {
            std::vector<float> b;
            for (const char* t : {"attn_q", "attn_k", "attn_v"}) {
                const Tensor& bt = get(fmt::format("blk.{}.{}.bias", il, t));
                if (bt.type != DType::F32) fail("{} must be F32", bt.name);
                const auto* p = static_cast<const float*>(bt.data);
                b.insert(b.end(), p, p + bt.nelements());
            }
            if (static_cast<int64_t>(b.size()) != c.q_dim() + 2 * c.kv_dim())
                fail("layer {}: the q/k/v biases have {} elements, expected {}", il, b.size(), c.q_dim() + 2 * c.kv_dim());
            DeviceBuffer db(b.size() * sizeof(float));
            db.upload(b.data(), b.size() * sizeof(float), ctx_.stream());
            owned_.push_back(std::move(db));
            L.qkv_bias = owned_.back().as<float>();
        }
        if (c.qk_norm) {
            L.q_norm = upload_f32(get(n("attn_q_norm")));
            L.k_norm = upload_f32(get(n("attn_k_norm")));
        }
        if (c.post_norms) {
            L.post_attn_norm = upload_f32(get(n("post_attention_norm")));
            L.post_ffn_norm = upload_f32(get(n("post_ffw_norm")));
        }
        if (!c.moe()) L.down.w = upload_weight(ctx_, get(n("ffn_down")));
    }
}

void LlamaCudaSession::mm(const Piece& p, const float* xf, QuantizedActivation& xq, float* y) {
    if (gemv_takes_quantized_activation(p.w.type))
        gemv(ctx_, p.w, xq, y + p.offset);
    else
        gemv(ctx_, p.w, xf, y + p.offset);
}

void LlamaCudaSession::enqueue_step(Head head, const TraceFn* trace, bool short_ctx) {
    const auto& c = cfg_;
    const cudaStream_t s = ctx_.stream();
    auto* ctl = ctl_.as<DecodeControl>();
    const int32_t* pos = &ctl->pos;
    float* x = x_.as<float>();
    float* h = h_.as<float>();
    float* xn = xn_.as<float>();
    float* q = qkv_.as<float>();
    float* k = q + c.q_dim();
    float* v = k + c.kv_dim();
    float* gate = gu_.as<float>();
    float* up = gate + c.n_ff;
    const int nctx = static_cast<int>(n_ctx_);
    const float scale = c.qk_scale();
    // The vector added to the residual stream: h, or (post-norms) its
    // normalized copy.
    float* hres = c.post_norms ? hpost_.as<float>() : h;
    const auto norm = [&](const float* w, bool residual) {
        rms_norm_q8_1(x, residual ? hres : nullptr, w, xn, xq_embd_.q(), xq_embd_.info(), 1, c.n_embd, c.rms_eps, s,
                      xq_embd_.q2(), xq_embd_.info2());
    };
    // A GEMV reading the normalized residual stream: xn / xq_embd_ as the
    // norm kernel left them, or (deferred) xq_embd_ without its scale.
    const bool fuse = fuse_norm_;
    const DeferredNormScale dn{ss_parts_.as<float>(), static_cast<int>(c.n_embd / 32), c.n_embd, c.rms_eps};
    const auto mm_normed = [&](const Piece& p, float* y, bool deferred) {
        if (deferred) gemv(ctx_, p.w, xq_embd_, y + p.offset, dn);
        else mm(p, xn, xq_embd_, y);
    };

    // QUERN_CUDA_SKIP=norm,attn,swiglu,qkv,wo,gateup,down,router leaves those
    // ops out of the step (gateup, swiglu and down cover the experts too;
    // router the expert layers' router GEMV): the output is wrong, the step
    // time tells what each op costs inside the replayed graph
    // (bench/decode-cuda-h200.md).
    static const std::string skip = [] {
        const char* e = std::getenv("QUERN_CUDA_SKIP");
        return std::string(e ? e : "");
    }();
    const auto sk = [&](const char* what) { return skip.find(what) != std::string::npos; };
    mark("start");
    // Layer 0's RMSNorm deferred like the others' where the GEMVs defer it:
    // the lookup leaves the activation as gemv_residual_norm would.
    const bool norm0 = fuse && c.embd_scale <= 0.0f && c.n_layer > 0;
    if (norm0)
        get_row_norm(embd_type_, embd_, c.n_vocab, c.n_embd, &ctl->cur, x, layers_[0].attn_norm, xq_embd_.q(),
                     xq_embd_.info(), xq_embd_.q2(), xq_embd_.info2(), ss_parts_.as<float>(), s);
    else
        get_row(embd_type_, embd_, c.n_vocab, c.n_embd, &ctl->cur, x, s);
    if (c.embd_scale > 0.0f) scale_softcap(x, c.n_embd, c.embd_scale, 0.0f, s);
    mark("embed");
    for (int64_t il = 0; il < c.n_layer; ++il) {
        const LayerWeights& L = layers_[static_cast<size_t>(il)];
        auto* kc = kv_.as<uint8_t>() + 2 * static_cast<size_t>(il) * kv_layer_bytes_;
        auto* vc = kc + kv_layer_bytes_;
        const bool deferred = fuse && (il > 0 || norm0);  // else layer 0's input comes from get_row
        if (!deferred && !sk("norm")) norm(L.attn_norm, il > 0);
        mark("norm");
        // Q|K and V of different types (Q4_K_M): one launch where a fused kernel exists.
        const bool pair = L.qkv.size() == 2 && gemv_takes_quantized_activation(L.qkv[0].w.type) &&
                          gemv_takes_quantized_activation(L.qkv[1].w.type);
        if (!sk("qkv") && pair)
            gemv_pair(ctx_, L.qkv[0].w, q + L.qkv[0].offset, L.qkv[1].w, q + L.qkv[1].offset, xq_embd_,
                      deferred ? &dn : nullptr);
        else if (!sk("qkv"))
            for (const Piece& p : L.qkv) mm_normed(p, q, deferred);
        mark("gemv_qkv");
        // RoPE, the KV-cache write and attention in one launch; it also
        // quantizes the output projection's activation.
        const bool qo = gemv_takes_quantized_activation(L.wo.w.type);
        AttentionExtras ex = attention_extras(L);
        ex.window = static_cast<int>(std::min<int64_t>(c.window(il), nctx));
        ex.softcap = c.attn_softcap;
        ex.one_split = short_ctx ? 1 : 0;
        const float* inv_freq = c.window(il) > 0 ? inv_freq_local_ : inv_freq_;
        if (!sk("attn")) decode_attention_rope(q, k, v, kc, vc, kv_type_, pos, nctx, static_cast<int>(c.n_head),
                              static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim), inv_freq,
                              static_cast<int>(c.rope_dim), c.rope_neox, scale, attn_scratch_.data(),
                              attn_.as<float>(), s, qo ? xq_attn_.q() : nullptr, qo ? xq_attn_.info() : nullptr,
                              qo ? xq_attn_.q2() : nullptr, qo ? xq_attn_.info2() : nullptr, ex);
        mark("attention");
        if (fuse) {  // x += W_o·a; the FFN norm's activation without its scale
            gemv_residual_norm(ctx_, L.wo.w, xq_attn_, x, L.ffn_norm, xq_embd_, ss_parts_.as<float>());
            mark("gemv_o");
        } else {
            if (!sk("wo")) mm(L.wo, attn_.as<float>(), xq_attn_, h);
            if (L.post_attn_norm)
                rms_norm_q8_1(h, nullptr, L.post_attn_norm, hres, nullptr, nullptr, 1, c.n_embd, c.rms_eps, s);
            mark("gemv_o");
            if (!sk("norm")) norm(L.ffn_norm, true);
            mark("norm");
        }
        if (L.moe) {
            // Mixture of experts, all on the device (the CPU's moe_ffn for one
            // row): router logits, moe_route writes the k ids and weights,
            // the indexed GEMVs read the ids, h = Σ_j w_j · expert_j.
            const int k = static_cast<int>(c.n_expert_used);
            const int64_t F = c.n_ff_exp;
            auto* ids = moe_ids_.as<int32_t>();
            float* eg = gu_.as<float>();  // k rows of F: the chosen experts' gate outputs
            float* eu = eg + k * F;       // and their up outputs
            float* ef = ffh_.as<float>();
            if (!sk("router")) mm(L.router, xn, xq_embd_, moe_logits_.as<float>());
            moe_route(moe_logits_.as<float>(), static_cast<int>(c.n_expert), k, c.expert_weights_norm, ids,
                      moe_w_.as<float>(), s);
            mark("moe_route");
            if (!sk("gateup")) {
                for (const auto& [bank, out] : {std::pair{&L.exp_gate, eg}, std::pair{&L.exp_up, eu}}) {
                    if (gemv_takes_quantized_activation(bank->type)) gemv_indexed(ctx_, *bank, F, xq_embd_, false, ids, k, out);
                    else gemv_indexed(ctx_, *bank, F, xn, false, ids, k, out);
                }
            }
            mark("gemv_gate_up");
            // One SwiGLU over the k·F elements; quantized as one row whose
            // slot s is elements s·F .. (gemv_indexed's per-slot layout).
            const bool qd = gemv_takes_quantized_activation(L.exp_down.type);
            if (!sk("swiglu"))
                swiglu_q8_1(eg, eu, ef, qd ? xq_moe_.q() : nullptr, qd ? xq_moe_.info() : nullptr, k * F, s,
                            qd ? xq_moe_.q2() : nullptr, qd ? xq_moe_.info2() : nullptr);
            mark("swiglu");
            float* ey = moe_y_.as<float>();
            if (!sk("down")) {
                if (qd) gemv_indexed(ctx_, L.exp_down, c.n_embd, xq_moe_, true, ids, k, ey);
                else gemv_indexed(ctx_, L.exp_down, c.n_embd, ef, true, ids, k, ey);
            }
            moe_weighted_sum(ey, moe_w_.as<float>(), k, c.n_embd, h, s);
            if (L.post_ffn_norm)
                rms_norm_q8_1(h, nullptr, L.post_ffn_norm, hres, nullptr, nullptr, 1, c.n_embd, c.rms_eps, s);
        } else {
            if (!sk("gateup"))
                for (const Piece& p : L.gate_up) mm_normed(p, gate, fuse);
            mark("gemv_gate_up");
            if (!sk("swiglu"))
                swiglu_q8_1(gate, up, ffh_.as<float>(), xq_ff_.q(), xq_ff_.info(), c.n_ff, s, xq_ff_.q2(),
                            xq_ff_.info2(), c.gelu_ffn);
            mark("swiglu");
            if (fuse) {  // x += W_down·f; the next norm's (next layer's or the output's) activation
                const float* next_norm =
                    il + 1 < c.n_layer ? layers_[static_cast<size_t>(il + 1)].attn_norm : out_norm_;
                gemv_residual_norm(ctx_, L.down.w, xq_ff_, x, next_norm, xq_embd_, ss_parts_.as<float>());
            } else if (!sk("down")) {
                mm(L.down, ffh_.as<float>(), xq_ff_, h);
                if (L.post_ffn_norm)
                    rms_norm_q8_1(h, nullptr, L.post_ffn_norm, hres, nullptr, nullptr, 1, c.n_embd, c.rms_eps, s);
            }
        }
        mark("gemv_down");
        if (trace) {  // residual stream after the layer: x (+ h when the add is folded into the next norm)
            std::vector<float> hx(static_cast<size_t>(c.n_embd)), hh(hx.size());
            x_.download(hx.data(), hx.size() * 4, s);
            if (!fuse) {
                QUERN_CUDA_CHECK(cudaMemcpyAsync(hh.data(), hres, hh.size() * 4, cudaMemcpyDeviceToHost, s));
                QUERN_CUDA_CHECK(cudaStreamSynchronize(s));
            }
            for (size_t i = 0; i < hx.size(); ++i) hx[i] += hh[i];
            (*trace)(fmt::format("blk.{}", il), hx.data(), c.n_embd);
        }
    }
    if (head) {
        if (!fuse) norm(out_norm_, true);
        mark("norm");
        mm_normed(output_, logits_.as<float>(), fuse);
        if (c.final_softcap > 0.0f) scale_softcap(logits_.as<float>(), c.n_vocab, 1.0f, c.final_softcap, s);
        mark("gemv_output");
        if (head == kSample) {
            sample_token(logits_.as<float>(), c.n_vocab, tokens_.as<int32_t>(), pos, nctx,
                         sampling_.as<DeviceSampling>(), &ctl->sampled, s);
            mark("sample");
        } else {  // argmax's final launch also ends the step
            argmax_advance(logits_.as<float>(), c.n_vocab, argmax_scratch_.data(), ctl, tokens_.as<int32_t>(), nctx,
                           host_out_dev_, s);
            mark("argmax");
            collect_profile(prof_decode_);
            return;
        }
    }
    advance_decode_position(ctl, tokens_.as<int32_t>(), nctx, s, host_out_dev_);
    mark("advance");
    collect_profile(prof_decode_);
}

void LlamaCudaSession::run_step(Head head, int64_t pos) {
    const cudaStream_t s = ctx_.stream();
    const bool sc = pos < short_ctx_;
    if (!opt_.cuda_graph || profile_) return enqueue_step(head, nullptr, sc);
    cudaGraphExec_t& ge = graph_[head][sc ? 1 : 0];
    if (!ge) {
        cudaGraph_t g = nullptr;
        QUERN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        try {
            enqueue_step(head, nullptr, sc);
        } catch (...) {
            cudaStreamEndCapture(s, &g);
            if (g) cudaGraphDestroy(g);
            cudaGetLastError();
            throw;
        }
        QUERN_CUDA_CHECK(cudaStreamEndCapture(s, &g));
        const cudaError_t e = cudaGraphInstantiate(&ge, g, 0);
        cudaGraphDestroy(g);
        QUERN_CUDA_CHECK(e);
    }
    QUERN_CUDA_CHECK(cudaGraphLaunch(ge, s));
}

void LlamaCudaSession::select_rope(int64_t last) {
    const auto& c = cfg_;
    if (c.longrope()) {  // the call's last position decides, as the CPU forward pass
        const bool lg = (rope_call_last_ >= 0 ? rope_call_last_ : last) >= c.rope_orig_ctx;
        if (lg != rope_long_live_) {
            QUERN_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(inv_freq_), lg ? rope_long_ : rope_short_,
                                             static_cast<size_t>(c.rope_dim / 2) * sizeof(float),
                                             cudaMemcpyDeviceToDevice, ctx_.stream()));
            rope_long_live_ = lg;
        }
    }
}

void LlamaCudaSession::begin(const int32_t* tokens, int64_t n) {
    fed_ = false;
    select_rope(n_past_ + n - 1);
    auto* ht = host_tokens_.as<int32_t>();
    std::memcpy(ht, tokens, static_cast<size_t>(n) * sizeof(int32_t));
    const cudaStream_t s = ctx_.stream();
    QUERN_CUDA_CHECK(cudaMemcpyAsync(tokens_.as<int32_t>() + n_past_, ht, static_cast<size_t>(n) * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, s));
    auto* hc = host_ctl_.as<DecodeControl>();
    *hc = DecodeControl{static_cast<int32_t>(n_past_), tokens[0], static_cast<int32_t>(n_past_ + n), 0};
    QUERN_CUDA_CHECK(cudaMemcpyAsync(ctl_.data(), hc, sizeof(DecodeControl), cudaMemcpyHostToDevice, s));
}

void LlamaCudaSession::eval(const int32_t* tokens, int64_t n, float* logits) {
    check_tokens(tokens, n);
    if (n == 0) return;
    fed_ = false;
    if (use_prefill(n) && ensure_prefill_scratch()) return prefill(tokens, n, logits);
    begin(tokens, n);
    for (int64_t i = 0; i < n; ++i) run_step(i == n - 1 ? kArgmax : kNoHead, n_past_ + i);
    n_past_ += n;
    if (logits) {
        QUERN_CUDA_CHECK(cudaMemcpyAsync(logits, logits_.data(), static_cast<size_t>(cfg_.n_vocab) * sizeof(float),
                                         cudaMemcpyDeviceToHost, ctx_.stream()));
    }
    ctx_.synchronize();
}

void LlamaCudaSession::begin_one(int32_t token) {
    if (fed_ && fed_pos_ == n_past_ && fed_tok_ == token) {
        select_rope(n_past_);
        return;
    }
    begin(&token, 1);
}

int32_t LlamaCudaSession::eval_greedy(int32_t token) {
    check_tokens(&token, 1);
    begin_one(token);
    const int64_t p = n_past_;
    run_step(kArgmax, p);
    n_past_ = p + 1;
    ctx_.synchronize();
    return took_step(p);
}

int32_t LlamaCudaSession::took_step(int64_t p) {
    const int32_t t = *reinterpret_cast<volatile int32_t*>(host_out_.as<int32_t>() + (p & 1));
    fed_ = true;
    fed_pos_ = n_past_;
    fed_tok_ = t;
    return t;
}

int32_t LlamaCudaSession::eval_sample(int32_t token, Sampler& sampler) {
    const SamplingParams& sp = sampler.params();
    const bool pen = sp.repeat_penalty != 1.0f || sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f;
    if (!device_sampling_supported(sp.top_k, sp.repeat_last_n, pen) || std::getenv("QUERN_CUDA_HOST_SAMPLING"))
        return Session::eval_sample(token, sampler);  // top-k off or too large, or a long penalty window
    check_tokens(&token, 1);
    auto* hp = host_sampling_.as<DeviceSampling>();
    *hp = DeviceSampling{sp.temperature,      sp.top_k,          sp.top_p,
                         sp.min_p,            sp.repeat_penalty, sp.presence_penalty,
                         sp.frequency_penalty, sp.repeat_last_n, 0.0};
    if (sp.temperature > 0.0f) hp->u = sampler.draw();  // Sampler::sample draws only then
    const cudaStream_t s = ctx_.stream();
    QUERN_CUDA_CHECK(cudaMemcpyAsync(sampling_.data(), hp, sizeof(DeviceSampling), cudaMemcpyHostToDevice, s));
    begin_one(token);
    const int64_t p = n_past_;
    run_step(kSample, p);
    n_past_ = p + 1;
    ctx_.synchronize();
    return took_step(p);
}

void LlamaCudaSession::eval_traced(const int32_t* tokens, int64_t n, float* logits, const TraceFn& trace) {
    check_tokens(tokens, n);
    if (n == 0) return;
    rope_call_last_ = n_past_ + n - 1;  // LongRoPE: one choice for the whole call, as the CPU
    try {
        if (n > 1) eval(tokens, n - 1, nullptr);
        begin(tokens + n - 1, 1);
    } catch (...) {
        rope_call_last_ = -1;
        throw;
    }
    rope_call_last_ = -1;
    enqueue_step(kArgmax, &trace);
    n_past_ += 1;
    std::vector<float> host(static_cast<size_t>(cfg_.n_vocab));
    logits_.download(host.data(), host.size() * sizeof(float), ctx_.stream());
    trace("logits", host.data(), cfg_.n_vocab);
    if (logits) std::copy(host.begin(), host.end(), logits);
}

bool LlamaCudaSession::use_prefill(int64_t n) const { return prefill_supported_ && n >= kPrefillMinTokens; }

bool LlamaCudaSession::ensure_prefill_scratch() {
    if (gemm_) return true;
    try {
        const auto& c = cfg_;
        // (65535: the prefill kernels' grid.y limit on rows.)
        // QUERN_CUDA_PREFILL_CHUNK=N overrides the rows per chunk (for measuring).
        int64_t chunk = opt_.prefill_chunk;
        if (const char* e = std::getenv("QUERN_CUDA_PREFILL_CHUNK"); e && std::atoll(e) > 0) chunk = std::atoll(e);
        // A batch runner's passes hold many sequences: its own (unused) cache
        // does not bound them.
        const int64_t R = std::min<int64_t>({chunk, batch_runner_ ? chunk : n_ctx_, 65535});
        const auto fb = [&](int64_t cols) { return DeviceBuffer(static_cast<size_t>(R * cols) * sizeof(float)); };
        px_ = fb(c.n_embd);
        ph_ = fb(c.n_embd);
        if (c.post_norms) phpost_ = fb(c.n_embd);
        pqkv_ = fb(c.q_dim() + 2 * c.kv_dim());
        pattn_ = fb(c.q_dim());
        pgu_ = fb(2 * c.n_ff);
        if (c.moe()) {
            const int64_t m = R * c.n_expert_used + 16;
            pmoe_logits_ = fb(c.n_expert);
            pmoe_xg_ = DeviceBuffer(static_cast<size_t>(m * c.n_embd) * 2);
            pmoe_gu_ = DeviceBuffer(static_cast<size_t>(m * 2 * c.n_ff_exp) * sizeof(float));
            pmoe_g_ = DeviceBuffer(static_cast<size_t>(m * c.n_ff_exp) * 2);
            pmoe_y_ = DeviceBuffer(static_cast<size_t>(m * c.n_embd) * sizeof(float));
            pmoe_route_ = DeviceBuffer(static_cast<size_t>(4 * m + c.n_expert + 1) * 4);
            // Rows past a chunk's own are read by the padded expert GEMMs
            // (their outputs are never used): zeros rather than whatever
            // the allocation held.
            pmoe_xg_.fill_bytes(0, ctx_.stream());
            pmoe_g_.fill_bytes(0, ctx_.stream());
            hmoe_logits_ = PinnedBuffer(static_cast<size_t>(R * c.n_expert) * sizeof(float));
            hmoe_route_ = PinnedBuffer(static_cast<size_t>(3 * m) * 4);
        }
        // Weight tiles big enough for a whole layer matrix up to 64·2^20
        // elements (two tiles of 128 MB at most): one GEMM per matrix rather
        // than one per 16·2^20-element tile (H200, llama3-8b Q4_K_M pp512:
        // 19.6k tok/s with 16·2^20, 21.9k with 64·2^20).
        // QUERN_CUDA_PREFILL_TILE=M: tiles of M·2^20 elements (for measuring).
        const int64_t max_k = std::max({c.n_embd, c.q_dim(), c.n_ff, c.n_ff_exp});
        const int64_t max_rows = std::max({c.q_dim() + 2 * c.kv_dim(), c.n_embd, c.n_ff, c.n_ff_exp});
        int64_t tile = std::min(int64_t{64} << 20, (max_rows + 255) / 256 * 256 * max_k);
        if (const char* e = std::getenv("QUERN_CUDA_PREFILL_TILE"); e && std::atoll(e) > 0) tile = std::atoll(e) << 20;
        gemm_ = std::make_unique<PrefillGemm>(R, max_k, std::max(tile, max_k));
        if (profile_) gemm_->set_phase_hook([this](const char* phase) { mark(phase); });
        gemm_->set_verbose(opt_.verbose);
        prefill_rows_ = R;
    } catch (const Error& e) {
        // Out of device memory (e.g. --gpu-mem gave it all to the KV cache):
        // prompts go token by token, as before.
        cudaGetLastError();
        gemm_.reset();
        px_ = DeviceBuffer(), ph_ = DeviceBuffer(), phpost_ = DeviceBuffer();
        pqkv_ = DeviceBuffer(), pattn_ = DeviceBuffer(), pgu_ = DeviceBuffer();
        pmoe_logits_ = DeviceBuffer(), pmoe_xg_ = DeviceBuffer(), pmoe_gu_ = DeviceBuffer(), pmoe_g_ = DeviceBuffer();
        pmoe_y_ = DeviceBuffer(), pmoe_route_ = DeviceBuffer();
        hmoe_logits_ = PinnedBuffer(), hmoe_route_ = PinnedBuffer();
        prefill_supported_ = false;
        if (opt_.verbose)
            std::fprintf(stderr, "quern: no GPU memory for the batched prefill (%s); prompts run token by token\n",
                         e.what());
        return false;
    }
    return true;
}

AttentionExtras LlamaCudaSession::attention_extras(const LayerWeights& L) const {
    const auto& c = cfg_;
    AttentionExtras ex;
    if (L.qkv_bias) {
        ex.q_bias = L.qkv_bias;
        ex.k_bias = L.qkv_bias + c.q_dim();
        ex.v_bias = L.qkv_bias + c.q_dim() + c.kv_dim();
    }
    ex.q_norm = L.q_norm;
    ex.k_norm = L.k_norm;
    ex.norm_eps = c.rms_eps;
    return ex;
}

void LlamaCudaSession::prefill_chunk(int64_t pos0, int64_t n, bool head) {
    layer_rows(tokens_.as<int32_t>() + pos0, n, pos0, nullptr);
    const auto& c = cfg_;
    const cudaStream_t s = ctx_.stream();
    const int64_t E = c.n_embd;
    float* X = px_.as<float>();
    const float* HRES = c.post_norms ? phpost_.as<float>() : ph_.as<float>();
    if (head) {  // the last row only, through the decode step's output GEMV
        float* xl = X + (n - 1) * E;
        const float* hl = HRES + (n - 1) * E;
        rms_norm_q8_1(xl, hl, out_norm_, xn_.as<float>(), xq_embd_.q(), xq_embd_.info(), 1, E, c.rms_eps, s,
                      xq_embd_.q2(), xq_embd_.info2());
        mm(output_, xn_.as<float>(), xq_embd_, logits_.as<float>());
        if (c.final_softcap > 0.0f) scale_softcap(logits_.as<float>(), c.n_vocab, 1.0f, c.final_softcap, s);
        mark("head");
    }
    if (profile_) {
        collect_profile(prof_prefill_);
        prof_prefill_.rows += n;
    }
}

void LlamaCudaSession::layer_rows(const int32_t* dtokens, int64_t n, int64_t pos0, const PagedRows* paged) {
    const auto& c = cfg_;
    const cudaStream_t s = ctx_.stream();
    const int64_t E = c.n_embd, QD = c.q_dim(), FF = c.n_ff, LQ = c.q_dim() + 2 * c.kv_dim();
    float* X = px_.as<float>();
    float* H = ph_.as<float>();
    float* HRES = c.post_norms ? phpost_.as<float>() : H;  // what is added to the residual stream
    float* QKV = pqkv_.as<float>();
    float* ATT = pattn_.as<float>();
    float* GU = pgu_.as<float>();
    const int nctx = static_cast<int>(n_ctx_);
    const int rows = static_cast<int>(n);

    mark("start");
    get_rows(embd_type_, embd_, c.n_vocab, E, dtokens, n, X, s);
    if (c.embd_scale > 0.0f) scale_softcap(X, n * E, c.embd_scale, 0.0f, s);
    mark("embed");
    for (int64_t il = 0; il < c.n_layer; ++il) {
        const LayerWeights& L = layers_[static_cast<size_t>(il)];
        auto* kc = paged ? pkv_.as<uint8_t>() + 2 * static_cast<size_t>(il) * pkv_layer_bytes_
                         : kv_.as<uint8_t>() + 2 * static_cast<size_t>(il) * kv_layer_bytes_;
        auto* vc = kc + (paged ? pkv_layer_bytes_ : kv_layer_bytes_);
        // Layer 0 reads the embeddings; later layers add the previous FFN output first.
        // The norms write the GEMM input in BF16 themselves (one rounding for
        // all Q|K|V or gate|up pieces), and so does the FFN gating.
        uint16_t* xb = gemm_->act_bf16();
        rms_norm_bf16(X, il > 0 ? HRES : nullptr, L.attn_norm, xb, n, E, c.rms_eps, s);
        mark("norm");
        // The fused copy unless the pieces go through bq_gemm at this size;
        // for Q|K|V past 16 rows also when a piece is under 8k rows (one GEMM
        // on the 6k-row copy beats three bq products there; H200: ~17 against
        // ~30 us for Llama-3-8B at 32 rows).
        const auto fused = [&](const DeviceWeight& f, const std::vector<Piece>& ps, bool qkv) {
            if (!f.bf16) return false;
            const auto bq = [&](const Piece& p) { return PrefillGemm::uses_bq(p.w, n); };
            const auto small = [](const Piece& p) { return p.w.N < 8192; };
            return !std::any_of(ps.begin(), ps.end(), bq) ||
                   (qkv && n > 16 && std::any_of(ps.begin(), ps.end(), small));
        };
        if (fused(L.qkv_bf16, L.qkv, true)) gemm_->run_bf16(L.qkv_bf16, xb, n, QKV, LQ, s);
        else for (const Piece& p : L.qkv) gemm_->run_bf16(p.w, xb, n, QKV + p.offset, LQ, s);
        AttentionExtras ex = attention_extras(L);
        const float* inv_freq = c.window(il) > 0 ? inv_freq_local_ : inv_freq_;
        if (paged && c.longrope()) inv_freq = rope_short_;  // rows with pr.rope_long set take rope_long_
        // The paged attention leaves its output in BF16 as the output
        // projection's input (no separate rounding pass).
        PagedRows pr = paged ? *paged : PagedRows{};
        pr.out_bf16 = xb;
        if (paged && paged->one_row_per_seq && rope_fold_) {
            // Decode rows: RoPE, the KV write and the attention in one launch.
            paged_rope_attention(QKV, LQ, kc, vc, KvType::F16, rows, pr, static_cast<int>(c.n_head),
                                 static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim), c.qk_scale(),
                                 static_cast<int>(c.window(il)), c.attn_softcap, inv_freq,
                                 static_cast<int>(c.rope_dim), c.rope_neox, ex, ATT, QD, s);
        } else if (paged) {
            paged_rope_kv_store(QKV, LQ, rows, *paged, kc, vc, KvType::F16, static_cast<int>(c.n_head),
                                static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim), inv_freq,
                                static_cast<int>(c.rope_dim), c.rope_neox, ex, s);
            mark("rope_kv");
            paged_attention(QKV, LQ, kc, vc, KvType::F16, rows, pr, static_cast<int>(c.n_head),
                            static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim), c.qk_scale(),
                            static_cast<int>(c.window(il)), c.attn_softcap, ATT, QD, s);
        } else {
            prefill_rope_kv_store(QKV, LQ, rows, static_cast<int>(pos0), kc, vc, kv_type_, nctx,
                                  static_cast<int>(c.n_head), static_cast<int>(c.n_head_kv),
                                  static_cast<int>(c.head_dim), inv_freq, static_cast<int>(c.rope_dim), c.rope_neox,
                                  ex, s);
            mark("rope_kv");
            prefill_attention(QKV, LQ, kc, vc, kv_type_, rows, static_cast<int>(pos0), nctx,
                              static_cast<int>(c.n_head), static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim),
                              c.qk_scale(), static_cast<int>(std::min<int64_t>(c.window(il), nctx)), c.attn_softcap,
                              ATT, QD, s);
        }
        mark("attention");
        if (paged) gemm_->run_bf16(L.wo.w, xb, n, H, E, s);
        else gemm_->run(L.wo.w, ATT, QD, n, H, E, s);
        if (L.post_attn_norm) rms_norm_q8_1(H, nullptr, L.post_attn_norm, HRES, nullptr, nullptr, n, E, c.rms_eps, s);
        rms_norm_bf16(X, HRES, L.ffn_norm, xb, n, E, c.rms_eps, s);
        mark("norm");
        if (L.moe) {
            prefill_moe(L, xb, n, H);
        } else {
            // Gate and up on bq_gemm (a [gate | up] piece, or two pieces of
            // one bq width): the gated values come out of that launch, in
            // GU's memory as the down projection's BF16 input.
            const std::vector<Piece>& gu = L.gate_up;
            const bool glu_bq =
                bq_glu_ && !fused(L.gate_up_bf16, gu, false) &&
                std::all_of(gu.begin(), gu.end(), [&](const Piece& p) { return PrefillGemm::uses_bq(p.w, n); }) &&
                ((gu.size() == 1 && gu[0].w.N == 2 * FF && FF % 16 == 0) ||
                 (gu.size() == 2 && gu[0].w.N == FF && gu[1].w.N == FF)) &&
                bq_glu_supported(gu.front().w, gu.back().w, n);
            if (glu_bq) {
                auto* hb = reinterpret_cast<uint16_t*>(GU);
                bq_gemm_glu(gu.front().w, 0, gu.back().w, gu.size() == 1 ? FF : 0, FF, xb, n, hb, FF, c.gelu_ffn, s);
                mark("glu");
                gemm_->run_bf16(L.down.w, hb, n, H, E, s);
            } else {
                if (fused(L.gate_up_bf16, gu, false)) gemm_->run_bf16(L.gate_up_bf16, xb, n, GU, 2 * FF, s);
                else for (const Piece& p : gu) gemm_->run_bf16(p.w, xb, n, GU + p.offset, 2 * FF, s);
                glu_rows_bf16(GU, 2 * FF, n, FF, xb, c.gelu_ffn, s);
                mark("glu");
                gemm_->run_bf16(L.down.w, xb, n, H, E, s);
            }
        }
        if (L.post_ffn_norm) rms_norm_q8_1(H, nullptr, L.post_ffn_norm, HRES, nullptr, nullptr, n, E, c.rms_eps, s);
        mark("norm");
    }
}

bool LlamaCudaSession::moe_on_device(const LayerWeights& L) const {
    const auto grouped = [](const DeviceWeight& b) { return b.bq || dq_grouped_supported(b.type, b.K); };
    return moe_grouped_ && grouped(L.exp_gate) && grouped(L.exp_up) && grouped(L.exp_down);
}

void LlamaCudaSession::prefill_moe(const LayerWeights& L, const uint16_t* xb, int64_t n, float* out) {
    const auto& c = cfg_;
    const cudaStream_t s = ctx_.stream();
    const int k = static_cast<int>(c.n_expert_used);
    const int64_t NE = c.n_expert, F = c.n_ff_exp, E = c.n_embd, m = n * k;
    float* logits = pmoe_logits_.as<float>();
    gemm_->run_bf16(L.router.w, xb, n, logits, NE, s);
    // Route arrays on the device: [pos (m) | src (m) | weights (m floats) |
    // offsets (NE + 1) | ids (m)].
    auto* dr = pmoe_route_.as<int32_t>();
    int32_t* dpos = dr;
    int32_t* dsrc = dr + m;
    auto* dw = reinterpret_cast<float*>(dr + 2 * m);
    int32_t* doff = dr + 3 * m;
    auto* xg = pmoe_xg_.as<uint16_t>();
    float* gu = pmoe_gu_.as<float>();
    auto* g = pmoe_g_.as<uint16_t>();
    float* y = pmoe_y_.as<float>();
    // Every expert of a bank is multiplied in one launch and the tokens are
    // routed and grouped on the device: no host round trip. A bank with a bq
    // layout (the 4- to 6-bit types) multiplies it (bq_gemm_grouped), any
    // other bank decodes its resident layout to BF16 tile by tile
    // (dq_gemm_grouped). On an H200, qwen3-30b-a3b Q4_K_M: pp512 21.7k tok/s,
    // pp2048 26.5k, against 3.8k and 7.1k with one GEMM per expert and host
    // routing. The groups' sizes stay on the device, so the grid covers the
    // largest possible group (n rows); blocks past a group's end leave at
    // once.
    if (moe_on_device(L)) {
        const auto grouped = [&](const DeviceWeight& b, int64_t rows, const uint16_t* x, float* yo, int64_t ldy) {
            if (b.bq) bq_gemm_grouped(b, rows, doff, NE, n, x, yo, ldy, s);
            else dq_gemm_grouped(b, rows, doff, NE, n, (m + NE - 1) / NE, x, yo, ldy, s);
        };
        int32_t* ids = doff + NE + 1;
        moe_route_rows(logits, n, static_cast<int>(NE), k, c.expert_weights_norm, ids, dw, s);
        moe_group_rows(ids, n, k, static_cast<int>(NE), dpos, dsrc, doff, s);
        gather_rows_bf16(xb, E, dsrc, m, xg, s);
        mark("moe_route");
        grouped(L.exp_gate, F, xg, gu, 2 * F);
        grouped(L.exp_up, F, xg, gu + F, 2 * F);
        glu_rows_bf16(gu, 2 * F, m, F, g, c.gelu_ffn, s);
        grouped(L.exp_down, E, g, y, E);
        moe_weighted_sum_rows(y, dpos, dw, n, k, E, out, s);
        mark("moe_experts");
        return;
    }
    // Otherwise (QUERN_CUDA_MOE_GROUPED=0, or a float bank with rows of K %
    // 32 != 0) one GEMM per expert, whose sizes the host needs: the router
    // logits go to the host and are routed and grouped there by the CPU's own
    // moe_route / moe_group (one synchronisation per layer).
    auto* hl = hmoe_logits_.as<float>();
    QUERN_CUDA_CHECK(cudaMemcpyAsync(hl, logits, static_cast<size_t>(n * NE) * sizeof(float), cudaMemcpyDeviceToHost, s));
    ctx_.synchronize();
    mark("moe_router");
    std::vector<int32_t> ids(static_cast<size_t>(m));
    auto* hr = hmoe_route_.as<int32_t>();  // [pos (m) | src (m) | weights (m floats)]
    auto* hw = reinterpret_cast<float*>(hr + 2 * m);
    quern::moe_route(hl, n, NE, k, c.expert_weights_norm, ids.data(), hw);
    std::vector<int64_t> offsets, entries;
    quern::moe_group(ids.data(), n, k, NE, offsets, entries);
    for (int64_t x = 0; x < m; ++x) {
        const int64_t e = entries[static_cast<size_t>(x)];
        hr[e] = static_cast<int32_t>(x);          // entry (row, slot) -> its grouped row
        hr[m + x] = static_cast<int32_t>(e / k);  // grouped row -> the activation row it reads
    }
    QUERN_CUDA_CHECK(cudaMemcpyAsync(dr, hr, static_cast<size_t>(3 * m) * 4, cudaMemcpyHostToDevice, s));
    gather_rows_bf16(xb, E, dsrc, m, xg, s);
    mark("moe_route");
    // Each expert's rows, rounded up to a multiple of 16 (fewer distinct GEMM
    // shapes to plan): the extra rows belong to the next experts, whose own
    // GEMMs overwrite them later in stream order, or to the 16 rows of
    // padding; rows never mix in a GEMM, so they cannot disturb the others.
    const auto rows_of = [&](int64_t x) {
        return std::min<int64_t>((offsets[static_cast<size_t>(x) + 1] - offsets[static_cast<size_t>(x)] + 15) / 16 * 16,
                                 prefill_rows_);
    };
    for (int64_t x = 0; x < NE; ++x) {
        const int64_t o = offsets[static_cast<size_t>(x)];
        if (offsets[static_cast<size_t>(x) + 1] == o) continue;
        const int64_t r = rows_of(x);
        gemm_->run_bf16_rows(L.exp_gate, x * F, F, xg + o * E, r, gu + o * 2 * F, 2 * F, s);
        gemm_->run_bf16_rows(L.exp_up, x * F, F, xg + o * E, r, gu + o * 2 * F + F, 2 * F, s);
    }
    glu_rows_bf16(gu, 2 * F, m, F, g, c.gelu_ffn, s);
    for (int64_t x = 0; x < NE; ++x) {
        const int64_t o = offsets[static_cast<size_t>(x)];
        if (offsets[static_cast<size_t>(x) + 1] == o) continue;
        gemm_->run_bf16_rows(L.exp_down, x * E, E, g + o * F, rows_of(x), y + o * E, E, s);
    }
    moe_weighted_sum_rows(y, dpos, dw, n, k, E, out, s);
    mark("moe_experts");
}

void LlamaCudaSession::prefill(const int32_t* tokens, int64_t n, float* logits) {
    begin(tokens, n);  // the ids on the device (get_row reads them; the sampler's penalties later)
    for (int64_t c0 = 0; c0 < n; c0 += prefill_rows_) {
        const int64_t m = std::min(prefill_rows_, n - c0);
        prefill_chunk(n_past_ + c0, m, logits != nullptr && c0 + m == n);
    }
    n_past_ += n;
    if (logits) {
        QUERN_CUDA_CHECK(cudaMemcpyAsync(logits, logits_.data(), static_cast<size_t>(cfg_.n_vocab) * sizeof(float),
                                         cudaMemcpyDeviceToHost, ctx_.stream()));
    }
    ctx_.synchronize();
}

// ---------------------------------------------------------------- batches

// bq layouts of the expert banks (5.5 or 11 bits per weight, on top of the
// banks themselves), which the grouped expert products of a prompt chunk
// read instead of decoding the bank's own layout (prefill_moe: on an H200
// bq_gemm_grouped is the faster of the two for the types it takes). Made
// after every weight is uploaded, bank by bank while half of the GPU's
// memory stays free (for the KV cache and the rest); a bank without one
// (another type, or no room) goes through dq_gemm_grouped.
// QUERN_CUDA_MOE_BQ=0: none.
void LlamaCudaSession::make_expert_bq() {
    const auto& c = cfg_;
    const char* e = std::getenv("QUERN_CUDA_MOE_BQ");
    if (e && *e == '0') return;
    for (auto& L : layers_) {
        const std::pair<DeviceWeight*, int64_t> banks[] = {
            {&L.exp_gate, c.n_ff_exp}, {&L.exp_up, c.n_ff_exp}, {&L.exp_down, c.n_embd}};
        for (const auto& [b, rows] : banks) {
            if (!b->q || b->bq || rows % 16 != 0 || !bq_supported(b->type, b->K)) continue;
            size_t free_b = 0, total_b = 0;
            QUERN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
            if (free_b < bq_bytes(*b) + total_b / 2) return;
            try {
                make_resident_bq(*b, ctx_.stream());
            } catch (const Error&) {
                cudaGetLastError();
                b->bq_buf = DeviceBuffer(), b->bq = nullptr, b->bq_bits = 0;
                return;
            }
        }
    }
}

void LlamaCudaSession::prepare_batches() {
    if (batches_ready_) return;
    batch_runner_ = true;
    if (!prefill_supported_ || !ensure_prefill_scratch())
        fail("no batched GPU path for this model (a weight type without a GPU GEMM, heads of {} elements, or no "
             "GPU memory for the pass scratch); serve it with --device cpu",
             cfg_.head_dim);
    // The head's buffers (up to 256 rows at a time) before the copies below.
    bhead_x_ = DeviceBuffer(static_cast<size_t>(kHeadRows * cfg_.n_embd) * 2);
    // Scratch for attention with the keys split across blocks (up to 8
    // ranges for passes of up to kSplitRows rows: decode steps).
    bsplit_floats_ = kSplitRows * cfg_.n_head * 8 * (cfg_.head_dim + 2);
    bsplit_ = DeviceBuffer(static_cast<size_t>(bsplit_floats_) * 4);
    blogits_ = DeviceBuffer(static_cast<size_t>(kHeadRows * cfg_.n_vocab) * 4);
    bgreedy_ = DeviceBuffer(kHeadRows * 4);
    bargmax_ = DeviceBuffer(argmax_rows_scratch_bytes(kHeadRows));
    hgreedy_ = PinnedBuffer(kHeadRows * 4);
    // Resident BF16 copies of the dense matrices and the output head: every
    // pass multiplies them directly instead of dequantizing the model again
    // (expert banks stay quantized: too large to double). A quarter of the
    // GPU's memory stays free for the KV cache and the passes' scratch; the
    // copies stop at the first that would not leave it, and the rest are
    // dequantized per pass as the prefill does.
    size_t free_b = 0, total_b = 0;
    QUERN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const size_t keep = total_b / 4;
    size_t bytes = 0, bq_total = 0;  // all copies; the bq layouts among them
    // First the small-batch (bq) layouts of the quantized matrices (5.5 or
    // 11 bits per weight): passes of few rows read those instead of the
    // 16-bit copies (PrefillGemm::uses_bq says up to how many; on an H200
    // decode of one sequence in a batch runs 1.3× faster, of 8 1.26×), and
    // where no BF16 copy fits, passes of up to 64 rows. QUERN_CUDA_BQ=0:
    // none.
    // Makes one more copy of `need` bytes with make() while a quarter of the
    // memory stays free; the first that does not fit (or fails) clears `room`.
    const auto copy_if_room = [&](bool& room, size_t need, const auto& make) {
        if (!room) return;
        if (bytes + need + keep > free_b) {
            room = false;
            return;
        }
        try {
            make();
            bytes += need;
        } catch (const Error&) {
            cudaGetLastError();
            room = false;
        }
    };
    const char* bq_env = std::getenv("QUERN_CUDA_BQ");
    if (!(bq_env && *bq_env == '0')) {
        bool room = true;
        const auto small = [&](DeviceWeight& w) {
            if (!w.q || w.fp8_row_scaled || !bq_supported(w.type, w.K)) return;
            copy_if_room(room, bq_bytes(w), [&] { make_resident_bq(w, ctx_.stream()); });
        };
        for_each_layer_matrix(small, /*experts=*/false);
        small(output_.w);
    }
    bq_total = bytes;
    bool full = true;
    // The Q|K|V and the gate|up pieces of a layer share one copy, rows
    // stacked in output order: one GEMM per group instead of one per piece
    // (at 32 rows the three products of 4096, 1024 and 1024 rows cost ~2.4×
    // one of 6144). Passes the pieces' bq layouts take multiply piece by
    // piece, except Q|K|V past 16 rows (layer_rows).
    const auto fuse = [&](std::vector<Piece>& ps, DeviceWeight& fused) {
        if (!full || ps.size() < 2) return;
        int64_t rows = 0;
        for (const Piece& p : ps) {
            if (!p.w.q || p.w.bf16 || p.w.fp8_row_scaled || !gemm_weight_type_supported(p.w.type) ||
                p.w.K != ps[0].w.K || p.offset != rows)
                return;
            rows += p.w.N;
        }
        const int64_t K = ps[0].w.K;
        copy_if_room(full, static_cast<size_t>(rows * K) * 2, [&] {
            DeviceBuffer b(static_cast<size_t>(rows * K) * 2);
            for (Piece& p : ps) {
                uint16_t* at = b.as<uint16_t>() + p.offset * K;
                dequantize_weight_bf16(p.w, 0, p.w.N, at, ctx_.stream());
                p.w.bf16 = at;  // owned by `fused`
            }
            ctx_.synchronize();
            fused.type = DType::BF16;
            fused.K = K;
            fused.N = rows;
            fused.bf16_buf = std::move(b);
            fused.bf16 = fused.bf16_buf.as<uint16_t>();
            fused.q = fused.bf16_buf.data();
        });
    };
    for (auto& L : layers_) {
        fuse(L.qkv, L.qkv_bf16);
        fuse(L.gate_up, L.gate_up_bf16);
    }
    const auto resident = [&](DeviceWeight& w) {
        if (!w.q || w.bf16 || w.fp8_row_scaled || !gemm_weight_type_supported(w.type)) return;
        copy_if_room(full, static_cast<size_t>(w.N * w.K) * 2, [&] { make_resident_bf16(w, ctx_.stream()); });
    };
    for_each_layer_matrix(resident, /*experts=*/false);
    for (auto& L : layers_)
        if (L.moe) resident(L.router.w);
    resident(output_.w);
    // Graphs for passes of single rows, where no product of such a pass
    // dequantizes tiles on the second stream (the products' own streams and
    // events would fall outside the graph) and expert layers group on the
    // device (no host round trip inside).
    {
        const char* e = std::getenv("QUERN_CUDA_BATCH_GRAPH");
        bool copies = true, small = true;
        const auto check = [&](DeviceWeight& w) {
            if (!w.q || w.fp8_row_scaled) return;
            copies = copies && w.bf16;
            small = small && (w.bf16 || w.bq);
        };
        for_each_layer_matrix(check, /*experts=*/false);
        bool grouped = true;
        for (auto& L : layers_) {
            if (!L.moe) continue;
            check(L.router.w);
            grouped = grouped && moe_on_device(L);
        }
        graph_rows_ = (!opt_.cuda_graph || (e && *e == '0') || !grouped) ? 0 : copies ? kGraphRows : small ? kBqMaxRows : 0;
        graph_rows_ = std::min(graph_rows_, prefill_rows_);
        if (graph_rows_ > 0) bgints_ = DeviceBuffer(static_cast<size_t>(kGraphInts) * 4);
    }
    if (opt_.verbose && bq_total > 0)
        std::fprintf(stderr, "quern: %.2f GiB of small-batch weight layouts on the GPU\n", gib(static_cast<double>(bq_total)));
    if (opt_.verbose)
        std::fprintf(stderr, "quern: %.2f GiB of BF16 weight copies on the GPU for batches%s\n", gib(static_cast<double>(bytes - bq_total)),
                     full ? "" : " (no more fit beside a free quarter of GPU memory: the rest are dequantized per pass)");
    batches_ready_ = true;
}

std::unique_ptr<PagedKvPool> LlamaCudaSession::make_kv_pool(int64_t n_blocks, int64_t block_size, const char* flag) {
    const auto& c = cfg_;
    if (n_blocks < 1 || block_size < 1) fail("paged KV cache: bad sizes ({} blocks of {})", n_blocks, block_size);
    // One block more than the pool hands out: the padding rows of captured
    // passes write their keys there (block n_blocks, owned by no sequence).
    const size_t layer = static_cast<size_t>((n_blocks + 1) * block_size * c.kv_dim()) * 2;  // f16
    clear_batch_graphs();  // they name the old pool
    try {
        pkv_ = DeviceBuffer();  // an earlier pool's memory first (engines made in turn on one runner)
        pkv_ = DeviceBuffer(2 * static_cast<size_t>(c.n_layer) * layer);
    } catch (const Error&) {
        cudaGetLastError();
        fail("the KV cache of {} positions needs {:.2f} GiB of GPU memory, more than is free; lower {}",
             n_blocks * block_size, gib(2.0 * static_cast<double>(c.n_layer) * static_cast<double>(layer)), flag);
    }
    pkv_layer_bytes_ = layer;
    pkv_blocks_ = n_blocks;
    pkv_block_size_ = block_size;
    return std::make_unique<PagedKvPool>(c.n_layer, c.kv_dim(), n_blocks, block_size, /*host_storage=*/false);
}

void LlamaCudaSession::forward_batch(const SeqBatch* seqs, int n_seqs, PagedKvPool& kv) {
    if (!batches_ready_ || !pkv_.data() || kv.n_blocks() != pkv_blocks_ || kv.block_size() != pkv_block_size_)
        fail("forward_batch: the KV pool was not made by this runner's make_kv_pool");
    const auto& c = cfg_;
    const int64_t bs = pkv_block_size_;
    // Everything is checked before anything runs (as on the CPU).
    for (int i = 0; i < n_seqs; ++i) {
        const SeqBatch& q = seqs[i];
        if (q.n < 1 || !q.tokens || !q.block_table || q.n_past < 0) fail("forward_batch: sequence {} is empty", i);
        for (int64_t j = 0; j < q.n; ++j)
            if (q.tokens[j] < 0 || q.tokens[j] >= c.n_vocab)
                fail("token id {} is outside the vocabulary [0, {})", q.tokens[j], c.n_vocab);
        for (int64_t b = 0; b < (q.n_past + q.n + bs - 1) / bs; ++b)
            if (q.block_table[b] < 0 || q.block_table[b] >= pkv_blocks_)
                fail("forward_batch: sequence {} names block {} of {}", i, q.block_table[b], pkv_blocks_);
    }
    // Passes of at most prefill_rows_ rows; a long prompt chunk may span
    // passes (its later rows see the keys the earlier pass stored).
    std::vector<BatchSegment> segs;
    int64_t rows = 0;
    for (int i = 0; i < n_seqs; ++i)
        for (int64_t off = 0; off < seqs[i].n;) {
            const int64_t take = std::min(seqs[i].n - off, prefill_rows_ - rows);
            segs.push_back({i, off, take});
            rows += take;
            off += take;
            if (rows == prefill_rows_) {
                batch_pass(seqs, segs);
                segs.clear();
                rows = 0;
            }
        }
    if (!segs.empty()) batch_pass(seqs, segs);
}

// The padded row count of a graph pass of n single rows: 1, 2, 4, 8, then
// multiples of 8 up to 64 and of 32 up to 256 (few graphs, at most a
// quarter of a pass wasted beyond 8 rows).
int64_t graph_bucket(int64_t n) {
    if (n <= 8) {
        int64_t b = 1;
        while (b < n) b *= 2;
        return b;
    }
    return n <= 64 ? (n + 7) / 8 * 8 : (n + 31) / 32 * 32;
}

void LlamaCudaSession::clear_batch_graphs() {
    for (auto& [key, g] : bgraphs_)
        if (g.first) cudaGraphExecDestroy(g.first);
    bgraphs_.clear();
}

bool LlamaCudaSession::replay_layers(const int32_t* d, int64_t n, int64_t keys, const PagedRows& pr) {
    auto& [ge, seen] = bgraphs_[{n, keys}];
    if (!ge) {
        // The first pass of a pair runs uncaptured: whatever a product sets
        // up on its first call (plans, kernel attributes) happens outside
        // the graph. A pair whose capture failed (seen < 0) stays uncaptured.
        if (seen < 0 || seen++ == 0) return false;
        const cudaStream_t s = ctx_.stream();
        cudaGraph_t g = nullptr;
        bool ok = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
        if (ok) {
            try {
                layer_rows(d, n, 0, &pr);
            } catch (const Error&) {
                ok = false;
            }
            ok = cudaStreamEndCapture(s, &g) == cudaSuccess && ok && g;
            ok = ok && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
            if (g) cudaGraphDestroy(g);
        }
        if (!ok) {  // e.g. a product that falls back to tiles on the second stream at this size
            cudaGetLastError();
            ge = nullptr;
            seen = -1;
            if (opt_.verbose)
                std::fprintf(stderr, "quern: a batch pass of %lld rows could not be captured as a CUDA graph; such passes "
                                     "run uncaptured\n", static_cast<long long>(n));
            return false;
        }
    }
    QUERN_CUDA_CHECK(cudaGraphLaunch(ge, ctx_.stream()));
    ++graph_replays_;
    return true;
}

void LlamaCudaSession::batch_pass(const SeqBatch* seqs, const std::vector<BatchSegment>& segs) {
    const auto t_start = std::chrono::steady_clock::now();
    const auto& c = cfg_;
    const cudaStream_t s = ctx_.stream();
    const int64_t bs = pkv_block_size_, E = c.n_embd, V = c.n_vocab;
    // The pass's integers, one host buffer (kept between passes) in the
    // device layout: ids (n) | positions (n) | table offsets (n) | rows whose
    // logits are read (nh) | the segments' block tables.
    const auto wants_head = [&](const BatchSegment& g) {
        const SeqBatch& q = seqs[g.seq];
        return (q.logits || q.greedy) && g.off + g.n == q.n;
    };
    const auto blocks_of = [&](const BatchSegment& g) { return (seqs[g.seq].n_past + g.off + g.n + bs - 1) / bs; };
    int64_t n = 0, nh = 0, nt = 0;
    bool single = true;  // every segment one row: the pass may run as a graph
    for (const BatchSegment& g : segs) n += g.n, nh += wants_head(g), nt += blocks_of(g), single = single && g.n == 1;
    const bool lr = c.longrope();  // then the rows' LongRoPE choices follow the head rows
    // A graph pass pads its rows to np (graph_bucket) and its integers sit at
    // fixed places of bgints_; padding rows read token 0 at position 0 from a
    // one-entry table naming the pool's spare block.
    int64_t np = 0;
    if (single && n <= graph_rows_ && !profile_) {
        np = graph_bucket(n);
        if (np > prefill_rows_) np = 0;  // the passes' scratch holds prefill_rows_ rows
        if (4 * np + (lr ? np : 0) + nt + 1 > kGraphInts) np = 0;
    }
    const int64_t nr = np ? np : n, hc = np ? np : nh;  // rows and head slots laid out
    // The pass's integers, one host buffer (kept between passes) in the
    // device layout: ids (nr) | positions (nr) | table offsets (nr) | rows
    // whose logits are read (hc) | LongRoPE choices (nr, LongRoPE only) |
    // the segments' block tables (| the spare block's one-entry table).
    bhost_.resize(static_cast<size_t>(3 * nr + hc + (lr ? nr : 0) + nt + (np ? 1 : 0)));
    int32_t* ids = bhost_.data();
    int32_t* pos = ids + nr;
    int32_t* toff = pos + nr;
    int32_t* head = toff + nr;
    int32_t* lrow = head + hc;
    int32_t* tables = lrow + (lr ? nr : 0);
    head_seq_.clear();
    int64_t r = 0, t0 = 0;
    for (const BatchSegment& g : segs) {
        const SeqBatch& q = seqs[g.seq];
        const int64_t nb = blocks_of(g);
        std::copy(q.block_table, q.block_table + nb, tables + t0);
        // LongRoPE: per sequence, from its last position in this call (the CPU's rule).
        const int32_t lg = lr && q.n_past + q.n - 1 >= c.rope_orig_ctx ? 1 : 0;
        for (int64_t j = g.off; j < g.off + g.n; ++j, ++r) {
            ids[r] = q.tokens[j];
            pos[r] = static_cast<int32_t>(q.n_past + j);
            toff[r] = static_cast<int32_t>(t0);
            if (lr) lrow[r] = lg;
        }
        if (wants_head(g)) {
            head[head_seq_.size()] = static_cast<int32_t>(r - 1);
            head_seq_.push_back(&q);
        }
        t0 += nb;
    }
    if (np) {
        tables[t0] = static_cast<int32_t>(pkv_blocks_);
        for (; r < np; ++r) {  // padding rows: token 0 at position 0 (head slots past nh go unread)
            ids[r] = pos[r] = 0;
            toff[r] = static_cast<int32_t>(t0);
            if (lr) lrow[r] = 0;
        }
    }
    const size_t bytes = bhost_.size() * 4;
    if (!np && bints_.size() < bytes) bints_ = DeviceBuffer(bytes * 2);
    DeviceBuffer& dints = np ? bgints_ : bints_;
    QUERN_CUDA_CHECK(cudaMemcpyAsync(dints.data(), bhost_.data(), bytes, cudaMemcpyHostToDevice, s));
    const int32_t* d = dints.as<int32_t>();
    PagedRows pr;
    pr.pos = d + nr;
    pr.table_off = d + 2 * nr;
    pr.tables = d + 3 * nr + hc + (lr ? nr : 0);
    pr.block_size = static_cast<int>(bs);
    pr.one_row_per_seq = single;
    pr.split_ws = bsplit_.as<float>();
    pr.split_ws_floats = bsplit_floats_;
    const int max_keys = n > 0 ? *std::max_element(pos, pos + n) + 1 : 0;
    // A graph's attention is planned for a power of two of keys (from 64):
    // any row of fewer keys is attended alike (its splits shorter).
    int keys = max_keys;
    if (np) {
        keys = 64;
        while (keys < max_keys) keys *= 2;
    }
    pr.max_keys = keys;
    if (lr) {
        pr.rope_long = d + 3 * nr + hc;
        pr.inv_freq_long = rope_long_;
    }
    if (!np || !replay_layers(d, np, keys, pr)) layer_rows(d, nr, 0, &pr);
    if (nh > 0) {
        // The final norm on every row (the last residual added in), then the
        // rows that need logits gathered and multiplied by the output head,
        // at most 256 at a time.
        float* X = px_.as<float>();
        const float* HRES = c.post_norms ? phpost_.as<float>() : ph_.as<float>();
        uint16_t* xb = gemm_->act_bf16();
        rms_norm_bf16(X, HRES, out_norm_, xb, n, E, c.rms_eps, s);
        for (int64_t h0 = 0; h0 < nh; h0 += kHeadRows) {
            const int64_t m = std::min(kHeadRows, nh - h0);
            gather_rows_bf16(xb, E, d + 3 * nr + h0, m, bhead_x_.as<uint16_t>(), s);
            gemm_->run_bf16(output_.w, bhead_x_.as<uint16_t>(), m, blogits_.as<float>(), V, s);
            if (c.final_softcap > 0.0f) scale_softcap(blogits_.as<float>(), m * V, 1.0f, c.final_softcap, s);
            bool greedy = false;
            for (int64_t j = 0; j < m; ++j) {
                const SeqBatch& q = *head_seq_[static_cast<size_t>(h0 + j)];
                if (q.logits)
                    QUERN_CUDA_CHECK(cudaMemcpyAsync(q.logits, blogits_.as<float>() + j * V, static_cast<size_t>(V) * 4,
                                                     cudaMemcpyDeviceToHost, s));
                greedy = greedy || q.greedy;
            }
            if (greedy) {  // every row's argmax in one launch (the others' go unread)
                argmax_rows(blogits_.as<float>(), m, V, V, bargmax_.data(), bgreedy_.as<int32_t>(), s);
                QUERN_CUDA_CHECK(cudaMemcpyAsync(hgreedy_.as<int32_t>(), bgreedy_.data(), static_cast<size_t>(m) * 4,
                                                 cudaMemcpyDeviceToHost, s));
            }
            ctx_.synchronize();  // blogits_ and hgreedy_ are reused
            for (int64_t j = 0; j < m; ++j)
                if (int32_t* gdst = head_seq_[static_cast<size_t>(h0 + j)]->greedy) *gdst = hgreedy_.as<int32_t>()[j];
        }
        mark("head");
    }
    ctx_.synchronize();
    if (profile_) {
        Profile& prof = single ? prof_batch_ : prof_batch_prompt_;
        collect_profile(prof);
        prof.rows += n;
        if (single) batch_wall_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();
    }
}

/// quern::Error unless GPU opt.device exists (saying what to do instead).
void require_device(const SessionOptions& opt) {
    const int found = CudaContext::device_count();
    if (found < opt.device + 1)
        fail("{}; use --device cpu (or --device auto, which runs on the CPU when there is no GPU)",
             found == 0 ? std::string("no CUDA GPU found")
                        : fmt::format("CUDA device {} is not available ({} found)", opt.device, found));
}

}  // namespace

std::unique_ptr<BatchRunner> make_batch_runner(const Model& model, const SessionOptions& opt) {
    require_device(opt);
    SessionOptions o = opt;
    o.n_ctx = 16;  // the single-sequence cache goes unused: batches use the paged pool
    o.gpu_mem_fraction = 0;
    o.batched_prefill = true;
    auto s = std::make_unique<LlamaCudaSession>(model, o);
    s->prepare_batches();
    return s;
}

int64_t batch_graph_replays(const BatchRunner& runner) {
    const auto* s = dynamic_cast<const LlamaCudaSession*>(&runner);
    return s ? s->graph_replays() : 0;
}

std::unique_ptr<Session> make_session(const Model& model, const SessionOptions& opt) {
    require_device(opt);
    return std::make_unique<LlamaCudaSession>(model, opt);
}

}  // namespace quern::cuda
