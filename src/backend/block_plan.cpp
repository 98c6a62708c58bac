#include "backend/block_plan.h"

#include <fmt/format.h>

#include "core/error.h"

namespace quern {

namespace {

/// Reads a program's ops in order, checking each against the shape.
struct Reader {
    const Program& p;
    size_t i = 0;

    bool next_is(OpKind k, Value reads) const {
        return i < p.ops.size() && p.ops[i].kind == k && p.ops[i].in[0].id == reads.id;
    }
    /// The output norm on every row, then the selection of the head's rows
    /// (a program that hands its normed rows to a draft head, Program::hidden).
    bool head_norm_first(Value x) const {
        return next_is(OpKind::RmsNorm, x) && i + 1 < p.ops.size() && p.ops[i + 1].kind == OpKind::SelectRows &&
               p.ops[i + 1].in[0].id == p.ops[i].out.id;
    }
    [[noreturn]] void misfit(const char* expected) const {
        if (i >= p.ops.size()) fail("the program ends where {} was expected", expected);
        const Op& op = p.ops[i];
        fail("op {} ({}) is not {}", i, op.layer >= 0 ? fmt::format("layer {}", op.layer) : std::string("head"), expected);
    }
    const Op& take(OpKind k, Value reads, const char* expected) {
        if (!next_is(k, reads)) misfit(expected);
        return p.ops[i++];
    }
    /// A Linear op reading `in` with one matrix and no bias.
    const Tensor* single(Value in, const char* expected, Value& out) {
        const Op& op = take(OpKind::Linear, in, expected);
        if (op.pieces.size() != 1) misfit(expected);
        out = op.out;
        return op.pieces[0].w;
    }
};

/// Every RMSNorm of the blocks and the head shares one epsilon (`eps`: 0
/// until the first norm sets it).
void same_eps(float& eps, const Op& norm) {
    if (eps == 0.0f) eps = norm.eps;
    else if (norm.eps != eps)
        fail("RMSNorm '{}' has epsilon {} where the others have {}", norm.weight->name, norm.eps, eps);
}

void same(int64_t& have, int64_t got, const char* what, size_t il) {
    if (have == 0) have = got;
    else if (have != got) fail("layer {} has {} {} where earlier layers have {}", il, what, got, have);
}


/// The token mixer of layer il over its normed input h, through its output
/// projection (whose value it returns): attention, its output optionally
/// gated (sigmoid of a projection of h), or Gated DeltaNet (its output
/// normed per value head and gated by SiLU of a projection of h).
Value take_mixer(Reader& r, Value h, BlockPlanLayer& L, BlockPlan& b, size_t il, float& eps) {
    const Program& p = r.p;
    const Op& in = r.take(OpKind::Linear, h, "the Q|K|V projection");
    L.qkv = in.pieces;
    for (const LinearPiece& pc : L.qkv)
        if ((pc.bias != nullptr) != (L.qkv.front().bias != nullptr))
            fail("layer {}: biases on some of the Q|K|V projections only", il);
    Value mixed;
    if (r.next_is(OpKind::Attention, in.out)) {
        const Op& at = r.take(OpKind::Attention, in.out, "attention");
        L.attn = &p.attention[static_cast<size_t>(at.spec)];
        if (L.attn->sinks) fail("layer {}: attention sinks (gpt-oss) are not supported on the GPU yet", il);
        if (L.attn->kv_layer != b.n_kv_layers)
            fail("layer {} attends over KV-cache layer {} where {} was expected", il, L.attn->kv_layer, b.n_kv_layers);
        ++b.n_kv_layers;
        mixed = at.out;
        if (r.next_is(OpKind::Linear, h)) {  // an output gate
            const Op& g = r.take(OpKind::Linear, h, "");
            const Op& gate = r.take(OpKind::Gate, at.out, "the attention output gate");
            if (gate.in[1].id != g.out.id || gate.act != GluAct::Sigmoid || p.width(g.out) != p.width(at.out))
                fail("layer {}: an attention output gate other than sigmoid(h·W) of the attention's width", il);
            for (const LinearPiece& pc : g.pieces)
                if (pc.bias) fail("layer {}: an attention output gate bias", il);
            L.attn_gate = g.pieces;
            b.gates = true;
            mixed = gate.out;
        }
    } else {
        if (L.qkv.size() != 1 || L.qkv[0].bias) r.misfit("attention or a DeltaNet");
        Value z;
        L.delta_z = r.single(h, "attention or the DeltaNet output gate projection", z);
        const Op& ba = r.take(OpKind::Linear, h, "the DeltaNet b|a projection");
        for (const LinearPiece& pc : ba.pieces)
            if (pc.bias) fail("layer {}: a DeltaNet b|a bias", il);
        L.delta_ba = ba.pieces;
        const Op& dn = r.take(OpKind::DeltaNet, in.out, "the DeltaNet");
        if (dn.in[1].id != ba.out.id) fail("layer {}: the DeltaNet reads another b|a", il);
        L.delta = &p.delta_net[static_cast<size_t>(dn.spec)];
        const Op& nm = r.take(OpKind::RmsNorm, dn.out, "the DeltaNet output norm");
        if (nm.group != L.delta->head_v) fail("layer {}: the DeltaNet output norm is not per value head", il);
        same_eps(eps, nm);
        L.delta_norm = nm.weight;
        const Op& gt = r.take(OpKind::Gate, nm.out, "the DeltaNet output gate");
        if (gt.in[1].id != z.id || gt.act != GluAct::SiLU) fail("layer {}: a DeltaNet output gate other than SiLU(z)", il);
        mixed = gt.out;
        if (const DeltaNetSpec* d = b.delta) {
            const DeltaNetSpec& e = *L.delta;
            if (e.n_k_heads != d->n_k_heads || e.n_v_heads != d->n_v_heads || e.head_k != d->head_k ||
                e.head_v != d->head_v || e.conv_kernel != d->conv_kernel || e.kv_tiled != d->kv_tiled)
                fail("layer {} has a DeltaNet of another shape than earlier layers", il);
        } else {
            b.delta = L.delta;
        }
    }
    const Op& wo = r.take(OpKind::Linear, mixed, "the attention output projection");
    if (wo.pieces.size() != 1) r.misfit("the attention output projection");
    if (wo.pieces[0].bias) fail("an attention output bias");
    L.wo = wo.pieces[0].w;
    return wo.out;
}

/// A shared expert beside the routed ones (whose sum is `routed`): gate|up,
/// the activation, down, times sigmoid of its one-row gate, added to them.
Value take_shared_expert(Reader& r, Value h, Value routed, BlockPlanLayer& L, BlockPlan& b, size_t il) {
    const Program& p = r.p;
    const Op& gu = r.take(OpKind::Linear, h, "the shared expert's gate|up projection");
    const Op& glu = r.take(OpKind::Glu, gu.out, "the shared expert's activation");
    if (glu.act != GluAct::SiLU) fail("layer {}: a shared expert not gated by SiLU", il);
    for (const LinearPiece& pc : gu.pieces)
        if (pc.bias) fail("layer {}: a shared expert bias", il);
    const int64_t ff = p.width(glu.out);
    if (gu.pieces.size() > 2 || (gu.pieces.size() == 2 && gu.pieces[0].w->ne[1] != ff))
        fail("layer {}: the shared expert's gate|up in {} pieces", il, gu.pieces.size());
    L.shexp_gate_up = gu.pieces;
    Value down, g;
    L.shexp_down = r.single(glu.out, "the shared expert's down projection", down);
    L.shexp_gate = r.single(h, "the shared expert's gate", g);
    if (p.width(g) != 1) fail("layer {}: a shared expert gate of {} values per row", il, p.width(g));
    const Op& gt = r.take(OpKind::Gate, down, "the shared expert's gating");
    if (gt.in[1].id != g.id || gt.act != GluAct::Sigmoid) fail("layer {}: a shared expert gate other than sigmoid", il);
    const Op& add = r.take(OpKind::Add, routed, "the sum of the routed and shared experts");
    if (add.in[1].id != gt.out.id) fail("layer {}: the shared expert is not added to the routed ones", il);
    if (b.n_ff_shexp == 0) b.n_ff_shexp = ff;
    else if (b.n_ff_shexp != ff) fail("layer {} has a shared expert of width {} where earlier layers have {}", il, ff, b.n_ff_shexp);
    return add.out;
}

}  // namespace

BlockPlan plan_blocks(const Program& p) {
    BlockPlan b;
    Reader r{p};
    b.n_vocab = p.n_vocab;
    Value x = r.take(OpKind::Embed, Value{}, "the embedding").out;
    b.embd = r.p.ops[0].weight;
    b.n_embd = p.width(x);
    if (r.next_is(OpKind::Scale, x)) {
        b.embd_scale = p.ops[r.i].scalar;
        x = r.take(OpKind::Scale, x, "").out;
    }
    float eps = 0.0f;
    const auto norm = [&](Value in, const char* expected, Value& out) {
        const Op& op = r.take(OpKind::RmsNorm, in, expected);
        same_eps(eps, op);
        out = op.out;
        return op.weight;
    };
    // A NextN draft head: [RMSNorm(embed) | RMSNorm(given row)] through eh_proj.
    if (r.next_is(OpKind::RmsNorm, x) && r.i + 1 < p.ops.size() && p.ops[r.i + 1].kind == OpKind::Input) {
        Value e, g, h;
        b.nextn_enorm = norm(x, "", e);
        g = p.ops[r.i++].out;
        if (p.width(g) != b.n_embd) fail("a draft head's given rows of {} floats (the model's are {})", p.width(g), b.n_embd);
        b.nextn_hnorm = norm(g, "the norm of the draft head's given rows", h);
        const Op& cat = r.take(OpKind::Concat, e, "the draft head's concatenation");
        if (cat.in[1].id != h.id) r.misfit("the draft head's concatenation of its two normed rows");
        b.nextn_eh_proj = r.single(cat.out, "the draft head's projection", x);
    }
    // A branch's tail: [RMSNorm] [Scale] then the add into the residual stream x.
    Value x_in;
    const auto residual = [&](Value branch, const Tensor*& post_norm, float& scale, const char* add) {
        if (r.next_is(OpKind::RmsNorm, branch)) post_norm = norm(branch, "", branch);
        if (r.next_is(OpKind::Scale, branch)) {
            scale = p.ops[r.i].scalar;
            branch = r.take(OpKind::Scale, branch, "").out;
        }
        const Op& op = r.take(OpKind::Add, x_in, add);
        if (op.in[1].id != branch.id) r.misfit(add);
        return op.out;
    };
    while (r.next_is(OpKind::RmsNorm, x) && !r.head_norm_first(x)) {
        x_in = x;
        const size_t il = b.layers.size();
        BlockPlanLayer L;
        Value h, o;
        L.attn_norm = norm(x, "the attention norm", h);
        o = take_mixer(r, h, L, b, il, eps);
        x = residual(o, L.post_attn_norm, L.attn_out_scale, "the attention residual add");
        x_in = x;
        L.ffn_norm = norm(x, "the FFN norm", h);
        Value f;
        if (r.next_is(OpKind::Moe, h)) {
            const Op& m = r.take(OpKind::Moe, h, "");
            L.moe = &p.moe[static_cast<size_t>(m.spec)];
            L.act = L.moe->act;
            if (L.moe->router_bias || L.moe->gate.bias || L.moe->up.bias || L.moe->down.bias ||
                L.act == GluAct::SwiGluOai)
                fail("layer {}: expert biases and the clamped SwiGLU (gpt-oss) are not supported on the GPU yet", il);
            same(b.n_expert, L.moe->n_expert, "experts", il);
            same(b.n_expert_used, L.moe->n_used, "experts per token", il);
            same(b.n_ff_exp, L.moe->n_ff, "an expert width of", il);
            f = m.out;
            if (r.next_is(OpKind::Linear, h)) f = take_shared_expert(r, h, f, L, b, il);
        } else {
            const Op& gu = r.take(OpKind::Linear, h, "the gate|up projection or an expert layer");
            L.gate_up = gu.pieces;
            for (const LinearPiece& pc : L.gate_up)
                if (pc.bias) fail("layer {}: an FFN projection bias", il);
            const Op& glu = r.take(OpKind::Glu, gu.out, "the gated FFN's activation");
            L.act = glu.act;
            same(b.n_ff, p.width(glu.out), "an FFN width of", il);
            if (L.gate_up.size() > 2 || (L.gate_up.size() == 2 && L.gate_up[0].w->ne[1] != b.n_ff))
                fail("layer {}: gate|up in {} pieces", il, L.gate_up.size());
            L.down = r.single(glu.out, "the FFN down projection", f);
        }
        x = residual(f, L.post_ffn_norm, L.ffn_out_scale, "the FFN residual add");
        if (r.next_is(OpKind::Trace, x)) L.trace = p.ops[r.i++].name;
        if (L.attn) {
            same(b.n_head, L.attn->n_head, "query heads:", il);
            same(b.n_head_kv, L.attn->n_head_kv, "KV heads:", il);
            same(b.head_dim, L.attn->head_dim, "heads of", il);
        }
        b.post_norms = b.post_norms || L.post_attn_norm || L.post_ffn_norm;
        b.branch_scales = b.branch_scales || L.attn_out_scale != 1.0f || L.ffn_out_scale != 1.0f;
        b.moe = b.moe || L.moe;
        if (L.attn && L.attn->rope.long_factors) {
            // One LongRoPE switch for the whole model (it is made per pass, from the sequence's last position).
            const RopeSpec& rp = L.attn->rope;
            for (const BlockPlanLayer& E : b.layers) {
                if (!E.attn) continue;
                const RopeSpec& e = E.attn->rope;
                if (e.long_factors && (e.long_factors != rp.long_factors || e.factors != rp.factors ||
                                       e.long_from != rp.long_from || e.dim != rp.dim || e.base != rp.base))
                    fail("layer {} has LongRoPE factors of its own", il);
            }
        }
        b.layers.push_back(std::move(L));
    }
    b.n_layer = static_cast<int64_t>(b.layers.size());
    if (b.n_layer == 0) r.misfit("a decoder block");
    Value y, z, l;
    // The norm is per row: selecting before or after it gives the same rows.
    if (r.head_norm_first(x)) {
        b.out_norm = norm(x, "the output norm", y);
        z = r.take(OpKind::SelectRows, y, "").out;
    } else {
        y = r.take(OpKind::SelectRows, x, "the selection of the head's rows (or another decoder block)").out;
        b.out_norm = norm(y, "the output norm", z);
    }
    b.output = r.single(z, "the output projection", l);
    if (r.next_is(OpKind::Scale, l)) {
        b.logit_scale = p.ops[r.i].scalar;
        l = r.take(OpKind::Scale, l, "").out;
    }
    if (r.next_is(OpKind::Softcap, l)) {
        b.final_softcap = p.ops[r.i].scalar;
        l = r.take(OpKind::Softcap, l, "").out;
    }
    if (r.next_is(OpKind::Trace, l)) b.logits_trace = p.ops[r.i++].name;
    if (r.i != p.ops.size() || l.id != p.logits.id) r.misfit("the end of the program");
    b.rms_eps = eps;
    return b;
}

std::string cuda_unsupported(const Program& p) {
    // gpt-oss's pieces, named as what the kernels lack rather than as a
    // program that does not fit
    for (const AttentionSpec& a : p.attention)
        if (a.sinks) return "attention sinks (gpt-oss)";
    for (const MoeSpec& m : p.moe)
        if (m.router_bias || m.gate.bias || m.up.bias || m.down.bias || m.act == GluAct::SwiGluOai)
            return "biased experts with the clamped SwiGLU (gpt-oss)";
    BlockPlan b;
    try {
        b = plan_blocks(p);
    } catch (const Error& e) {
        const std::string what = e.what();
        if (what == "an attention output bias") return what;
        return "a program that is not a stack of pre-norm decoder blocks (" + what + ")";
    }
    // Mixture of experts: the limits of the device routing (cuda::moe_route:
    // at most 1024 experts, 16 used per token) and the per-slot activation
    // layout (expert widths in whole 32-element blocks).
    if (b.moe) {
        if (b.n_expert > 1024) return fmt::format("mixture-of-experts layers of {} experts (at most 1024)", b.n_expert);
        if (b.n_expert_used < 1 || b.n_expert_used > 16 || b.n_expert_used > b.n_expert)
            return fmt::format("mixture-of-experts layers using {} experts per token (1 to 16)", b.n_expert_used);
        if (b.n_ff_exp % 32 != 0) return fmt::format("an expert FFN width of {} (not a multiple of 32)", b.n_ff_exp);
    }
    if (const DeltaNetSpec* d = b.delta) {
        const auto ok = [](int h) { return h == 32 || h == 64 || h == 128; };
        if (!ok(d->head_k) || !ok(d->head_v))
            return fmt::format("DeltaNet heads of {} x {} (32, 64 or 128 each)", d->head_k, d->head_v);
        if (d->conv_kernel < 2 || d->conv_kernel > 8) return fmt::format("a DeltaNet conv of {} taps (2 to 8)", d->conv_kernel);
        if (d->n_v_heads % d->n_k_heads != 0) return fmt::format("{} DeltaNet value heads over {} key heads", d->n_v_heads, d->n_k_heads);
    }
    if (b.head_dim != 32 && b.head_dim != 64 && b.head_dim != 96 && b.head_dim != 128 && b.head_dim != 256)
        return fmt::format("attention heads of {} elements", b.head_dim);
    if (b.n_head_kv <= 0 || b.n_head % b.n_head_kv != 0 || b.n_head / b.n_head_kv > 16)
        return fmt::format("{} query heads per KV head (at most 16)", b.n_head_kv > 0 ? b.n_head / b.n_head_kv : 0);
    for (int64_t d : {b.n_embd, b.q_dim(), b.n_ff, b.n_ff_exp, b.n_ff_shexp, b.delta ? b.delta->value_dim() : 0})
        if (d % 32 != 0) return fmt::format("a dimension of {} (not a multiple of 32)", d);
    return "";
}

}  // namespace quern
