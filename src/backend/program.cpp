#include "backend/program.h"

#include <fmt/format.h>

#include "core/error.h"

namespace quern {

const char* kind_name(OpKind k) {
    switch (k) {
        case OpKind::Embed: return "embed";
        case OpKind::RmsNorm: return "rms_norm";
        case OpKind::Linear: return "linear";
        case OpKind::Attention: return "attention";
        case OpKind::Glu: return "glu";
        case OpKind::Gate: return "gate";
        case OpKind::DeltaNet: return "delta_net";
        case OpKind::Moe: return "moe";
        case OpKind::Add: return "add";
        case OpKind::Scale: return "scale";
        case OpKind::Softcap: return "softcap";
        case OpKind::SelectRows: return "select_rows";
        case OpKind::Trace: return "trace";
        case OpKind::Input: return "input";
        case OpKind::Concat: return "concat";
    }
    return "?";
}

namespace {

void require_f32_vector(const Tensor& t, int64_t n, const char* what) {
    if (t.type != DType::F32 || t.nelements() != n || t.ne[0] != n)
        fail("{} '{}' must be {} F32 values, got {} of {}", what, t.name, n, t.nelements(), dtype_name(t.type));
}

}  // namespace

std::string Program::describe() const {
    std::string s;
    for (const Op& op : ops) {
        s += op.layer >= 0 ? fmt::format("blk.{} ", op.layer) : std::string();
        s += kind_name(op.kind);
        if (op.kind == OpKind::Linear) {
            std::string names;
            for (const LinearPiece& p : op.pieces) names += (names.empty() ? "" : "+") + p.w->name;
            s += " " + names;
        } else if (op.weight) {
            s += " " + op.weight->name;
        } else if (op.kind == OpKind::Trace) {
            s += " " + op.name;
        }
        if (op.out.valid()) s += fmt::format(" -> v{} [{}]", op.out.id, width(op.out));
        s += "\n";
    }
    return s;
}

int64_t Program::state_floats() const {
    int64_t n = 0;
    for (const DeltaNetSpec& d : delta_net) n += d.state_floats();
    return n;
}

int64_t Program::state_offset(int layer) const {
    int64_t n = 0;
    for (const DeltaNetSpec& d : delta_net)
        if (d.state_layer < layer) n += d.state_floats();
    return n;
}

ProgramBuilder::ProgramBuilder(int64_t n_vocab, int n_kv_layers, int64_t kv_dim) {
    p_.n_vocab = n_vocab;
    p_.n_kv_layers = n_kv_layers;
    p_.kv_dim = kv_dim;
}

const ValueInfo& ProgramBuilder::info(Value v) const {
    if (v.id < 0 || v.id >= static_cast<int32_t>(p_.values.size())) fail("program: value v{} does not exist", v.id);
    return p_.values[static_cast<size_t>(v.id)];
}

Value ProgramBuilder::emit(Op op, int64_t width, bool head) {
    op.layer = layer_;
    if (op.kind != OpKind::Trace) {
        op.out = Value{static_cast<int32_t>(p_.values.size())};
        p_.values.push_back(ValueInfo{width, head, static_cast<int>(p_.ops.size())});
    }
    p_.ops.push_back(std::move(op));
    return p_.ops.back().out;
}

Value ProgramBuilder::embed(const Tensor& table) {
    if (table.ne[1] != p_.n_vocab || table.ne[2] != 1 || table.ne[3] != 1)
        fail("embedding '{}' has {} rows, expected the vocabulary size {}", table.name, table.ne[1], p_.n_vocab);
    Op op;
    op.kind = OpKind::Embed;
    op.weight = &table;
    return emit(std::move(op), table.ne[0], false);
}

Value ProgramBuilder::rms_norm(Value x, const Tensor& w, float eps, int64_t group) {
    const ValueInfo& xi = info(x);
    if (group < 0 || (group > 0 && xi.width % group != 0))
        fail("RMSNorm '{}': groups of {} do not divide the width {}", w.name, group, xi.width);
    require_f32_vector(w, group > 0 ? group : xi.width, "RMSNorm weight");
    if (!(eps > 0.0f)) fail("RMSNorm '{}': epsilon must be positive, got {}", w.name, eps);
    Op op;
    op.kind = OpKind::RmsNorm;
    op.in[0] = x;
    op.weight = &w;
    op.eps = eps;
    op.group = group == xi.width ? 0 : group;
    return emit(std::move(op), xi.width, xi.head);
}

Value ProgramBuilder::linear(Value x, std::vector<LinearPiece> pieces) {
    const ValueInfo& xi = info(x);
    if (pieces.empty()) fail("program: a linear op needs at least one matrix");
    int64_t n = 0;
    for (const LinearPiece& p : pieces) {
        if (!p.w) fail("program: a linear op names no matrix");
        if (p.w->ne[0] != xi.width || p.w->ne[2] != 1 || p.w->ne[3] != 1)
            fail("matrix '{}' has rows of {} elements (shape [{}, {}, {}]), but its input has width {}", p.w->name,
                 p.w->ne[0], p.w->ne[0], p.w->ne[1], p.w->ne[2], xi.width);
        if (p.bias) require_f32_vector(*p.bias, p.w->ne[1], "bias");
        n += p.w->ne[1];
    }
    Op op;
    op.kind = OpKind::Linear;
    op.in[0] = x;
    op.pieces = std::move(pieces);
    return emit(std::move(op), n, xi.head);
}

Value ProgramBuilder::attention(Value qkv, const AttentionSpec& s) {
    const ValueInfo& xi = info(qkv);
    if (xi.head) fail("program: attention runs on the pass's rows, not the selected ones");
    if (s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0 || s.head_dim <= 0)
        fail("attention: {} query heads over {} KV heads of {} elements", s.n_head, s.n_head_kv, s.head_dim);
    if (xi.width != s.q_dim() + 2 * s.kv_dim())
        fail("attention of layer {}: its input has width {}, expected q|k|v = {} + 2 × {}", layer_, xi.width, s.q_dim(),
             s.kv_dim());
    if (s.kv_layer < 0 || s.kv_layer >= p_.n_kv_layers || s.kv_dim() != p_.kv_dim)
        fail("attention of layer {}: KV layer {} of {} floats, the cache has {} layers of {}", layer_, s.kv_layer,
             s.kv_dim(), p_.n_kv_layers, p_.kv_dim);
    if (s.rope.dim < 0 || s.rope.dim > s.head_dim || s.rope.dim % 2 != 0)
        fail("attention of layer {}: RoPE over {} of {} elements (must be even and fit the head)", layer_, s.rope.dim,
             s.head_dim);
    if (s.q_norm) require_f32_vector(*s.q_norm, s.head_dim, "q norm");
    if (s.k_norm) require_f32_vector(*s.k_norm, s.head_dim, "k norm");
    if (s.sinks) require_f32_vector(*s.sinks, s.n_head, "attention sinks");
    if ((s.q_norm || s.k_norm) && !(s.norm_eps > 0.0f)) fail("attention of layer {}: q/k norm without an epsilon", layer_);
    if (s.window < 0 || s.softcap < 0.0f || !(s.scale > 0.0f))
        fail("attention of layer {}: window {}, soft-cap {} and scale {} out of range", layer_, s.window, s.softcap,
             s.scale);
    Op op;
    op.kind = OpKind::Attention;
    op.in[0] = qkv;
    op.spec = static_cast<int>(p_.attention.size());
    p_.attention.push_back(s);
    return emit(std::move(op), s.q_dim(), false);
}

Value ProgramBuilder::glu(Value gate_up, GluAct act) {
    const ValueInfo& xi = info(gate_up);
    if (xi.width % 2 != 0) fail("program: a gated FFN's input [gate | up] has odd width {}", xi.width);
    if (act == GluAct::Sigmoid || act == GluAct::SwiGluOai)
        fail("program: a gated FFN is SiLU or GELU (the clamped SwiGLU is the experts')");
    Op op;
    op.kind = OpKind::Glu;
    op.in[0] = gate_up;
    op.act = act;
    return emit(std::move(op), xi.width / 2, xi.head);
}

Value ProgramBuilder::gate(Value x, Value g, GluAct act) {
    const ValueInfo& xi = info(x);
    if (info(g).width != xi.width && info(g).width != 1)
        fail("program: gate of width {} for a value of width {}", info(g).width, xi.width);
    if (act != GluAct::SiLU && act != GluAct::Sigmoid) fail("program: an output gate is SiLU or sigmoid");
    Op op;
    op.kind = OpKind::Gate;
    op.in[0] = x;
    op.in[1] = g;
    op.act = act;
    return emit(std::move(op), xi.width, xi.head);
}

Value ProgramBuilder::delta_net(Value qkv, Value ba, DeltaNetSpec s) {
    const ValueInfo& xi = info(qkv);
    if (s.n_k_heads <= 0 || s.n_v_heads <= 0 || s.n_v_heads % s.n_k_heads != 0 || s.head_k <= 0 || s.head_v <= 0 ||
        s.conv_kernel < 1)
        fail("delta-net layer {}: {} key heads of {}, {} value heads of {}, conv kernel {}", layer_, s.n_k_heads,
             s.head_k, s.n_v_heads, s.head_v, s.conv_kernel);
    if (xi.width != s.conv_dim()) fail("delta-net layer {}: q|k|v of width {}, expected {}", layer_, xi.width, s.conv_dim());
    if (info(ba).width != 2 * s.n_v_heads)
        fail("delta-net layer {}: [b | a] of width {}, expected {}", layer_, info(ba).width, 2 * s.n_v_heads);
    if (!s.conv || s.conv->type != DType::F32 || s.conv->ne[0] != s.conv_kernel || s.conv->ne[1] != s.conv_dim())
        fail("delta-net layer {}: the conv1d weight must be F32 {} × {}", layer_, s.conv_kernel, s.conv_dim());
    require_f32_vector(*s.a_coef, s.n_v_heads, "delta-net A");
    require_f32_vector(*s.dt_bias, s.n_v_heads, "delta-net dt bias");
    if (s.state_layer < 0) s.state_layer = static_cast<int>(p_.delta_net.size());
    Op op;
    op.kind = OpKind::DeltaNet;
    op.in[0] = qkv;
    op.in[1] = ba;
    op.spec = static_cast<int>(p_.delta_net.size());
    const int64_t out = s.value_dim();
    p_.delta_net.push_back(s);
    return emit(std::move(op), out, xi.head);
}

Value ProgramBuilder::moe(Value x, MoeSpec s) {
    const ValueInfo& xi = info(x);
    if (s.n_expert <= 0 || s.n_used <= 0 || s.n_used > s.n_expert || s.n_ff <= 0)
        fail("expert layer {}: {} of {} experts of width {}", layer_, s.n_used, s.n_expert, s.n_ff);
    if (!s.router || s.router->ne[0] != xi.width || s.router->ne[1] != s.n_expert)
        fail("expert layer {}: the router must be {} × {}", layer_, xi.width, s.n_expert);
    const auto bank = [&](const ExpertBank& b, int64_t K, int64_t N, const char* what) {
        if (static_cast<int>(b.experts.size()) != s.n_expert)
            fail("expert layer {}: {} {} matrices for {} experts", layer_, b.experts.size(), what, s.n_expert);
        for (const Tensor* t : b.experts)
            if (!t || t->ne[0] != K || t->ne[1] != N)
                fail("expert layer {}: {} matrix '{}' must be {} × {}", layer_, what, t ? t->name : "?", K, N);
    };
    bank(s.gate, xi.width, s.n_ff, "gate");
    bank(s.up, xi.width, s.n_ff, "up");
    bank(s.down, s.n_ff, xi.width, "down");
    if (s.router_bias) require_f32_vector(*s.router_bias, s.n_expert, "router bias");
    for (const ExpertBank* b : {&s.gate, &s.up, &s.down}) {
        const Tensor* t = b->bias;
        const int64_t N = b == &s.down ? xi.width : s.n_ff;
        if (t && (t->type != DType::F32 || t->ne[0] != N || t->ne[1] != s.n_expert || t->ne[2] != 1 || t->ne[3] != 1))
            fail("expert layer {}: expert bias '{}' must be F32 of {} × {}", layer_, t->name, N, s.n_expert);
    }
    if (s.act == GluAct::Sigmoid) fail("expert layer {}: sigmoid is an output gate, not an expert activation", layer_);
    if (s.act == GluAct::SwiGluOai && !(s.glu_alpha > 0.0f && s.glu_limit > 0.0f))
        fail("expert layer {}: the clamped SwiGLU needs α > 0 and a limit > 0 (got {}, {})", layer_, s.glu_alpha,
             s.glu_limit);
    Op op;
    op.kind = OpKind::Moe;
    op.in[0] = x;
    op.spec = static_cast<int>(p_.moe.size());
    op.act = s.act;
    p_.moe.push_back(std::move(s));
    return emit(std::move(op), xi.width, xi.head);
}

Value ProgramBuilder::add(Value a, Value b) {
    const ValueInfo& ai = info(a);
    const ValueInfo& bi = info(b);
    if (ai.width != bi.width || ai.head != bi.head)
        fail("program: add of values of width {} and {} (layer {})", ai.width, bi.width, layer_);
    Op op;
    op.kind = OpKind::Add;
    op.in[0] = a;
    op.in[1] = b;
    return emit(std::move(op), ai.width, ai.head);
}

Value ProgramBuilder::scale(Value x, float s) {
    const ValueInfo& xi = info(x);
    Op op;
    op.kind = OpKind::Scale;
    op.in[0] = x;
    op.scalar = s;
    return emit(std::move(op), xi.width, xi.head);
}

Value ProgramBuilder::softcap(Value x, float cap) {
    const ValueInfo& xi = info(x);
    if (!(cap > 0.0f)) fail("program: soft-cap {} must be positive", cap);
    Op op;
    op.kind = OpKind::Softcap;
    op.in[0] = x;
    op.scalar = cap;
    return emit(std::move(op), xi.width, xi.head);
}

Value ProgramBuilder::select_rows(Value x) {
    const ValueInfo& xi = info(x);
    if (xi.head) fail("program: rows selected twice");
    Op op;
    op.kind = OpKind::SelectRows;
    op.in[0] = x;
    return emit(std::move(op), xi.width, true);
}

void ProgramBuilder::trace(Value x, std::string name) {
    info(x);
    Op op;
    op.kind = OpKind::Trace;
    op.in[0] = x;
    op.name = std::move(name);
    emit(std::move(op), 0, false);
}

Value ProgramBuilder::input(int64_t width) {
    for (const Op& o : p_.ops)
        if (o.kind == OpKind::Input) fail("program: a second input of given rows");
    if (width <= 0) fail("program: given rows of width {}", width);
    Op op;
    op.kind = OpKind::Input;
    return emit(std::move(op), width, false);
}

Value ProgramBuilder::concat(Value a, Value b) {
    const ValueInfo& ai = info(a);
    const ValueInfo& bi = info(b);
    if (ai.head != bi.head) fail("program: concatenating the pass's rows with the selected ones");
    Op op;
    op.kind = OpKind::Concat;
    op.in[0] = a;
    op.in[1] = b;
    return emit(std::move(op), ai.width + bi.width, ai.head);
}

Program ProgramBuilder::finish(Value logits, Value hidden) {
    const ValueInfo& li = info(logits);
    if (!li.head || li.width != p_.n_vocab)
        fail("program: the output must be the selected rows' {} logits, got a value of width {}", p_.n_vocab, li.width);
    if (hidden.valid() && info(hidden).head) fail("program: the hidden rows must be the pass's, not the selected ones");
    p_.logits = logits;
    p_.hidden = hidden;
    return std::move(p_);
}

const Tensor& ProgramBuilder::rows_view(const Tensor& t, int64_t i2, int64_t r0, int64_t rows, std::string name) {
    if (i2 < 0 || i2 >= t.ne[2] || r0 < 0 || rows <= 0 || r0 + rows > t.ne[1] || t.ne[3] != 1)
        fail("tensor '{}' of shape [{}, {}, {}] has no rows {}..{} of matrix {}", t.name, t.ne[0], t.ne[1], t.ne[2], r0,
             r0 + rows, i2);
    Tensor v = t;
    v.name = std::move(name);
    v.data = static_cast<uint8_t*>(t.data) + static_cast<size_t>(i2) * t.nb[2] + static_cast<size_t>(r0) * t.nb[1];
    v.ne = {t.ne[0], rows, 1, 1};
    v.nb[2] = v.nb[1] * static_cast<size_t>(rows);
    v.nb[3] = v.nb[2];
    p_.views.push_back(std::move(v));
    return p_.views.back();
}

const float* ProgramBuilder::constant(std::vector<float> v) {
    for (const auto& c : p_.constants)  // one copy of each table: backends key their own copies by address
        if (c == v) return c.data();
    p_.constants.push_back(std::move(v));
    return p_.constants.back().data();
}

}  // namespace quern
