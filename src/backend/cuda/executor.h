// The CUDA executor: a layer program's weights resident on one GPU and the
// passes that run it — the decode step (decode_step.cpp), passes of many rows
// for prompts and batches (rows_pass.cpp, batch_pass.cpp) — behind the
// backend's Executor (session.h makes it). Set-up, weight upload, the KV
// storage and forward's dispatch: executor.cpp. Private to src/backend/cuda.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/block_plan.h"
#include "backend/kv_budget.h"  // gib
#include "backend/cuda/bq_gemm.h"
#include "backend/cuda/context.h"
#include "backend/cuda/delta_rule.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/session.h"
#include "backend/cuda/weights.h"
#include "core/error.h"

namespace quern::cuda {

/// A matrix (or several concatenated along N) and where its rows land in the
/// output vector.
struct Piece {
    DeviceWeight w;
    int64_t offset = 0;  // first output element
};

struct LayerWeights {
    const float* attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    const float* qkv_bias = nullptr;  // [q | k | v] biases, or null
    const float* q_norm = nullptr;    // head_dim weights of the per-head q/k norms, or null
    const float* k_norm = nullptr;
    const float* post_attn_norm = nullptr;  // RMSNorm of the attention / FFN output
    const float* post_ffn_norm = nullptr;   //   before its residual add, or null
    std::vector<Piece> qkv;      // outputs into [q | k | v]
    Piece wo;
    std::vector<Piece> gate_up;  // outputs into [gate | up]
    Piece down;
    // Mixture of experts (gate_up and down empty): the router (n_expert
    // rows) and the expert banks, each one matrix of n_expert × rows (expert
    // e's rows first at e · rows; gemv_indexed). Where gate and up share a
    // type, one bank exp_gate_up whose matrix e is expert e's gate rows then
    // its up rows (2 · n_ff_exp: one indexed GEMV, one grouped GEMM for
    // both) and exp_gate, exp_up empty; else the two banks.
    bool moe = false;
    Piece router;
    DeviceWeight exp_gate_up, exp_gate, exp_up, exp_down;
    /// The banks behind a [gate | up] row of 2·F outputs (F = n_ff_exp):
    /// each with its rows per matrix and where its outputs start in that row.
    struct GateUpBank {
        const DeviceWeight* w;
        int64_t rows, col;
    };
    std::vector<GateUpBank> gate_up_banks(int64_t F) const {
        if (exp_gate_up.N > 0) return {{&exp_gate_up, 2 * F, 0}};
        return {{&exp_gate, F, 0}, {&exp_up, F, F}};
    }
    // Batches: one BF16 copy of all Q|K|V (gate|up) pieces, rows stacked in
    // output order (type BF16, owning the pieces' copies), or empty.
    DeviceWeight qkv_bf16, gate_up_bf16;
    // Gated attention: the output gate's rows ([head 0 | head 1 | ...],
    // sigmoid), or empty.
    std::vector<Piece> attn_gate;
    // A Gated DeltaNet layer (no attention): qkv is its [q | k | v]
    // projection, wo its output; delta_baz its other input projections as
    // outputs into a row [b | a | z] (2 · n_v_heads + value_dim: one matrix
    // where the three share a type), the per-head output norm, the conv and
    // decay parameters (dl), and where its slot starts in a sequence's
    // recurrent state.
    bool delta = false;
    std::vector<Piece> delta_baz;
    const float* delta_norm = nullptr;
    DeltaLayer dl;
    int64_t state_offset = 0;
    int delta_index = -1;  // among the DeltaNet layers
    // A shared expert beside the routed ones: gate|up, down, its gate row
    // (n_embd floats).
    std::vector<Piece> sh_gate_up;
    Piece sh_down;
    const float* sh_gate = nullptr;
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

/// Makes one more resident copy of `need` bytes with make() while `keep`
/// bytes of the `free_b` measured before the copies stay free (`bytes`: the
/// copies made so far, updated); the first that does not fit, or whose
/// make() throws quern::Error (out of memory), clears `room` and ends them.
template <class Make>
void copy_while_room(bool& room, size_t& bytes, size_t free_b, size_t keep, size_t need, const Make& make) {
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
}

class CudaExecutor final : public Executor {
public:
    CudaExecutor(const Program& program, const SessionOptions& opt);
    ~CudaExecutor() override;

