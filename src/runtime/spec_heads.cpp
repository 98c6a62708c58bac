#include "runtime/spec_heads.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/speculative.h"

namespace quern {

SpecHeads::SpecHeads(std::unique_ptr<Executor> x, int64_t n_embd, int64_t n_vocab, int64_t n_blocks,
                     int64_t block_size, int n_slots)
    : x_(std::move(x)), n_vocab_(n_vocab), n_embd_(n_embd) {
    if (!x_) fail("speculative decoding needs the draft head's executor");
    if (x_->make_kv_storage(n_blocks, block_size, "--spec-draft") < n_blocks)
        fail("the draft head's KV cache of {} blocks does not fit beside the model's (lower -c or --parallel)", n_blocks);
    heads_.resize(static_cast<size_t>(n_slots));
}

void SpecHeads::reset(int slot, int64_t pos) {
    Head& h = heads_[static_cast<size_t>(slot)];
    h.pos = pos;
    h.pend.clear();
}

void SpecHeads::observe(int slot, const float* hidden, int64_t n) {
    Head& h = heads_[static_cast<size_t>(slot)];
    h.pend.insert(h.pend.end(), hidden, hidden + n * n_embd_);
}

void SpecHeads::draft(std::vector<Ask>& asks) {
    const int64_t E = n_embd_, V = n_vocab_;
    // 1. Every head reads its rows whose next token is known; a head asked
    //    for drafts must end at the sequence's last token's position.
    std::vector<SeqBatch> batch;
    std::vector<Ask*> fed;
    for (Ask& a : asks) {
        Head& h = heads_[static_cast<size_t>(a.slot)];
        const auto& T = *a.tokens;
        const int64_t rows = static_cast<int64_t>(h.pend.size()) / E;
        const int64_t m = std::min<int64_t>(rows, static_cast<int64_t>(T.size()) - 1 - h.pos);
        const bool can_draft = m > 0 && h.pos + m == static_cast<int64_t>(T.size()) - 1;
        if (!can_draft) a.k = 0;
        if (m <= 0) continue;
        h.toks.assign(T.begin() + h.pos + 1, T.begin() + h.pos + 1 + m);
        h.rows.resize(static_cast<size_t>(m * E));
        h.logits.resize(static_cast<size_t>(V));
        SeqBatch q;
        q.tokens = h.toks.data();
        q.n = m;
        q.block_table = a.blocks;
        q.n_past = h.pos;
        q.logits = a.k > 0 ? h.logits.data() : nullptr;
        q.hidden_in = h.pend.data();
        q.hidden = h.rows.data();
        batch.push_back(q);
        fed.push_back(&a);
    }
    if (!batch.empty()) {
        ForwardBatch fb;
        fb.seqs = batch.data();
        fb.n_seqs = static_cast<int>(batch.size());
        x_->forward(fb);
    }
    for (Ask* a : fed) {
        Head& h = heads_[static_cast<size_t>(a->slot)];
        const int64_t m = static_cast<int64_t>(h.toks.size());
        h.chain.assign(h.rows.end() - E, h.rows.end());
        h.pend.erase(h.pend.begin(), h.pend.begin() + m * E);
        h.pos += m;
    }
    // 2. Drafts: the first from those logits, each next from one more pass
    //    of the head over the draft before it.
    std::uniform_real_distribution<double> uni(0.0, 1.0);
    std::vector<Ask*> drafting;
    for (Ask& a : asks) {
        a.drafts->clear();
        if (a.k <= 0) continue;
        a.q_rows->resize(static_cast<size_t>(a.k * V));
        drafting.push_back(&a);
    }
    for (int64_t i = 0;; ++i) {
        std::vector<Ask*> live;
        for (Ask* a : drafting) {
            if (i >= a->k) continue;
            Head& h = heads_[static_cast<size_t>(a->slot)];
            a->drafts->push_back(
                draw_draft(*a->sampler, a->drafts->data(), i, h.logits.data(), uni(*a->rng), a->q_rows->data() + i * V));
            if (i + 1 < a->k) live.push_back(a);
        }
        if (live.empty()) break;
        batch.clear();
        for (Ask* a : live) {
            Head& h = heads_[static_cast<size_t>(a->slot)];
            h.rows.resize(static_cast<size_t>(E));
            SeqBatch q;
            q.tokens = &a->drafts->back();
            q.n = 1;
            q.block_table = a->blocks;
            q.n_past = h.pos + i;  // draft i + 1 at the position after the sequence's last token, and on
            q.logits = h.logits.data();
            q.hidden_in = h.chain.data();
            q.hidden = h.rows.data();
            batch.push_back(q);
        }
        ForwardBatch fb;
        fb.seqs = batch.data();
        fb.n_seqs = static_cast<int>(batch.size());
        x_->forward(fb);
        for (Ask* a : live) {
            Head& h = heads_[static_cast<size_t>(a->slot)];
            h.chain.swap(h.rows);
        }
    }
}

}  // namespace quern
