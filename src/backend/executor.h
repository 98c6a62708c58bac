// What a backend offers the runtime: the layer program's weights where the
// backend keeps them, a paged KV cache in its memory, and forward passes over
// it (ForwardBatch). The runtime's Session (one sequence) and BatchRunner
// (the serving engine's batches) both drive this one interface; the backend
// knows nothing of requests, samplers or models.
#pragma once
#include <cstdint>
#include <string>

#include "backend/forward_batch.h"
#include "core/error.h"

namespace quern {

class Executor {
public:
    virtual ~Executor() = default;
    /// "CPU" or the device's name ("NVIDIA H200", ...).
    virtual std::string device_name() const = 0;
    /// Storage for a paged KV cache of up to n_blocks blocks of block_size
    /// positions (replacing any earlier one, whose contents are lost).
    /// Returns the blocks made: n_blocks, fewer where the executor was given
    /// a memory budget (--gpu-mem), more where it was told to fill its budget
    /// (a server's GPU pool: backend/kv_budget.h). quern::Error naming
    /// `flag`, the option that sized it, when not even one block fits, or
    /// with the numbers when the memory cannot hold what was asked.
    virtual int64_t make_kv_storage(int64_t n_blocks, int64_t block_size, const char* flag) = 0;
    /// Recurrent state for n sequences of batched passes (SeqBatch::state_slot)
    /// of a program with linear-attention layers (Program::state_floats each).
    /// quern::Error where the backend keeps none.
    virtual void make_state_slots(int64_t n) {
        if (n > 0) fail("this backend runs no batched passes of models with linear-attention layers");
    }
    /// Copies recurrent-state slot `from` over slot `to` (snapshots of a
    /// prefix's state for the prefix cache).
    virtual void copy_state_slot(int32_t from, int32_t to) {
        fail("this backend keeps no recurrent-state slots ({} -> {})", from, to);
    }
    /// Keeps a copy of the lone sequence's recurrent state (the one a
    /// Session's passes carry, not the slots) / puts that copy back: a
    /// speculative step rolls the state back past rejected draft tokens.
    /// quern::Error where the backend keeps no such state.
    virtual void save_lone_state() { fail("this backend keeps no recurrent state to save"); }
    virtual void restore_lone_state() { fail("this backend keeps no recurrent state to restore"); }
    /// Whether a lone sequence's passes take SeqBatch::row_states (else a
    /// verification pass is rolled back by save / restore_lone_state and the
    /// kept rows evaluated again).
    virtual bool keeps_row_states() const { return false; }
    /// After the lone sequence's last pass, of n rows with row_states: the
    /// sequence keeps that pass's first m rows (1 <= m <= n), its recurrent
    /// state the one after row m − 1. quern::Error otherwise.
    virtual void keep_lone_rows(int64_t m) { fail("this backend keeps no per-row recurrent state ({} rows)", m); }
    /// One forward pass over that storage: the sequences' new tokens, their
    /// keys and values written into their blocks, logits (host floats) or
    /// the next token for the sequences that ask. quern::Error (before
    /// anything runs) for an id out of the vocabulary, a block outside the
    /// storage, a request the executor does not take (sampling it did not
    /// accept, a trace of several sequences).
    virtual void forward(const ForwardBatch& batch) = 0;
    /// Whether a pass's `sampling` may ask for this chain.
    virtual bool samples_on_device(const SamplingSpec&) const { return false; }
    /// Evaluating at least this many tokens of a lone sequence at once rounds
    /// the layer matrices' activations to FP8 (ModelOptions::
    /// fp8_activation_rows of a CPU reference); 0: never.
    virtual int64_t fp8_activation_rows() const { return 0; }
    /// Passes replayed from CUDA graphs so far (tests and benchmarks).
    virtual int64_t graph_replays() const { return 0; }
};

}  // namespace quern