    std::string device_name() const override { return ctx_.name(); }
    int64_t make_kv_storage(int64_t n_blocks, int64_t block_size, const char* flag) override;
    /// A lone sequence over blocks 0, 1, 2, ... (ForwardBatch::invariant
    /// false) runs the single-sequence passes below (decode step graphs,
    /// batched prefill); anything else forward_batch (executors made with
    /// SessionOptions::batches).
    void forward(const ForwardBatch& batch) override;
    void make_state_slots(int64_t n) override;
    void copy_state_slot(int32_t from, int32_t to) override;
    void save_lone_state() override;
    void restore_lone_state() override;
    bool keeps_row_states() const override { return plan_.hybrid(); }
    void keep_lone_rows(int64_t m) override;
    bool samples_on_device(const SamplingSpec& sp) const override;
    int64_t fp8_activation_rows() const override {
        return opt_.fp8_weights && prefill_supported_ ? kPrefillMinTokens : 0;
    }
    /// Readies the executor for batches: the row scratch, and resident BF16
    /// copies of the dense matrices (as memory allows). quern::Error when the
    /// model has no batched path on this GPU.
    void prepare_batches();
    /// Before any copy is made: when the BF16 copies and bq layouts of every
    /// matrix would not fit beside a free quarter of the GPU's memory (a
    /// 70B model on one GPU), marks the matrices qw_gemm takes
    /// (DeviceWeight::qw) so that none is copied, instead of copying part of
    /// the model and dequantizing the rest on every pass. Returns whether it
    /// did. Nothing where QUERN_CUDA_QW decides already, where the small
    /// layouts exist, or where qw_gemm does not run (no sm_90a).
    bool choose_copy_free();
    /// The bq layouts (bq_gemm.h: 5.5 or 11 bits per weight) of the dense
    /// layer matrices, the output head and a draft head's eh_proj, while a
    /// quarter of the GPU's memory stays free: passes of few rows
    /// (PrefillGemm::uses_bq) multiply those instead of dequantizing each
    /// matrix to BF16 per pass. Once (later calls: 0); returns the bytes made.
    /// prepare_batches, and a lone sequence's first pass of per-row logits
    /// (speculative verification).
    size_t make_small_layouts();
    int64_t graph_replays() const override { return graph_replays_; }
    /// The lowered decode step of a lone sequence (with the greedy head), as
    /// the kernels its CUDA graph launches in stream order: demangled names
    /// ("quern::cuda::...::kernel<...>"), "memcpy" and "memset" for copy
    /// nodes. Captured, not run; needs the KV storage (make_kv_storage).
    /// Tests compare it per model shape with a committed listing.
    std::vector<std::string> decode_kernels();

private:
    // One sequence whose cache is the storage's first n_ctx_ rows, at
    // position n_past_ (forward's lone passes).
    void forward_lone(const SeqBatch& q, const TraceFn* trace);
    void eval(const int32_t* tokens, int64_t n, float* logits);
    int32_t eval_greedy(int32_t token);
    int32_t eval_sample(int32_t token, const SamplingSpec& sp);
    void eval_traced(const int32_t* tokens, int64_t n, float* logits, const TraceFn& trace);
    // Several sequences' rows per pass over the paged storage (see the top
    // of batch_pass.cpp).
    void forward_batch(const SeqBatch* seqs, int n_seqs);
    /// Whether an invariant pass is one sequence's one decode row that the
    /// lone decode step can run over the paged storage (forward_paged_step):
    /// no per-row outputs, given rows, device sampling or trace; blocks of
    /// a power-of-two size.
    bool takes_paged_step(const ForwardBatch& fb) const;
    /// That row through the decode step's CUDA graph (captured with the
    /// attention reading the cache through the sequence's block table, and
    /// for hybrid programs the DeltaNet layers on its state slot): a lone
    /// client of the engine decodes at the lone sequence's speed. An
    /// executor serves the engine or a session, not both: after a paged
    /// step forward_lone refuses (its cache rows, device token history and
    /// control block are the engine's).
    void forward_paged_step(const SeqBatch& q);
    /// Points the decode step's DeltaNet state (dlone_'s pointers) at slot
    /// `slot` (-1: the lone sequence's state), uploading only on a change.
    void point_step_state(int32_t slot);

private:
    void upload_weights();
    /// Layer il's gated-attention, DeltaNet and shared-expert weights
    /// (hybrid_layers.cpp).
    void upload_hybrid(const BlockPlanLayer& P, LayerWeights& L);
    /// The recurrent state of hybrid programs: the lone sequence's, its
    /// saved copy, and the DeltaSeqs arrays of the lone passes.
    void make_lone_state(const Program& program);
    /// Decode step, layer L (normed input in xn_ / xq_embd_): the DeltaNet
    /// mixer up to its output projection's activation (xq_delta_; returns
    /// the gated floats); the output gate of gated attention (attn_ →
    /// xq_attn_, returns the gated floats); the shared expert added into h_.
    const float* step_delta(const LayerWeights& L);
    const float* step_attn_gate(const LayerWeights& L);
    void step_shared_expert(const LayerWeights& L);
    /// The same over n rows of layer_rows (normed input xb in BF16): the
    /// DeltaNet mixer into H (rows_delta_ names the sequences' states), and
    /// the shared expert added into H.
    void rows_delta(const LayerWeights& L, int64_t n, uint16_t* xb, float* H);
    void rows_shared_expert(const LayerWeights& L, int64_t n, const uint16_t* xb, float* H);
    /// The RoPE inverse-frequency table of each layer (rope_tables()).
    void make_rope_tables();
    /// f(w) for every layer matrix (Q/K/V, output, gate/up, down; with
    /// `experts`, the expert banks too), in layer order.
    template <class F>
    void for_each_layer_matrix(F&& f, bool experts) {
        for (auto& L : layers_) {
            for (auto& p : L.qkv) f(p.w);
            for (auto& p : L.attn_gate) f(p.w);
            for (auto& p : L.delta_baz) f(p.w);
            f(L.wo.w);
            for (auto& p : L.gate_up) f(p.w);
            f(L.down.w);
            for (auto& p : L.sh_gate_up) f(p.w);
            f(L.sh_down.w);
            if (experts) {
                f(L.exp_gate_up);
                f(L.exp_gate);
                f(L.exp_up);
                f(L.exp_down);
            }
        }
    }
    std::vector<Piece> upload_group(const std::vector<const Tensor*>& ts);
    std::vector<Piece> upload_group(const std::vector<LinearPiece>& ps);
    /// bq layouts of the expert banks (bq_gemm.h), once every weight is on
    /// the device; see its definition.
    void make_expert_bq();
    /// An expert bank: its 3-D tensor, or its per-expert 2-D tensors
    /// concatenated (one type).
    /// One expert bank as one device matrix; `shared` (or null) appended as
    /// its last matrix (shexp_in_banks_).
    DeviceWeight upload_bank(const ExpertBank& b, const Tensor* shared, int64_t il, const char* what);
    /// The gate and up banks as one (LayerWeights::exp_gate_up): matrix e is
    /// expert e's gate rows, then its up rows; the shared expert's (or null)
    /// as matrix n_expert. Both banks must have one type.
    DeviceWeight upload_gate_up_bank(const ExpertBank& gate, const ExpertBank& up, const Tensor* sh_gate,
                                     const Tensor* sh_up, int64_t il);
    /// Whether every expert layer's shared expert can ride in its banks as
    /// matrix n_expert: SiLU experts of the shared expert's width and types,
    /// no bank biases.
    bool shared_expert_in_banks() const;
    /// A small tensor (norms, parameters) as device floats, dequantized
    /// when it is not F32.
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
    /// A decode step's attention of layer L over its normed row (deferred:
    /// the norm's scale not yet applied, fuse_norm_): Q|K|V GEMVs, then RoPE,
    /// the KV write and attention into attn_ (quantized into xq_attn_ unless
    /// an output gate follows).
    void step_attention(const LayerWeights& L, const BlockPlanLayer& P, bool deferred, bool short_ctx);
    void mm(const Piece& p, const float* xf, QuantizedActivation& xq, float* y);
    /// A GEMV reading the normalized residual stream: xn_ / xq_embd_ as the
    /// norm kernel left them, or (deferred, fuse_norm_) xq_embd_ without its
    /// scale, which deferred_norm() supplies.
    void mm_normed(const Piece& p, float* y, bool deferred);
    DeferredNormScale deferred_norm() const;
    /// Tuning::skip leaves ops out of the step (gateup, swiglu and down cover
    /// the experts too; router the expert layers' router GEMV): the output is
    /// wrong, the step time tells what each op costs in the replayed graph.
    static bool skipped(const char* op);
    /// Replays (capturing on first use) the step graph with or without head
    /// for a step at position pos: a graph of its own for pos < short_ctx_
    /// (enqueue_step's short_ctx form).
    void run_step(Head head, int64_t pos);
    /// The step of enqueue_step(head, no trace, short_ctx) captured as a
    /// graph (the caller owns it); nothing runs.
    cudaGraph_t capture_step(Head head, bool short_ctx);
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
    /// What a chunk of rows hands out beyond the last row's logits (host
    /// pointers at the chunk's first row, or null): every row's hidden row
    /// (Program::hidden: the residual stream through the output norm, n_embd
    /// floats) and every row's logits (n_vocab floats).
    struct RowsOut {
        float* hidden = nullptr;
        float* logits = nullptr;
    };
    void prefill_chunk(int64_t pos0, int64_t n, bool head, const RowsOut* out = nullptr);
    /// A lone sequence's pass that hands out per-row outputs or reads given
    /// rows (SeqBatch::all_logits, hidden, hidden_in: speculative decoding's
    /// verification and draft passes), through the rows path whatever n.
    void eval_rows(const SeqBatch& q);
    /// The rows' hidden rows into phout_ (n rows: X += HRES first, normed by
    /// the output norm), then the head's GEMV on each row r of from .. n − 1
    /// (logits_ keeps the last), its logits downloaded to logits + r · n_vocab
    /// when logits is not null.
    void rows_outputs(int64_t n, float* hidden, float* logits, int64_t from);
    /// A draft head's first step over n rows (layer_rows, plan_.draft()):
    /// X = eh_proj · [RMSNorm(embed(token)) | RMSNorm(given row)] with the
    /// given rows in phin_.
    void rows_nextn_prologue(const int32_t* dtokens, int64_t n, float* X);
    /// The layers over n rows whose token ids are on the device (dtokens):
    /// one sequence's positions pos0 .. pos0+n−1 over the session's cache
    /// (paged null), or rows of several sequences over the paged cache. The
    /// residual stream is left in px_ (+ the last HRES not yet added).
    void layer_rows(const int32_t* dtokens, int64_t n, int64_t pos0, const PagedRows* paged);
    /// Whether a pass of n rows multiplies the pieces ps through their fused
    /// BF16 copy f (qkv: Q|K|V's rule, see the definition).
    static bool use_fused(const DeviceWeight& f, const std::vector<Piece>& ps, int64_t n, bool qkv);
    /// The pieces ps (a layer's Q|K|V or gate|up kept apart) times the n
    /// BF16 rows xb, piece p into columns p.offset .. of y (row stride ldy):
    /// PrefillGemm::run_bf16_pieces (one launch where qw_gemm takes them all).
    void run_pieces(const std::vector<Piece>& ps, const uint16_t* xb, int64_t n, float* y, int64_t ldy);
    /// Layer L's attention over the n rows of layer_rows (normed input xb in
    /// BF16; paged as there), through its output projection into H.
    void rows_attention(const LayerWeights& L, const BlockPlanLayer& P, int64_t n, int64_t pos0,
                        const PagedRows* paged, uint16_t* xb, float* H);
    struct BatchSegment {
        int seq;
        int64_t off, n;  // rows off .. off+n−1 of the sequence's new tokens
    };
    /// A batch pass's DeltaSeqs (rows_delta_): each segment a sequence on its
    /// state slot, then n_pad padding rows on the spare slot; uploaded into
    /// bdelta_, the slots of sequences starting at position 0 zeroed first.
    void set_batch_delta(const SeqBatch* seqs, const std::vector<BatchSegment>& segs, int64_t n_pad);
    void batch_pass(const SeqBatch* seqs, const std::vector<BatchSegment>& segs);
    /// Layer L's q/k/v biases and q/k norms for the RoPE kernels (window and
    /// soft-cap left at their defaults).
    AttentionExtras attention_extras(const LayerWeights& L, const BlockPlanLayer& P) const;
    /// The expert FFN of layer L for n prefill rows: xb (n × n_embd BF16,
    /// normalized) → out (n × n_embd floats). See the top of the file.
    void prefill_moe(const LayerWeights& L, const MoeSpec& spec, const uint16_t* xb, int64_t n, float* out);
    /// Whether prefill_moe routes layer L's rows on the device and multiplies
    /// each bank in one grouped launch (bq or dq), with no host round trip.
    bool moe_on_device(const LayerWeights& L) const;
    /// Allocates the prefill scratch on first use; false (and the batched
    /// path off for this session) when the GPU has no room for it.
    bool ensure_prefill_scratch();

