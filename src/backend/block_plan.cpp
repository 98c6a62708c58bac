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

void same(int64_t& have, int64_t got, const char* what, size_t il) {
    if (have == 0) have = got;
    else if (have != got) fail("layer {} has {} {} where earlier layers have {}", il, what, got, have);
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
        if (eps == 0.0f) eps = op.eps;
        else if (op.eps != eps) fail("RMSNorm '{}' has epsilon {} where the others have {}", op.weight->name, op.eps, eps);
        out = op.out;
        return op.weight;
    };
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
    while (r.next_is(OpKind::RmsNorm, x)) {
        x_in = x;
        const size_t il = b.layers.size();
        BlockPlanLayer L;
        Value h, a, o;
        L.attn_norm = norm(x, "the attention norm", h);
        const Op& qkv = r.take(OpKind::Linear, h, "the Q|K|V projection");
        L.qkv = qkv.pieces;
        for (const LinearPiece& pc : L.qkv)
            if ((pc.bias != nullptr) != (L.qkv.front().bias != nullptr))
                fail("layer {}: biases on some of the Q|K|V projections only", il);
        const Op& at = r.take(OpKind::Attention, qkv.out, "attention");
        L.attn = &p.attention[static_cast<size_t>(at.spec)];
        if (L.attn->kv_layer != static_cast<int>(il)) fail("layer {} attends over KV-cache layer {}", il, L.attn->kv_layer);
        {
            const Op& wo = r.take(OpKind::Linear, at.out, "the attention output projection");
            if (wo.pieces.size() != 1) r.misfit("the attention output projection");
            if (wo.pieces[0].bias) fail("an attention output bias");
            L.wo = wo.pieces[0].w;
            o = wo.out;
        }
        x = residual(o, L.post_attn_norm, L.attn_out_scale, "the attention residual add");
        x_in = x;
        L.ffn_norm = norm(x, "the FFN norm", h);
        Value f;
        if (r.next_is(OpKind::Moe, h)) {
            const Op& m = r.take(OpKind::Moe, h, "");
            L.moe = &p.moe[static_cast<size_t>(m.spec)];
            L.act = L.moe->act;
            same(b.n_expert, L.moe->n_expert, "experts", il);
            same(b.n_expert_used, L.moe->n_used, "experts per token", il);
            same(b.n_ff_exp, L.moe->n_ff, "an expert width of", il);
            f = m.out;
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
        same(b.n_head, L.attn->n_head, "query heads:", il);
        same(b.n_head_kv, L.attn->n_head_kv, "KV heads:", il);
        same(b.head_dim, L.attn->head_dim, "heads of", il);
        b.post_norms = b.post_norms || L.post_attn_norm || L.post_ffn_norm;
        b.branch_scales = b.branch_scales || L.attn_out_scale != 1.0f || L.ffn_out_scale != 1.0f;
        b.moe = b.moe || L.moe;
        if (const RopeSpec& rp = L.attn->rope; rp.long_factors) {
            // One LongRoPE switch for the whole model (it is made per pass, from the sequence's last position).
            for (const BlockPlanLayer& E : b.layers) {
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
    y = r.take(OpKind::SelectRows, x, "the selection of the head's rows (or another decoder block)").out;
    b.out_norm = norm(y, "the output norm", z);
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
    if (!p.delta_net.empty()) return "Gated DeltaNet (linear-attention) layers";
    for (const Op& op : p.ops)
        if (op.kind == OpKind::Gate) return "gated attention outputs";
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
    if (b.head_dim != 32 && b.head_dim != 64 && b.head_dim != 96 && b.head_dim != 128 && b.head_dim != 256)
        return fmt::format("attention heads of {} elements", b.head_dim);
    if (b.n_head_kv <= 0 || b.n_head % b.n_head_kv != 0 || b.n_head / b.n_head_kv > 16)
        return fmt::format("{} query heads per KV head (at most 16)", b.n_head_kv > 0 ? b.n_head / b.n_head_kv : 0);
    for (int64_t d : {b.n_embd, b.q_dim(), b.n_ff, b.n_ff_exp})
        if (d % 32 != 0) return fmt::format("a dimension of {} (not a multiple of 32)", d);
    return "";
}

}  // namespace quern