    BlockPlan plan_;
    SessionOptions opt_;
    // Recurrent state (hybrid programs, Program::state_floats per sequence):
    // the lone sequence's and its saved copy (save_lone_state), the batch
    // runner's slots (make_state_slots; one spare more, for padding rows),
    // and the DeltaSeqs arrays the kernels read: dlone_ holds [row0 0 | 1 |
    // the rows of a prefill chunk | per DeltaNet layer the lone state's
    // slot], bdelta_ a batch pass's [row0 | n_rows | per DeltaNet layer the
    // slots]. step_delta_: per DeltaNet layer, what the decode step passes
    // to the kernels; rows_delta_: what layer_rows passes (the lone
    // sequence's lone_rows_delta_, or the batch pass's batch_delta_).
    int64_t state_floats_ = 0;
    int n_delta_ = 0;
    // SeqBatch::row_states of the lone sequence: snap_ holds the state after
    // each row but the last of the last such pass (snap_rows_ rows of
    // state_floats_), lone_snap_delta_ the DeltaSeqs that write it (dsnap_:
    // their per-layer pointers); that pass's first position and rows
    // (rows 0: the last pass kept none).
    DeviceBuffer snap_, dsnap_;
    int64_t snap_rows_ = 0, snap_pos_ = 0, snap_n_ = 0;
    std::vector<DeltaSeqs> lone_snap_delta_;
    bool rows_snap_ = false;  // the lone chunk being run writes them
    /// snap_ and lone_snap_delta_ for passes of up to `rows` rows.
    void ensure_row_states(int64_t rows);
    DeviceBuffer lone_state_, lone_saved_, slots_, dlone_, bdelta_;
    int64_t n_slots_ = 0;
    std::vector<DeltaSeqs> step_delta_, lone_rows_delta_, batch_delta_;
    const DeltaSeqs* rows_delta_ = nullptr;
    std::vector<int32_t> bdelta_host_;
    // Step scratch of the gated layers: DeltaNet [q|k|v] before and after
    // the conv (conv_dim each), [b | a | z] (2 · n_v_heads + value_dim), y,
    // normed y (value_dim each), the attention gate (q_dim), the gated output (max of both widths), the
    // shared expert's output (n_embd).
    DeviceBuffer sqkv_, sxc_, sbaz_, sy_, syn_, sgate_, sgated_, sshared_;
    // Row scratch (prefill_rows_ rows): DeltaNet [q|k|v] after the conv, [z |
    // normed y], y, [b | a]; [gate | attention] of gated attention; the
    // shared expert's gated values (BF16) and output.
    DeviceBuffer pxc_, pzy_, py_, pba_, pga_, psh_g_, psh_y_;
    CudaContext ctx_;
    int levels_ = 2;
    int64_t n_ctx_ = 0;   // rows of the storage a lone sequence may fill (kv_blocks_ · kv_block_size_)
    int64_t n_past_ = 0;  // the lone sequence's positions computed
    KvType kv_type_ = KvType::F16;

    // RMSNorms folded into the GEMVs around them (gemv_residual_norm and
    // DeferredNormScale, gemv.h) when every matrix reads the quantized
    // activation; else one rms_norm_q8_1 launch per norm.
    bool fuse_norm_ = false;
    DeviceBuffer ss_parts_;  // n_embd/32 partial sums of x²
    // The shared expert as matrix n_expert of every expert bank: the decode
    // step runs it as one more slot of the indexed GEMVs (its weight, the
    // sigmoid gate, from moe_route), not as four launches of its own.
    bool shexp_in_banks_ = false;

    std::vector<DeviceBuffer> owned_;  // norm weights, embedding table
    std::vector<LayerWeights> layers_;
    DType embd_type_ = DType::F32;
    const void* embd_ = nullptr;
    const float* out_norm_ = nullptr;
    // Each layer's RoPE inverse frequencies (dim/2 floats: cpu::rope_inv_freq),
    // one device table per distinct (base, factors). LongRoPE layers read a
    // live copy of the short or the long table (rope_live_), which
    // select_rope() overwrites when the choice changes; the batch runner's
    // rows pick theirs (PagedRows).
    std::vector<const float*> inv_freq_;
    const float* rope_live_ = nullptr;
    const float* rope_short_ = nullptr;
    const float* rope_long_ = nullptr;
    int64_t rope_long_from_ = 0;
    int rope_long_dim_ = 0;
    bool rope_long_live_ = false;
    int64_t rope_call_last_ = -1;  // eval_traced: its whole call's last position (begin() is called twice)
    Piece output_;
    // A NextN draft head's prologue (plan_.draft()): its two norms and the
    // projection of [embedding | given row] (2·n_embd → n_embd).
    const float* nextn_enorm_ = nullptr;
    const float* nextn_hnorm_ = nullptr;
    Piece eh_proj_;

    // Batched prefill: whether the model allows it (weight types with a
    // prefill GEMM, a supported head size), rows per chunk, and its scratch
    // (allocated on first use: decode-only sessions never pay for it).
    bool prefill_supported_ = false;
    int64_t prefill_rows_ = 0;
    std::unique_ptr<PrefillGemm> gemm_;
    DeviceBuffer px_, ph_, phpost_, pqkv_, pattn_, pgu_;
    // Rows of n_embd floats: a draft head's given rows (phin_, zeroed at
    // first so that padding rows read finite values), and the normed hidden
    // rows a pass hands out (phout_; the prologue's BF16 norms before that).
    DeviceBuffer phin_, phout_;
    // Expert prefill (n·k grouped rows, + 16 rows of padding): router logits,
    // the grouped rows' inputs (BF16), gate|up outputs, gated values (BF16)
    // and down outputs; the routing (grouped row of each entry, row of each
    // grouped row, weights) on the device and its host staging.
    DeviceBuffer pmoe_logits_, pmoe_xg_, pmoe_gu_, pmoe_g_, pmoe_y_, pmoe_route_;
    PinnedBuffer hmoe_logits_, hmoe_route_;

    // The paged KV storage (make_kv_storage): per layer K then V, each
    // kv_layer_bytes_ of rows of kv_dim elements (kv_type_); row = block ·
    // block_size + offset. One block more than asked for: the padding rows
    // of captured batch passes write their keys there (block kv_blocks_,
    // owned by no sequence). The batch pass's ids, positions and tables are
    // on the device (bints_).
    DeviceBuffer kv_;
    size_t kv_layer_bytes_ = 0;
    // What the load took of device memory, for the memory report at
    // make_kv_storage: the weights (free memory before and after their
    // upload) and the batches' small-batch layouts and BF16 copies.
    size_t weight_bytes_ = 0, batch_copy_bytes_ = 0;
    int64_t kv_blocks_ = 0, kv_block_size_ = 0;
    // The output head runs on at most kHeadRows rows at a time: its BF16
    // inputs, logits and argmaxes (device and pinned host copies).
    static constexpr int64_t kHeadRows = 256;
    static constexpr int64_t kSplitRows = 128;  // passes up to this long may split attention keys
    DeviceBuffer bints_, bhead_x_, blogits_, bgreedy_, bargmax_, bsplit_;
    int64_t bsplit_floats_ = 0;
    PinnedBuffer hgreedy_;
    std::vector<int32_t> bhost_;              // the pass's integers on the host (batch_pass)
    // Passes of single rows replayed as CUDA graphs (SessionOptions::batches):
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
    std::vector<int64_t> head_row_;           // and its row among the sequence's new tokens
    std::vector<int64_t> seg_row0_;           // the pass's first row of each segment
    std::vector<float> bhin_;                 // a draft head's given rows, in the pass's row order
    bool batches_ready_ = false;
    bool small_layouts_ = false;  // make_small_layouts ran
    bool batch_runner_ = false;  // made with SessionOptions::batches (prepare_batches)

    // Per-step activations.
    DeviceBuffer x_, h_, hpost_, xn_, qkv_, attn_, gu_, ffh_, logits_, attn_scratch_, argmax_scratch_, tokens_, ctl_;
    QuantizedActivation xq_embd_, xq_attn_, xq_ff_, xq_delta_;  // xq_delta_: a DeltaNet layer's gated output
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

    cudaGraphExec_t graph_[3][2][2] = {};  // [Head][short context][paged]
    // A paged decode step (forward_paged_step): the step being enqueued or
    // captured reads the cache through dtable_ (the sequence's block table,
    // staged in htable_); block_shift_ = log2 of the block size (-1: not a
    // power of two, no paged steps); step_slot_: the state slot dlone_'s
    // DeltaNet pointers name (-1: the lone state).
    bool paged_step_ = false;
    // A paged step has run: the lone sequence's cache rows, token history
    // and control block are the engine's now, so forward_lone refuses.
    bool served_paged_ = false;
    void drop_step_graphs();
    DeviceBuffer dtable_;
    PinnedBuffer htable_;
    int block_shift_ = -1;
    int32_t step_slot_ = -1;
    // Steps at positions below this run attention as one split per KV head
    // with no combine launch (SessionOptions::short_ctx).
    int64_t short_ctx_ = 128;
    DeviceBuffer sampling_;    // one DeviceSampling
    PinnedBuffer host_sampling_;
    std::vector<float> host_logits_;  // forward_lone's logits of a row that asked only for the next token

    // SessionOptions::profile: steps run uncaptured with CUDA events between the
    // ops; the destructor prints the GPU time per op kind (µs per decode
    // step, and µs per batched-prefill chunk with the GEMMs' dequantization
    // and cuBLASLt time apart).
    struct Profile {
        std::vector<std::pair<std::string, double>> ms;  // op name -> total ms
        int64_t count = 0;                               // steps or chunks
        int64_t rows = 0;                                // prefill: positions
    };
    bool profile_ = false;
    std::vector<std::pair<const char*, cudaEvent_t>> marks_;
    Profile prof_decode_, prof_prefill_, prof_batch_, prof_batch_prompt_;  // batch: passes of one row per sequence, others
    double batch_wall_ms_ = 0;  // host time of the profiled decode batch passes
    void mark(const char* what);
    void collect_profile(Profile& p);
    static void print_profile(const Profile& p, const char* what);
};

}  // namespace quern::cuda
