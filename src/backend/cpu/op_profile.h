// Where a CPU forward pass spends its time (quern bench --cpu-profile): wall
// time per op of the layer program, summed over the passes of a session and
// grouped by what the op is — a matrix product by its weight's role and type
// ("ffn_down Q6_K": the tensor name without its "blk.N." prefix), any other
// op by its kind ("attention", "rms_norm"). Decode steps (passes of one row)
// and prompt passes are kept apart; for matrix products the weight bytes
// read give the achieved bandwidth.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace quern::cpu {

class OpProfile {
public:
    /// Starts a pass of `rows` rows: its ops count as a decode step's
    /// (rows == 1) or a prompt pass's.
    void begin_pass(int64_t rows);
    /// Adds one op's time to the current pass under `label`; `bytes`: weight
    /// bytes it read (0: none counted).
    void add(const std::string& label, double seconds, uint64_t bytes);
    /// Per label: µs per pass, share, GB/s of weight reads, for decode steps
    /// and prompt passes (stderr, as --cuda-profile).
    void print() const;

    using Clock = std::chrono::steady_clock;

private:
    struct Entry {
        std::string label;
        double seconds = 0;
        uint64_t bytes = 0;
    };
    struct Table {
        std::vector<Entry> entries;
        int64_t passes = 0, rows = 0;
    };
    static void print(const Table& t, const char* what);
    Table decode_, prompt_;
    Table* cur_ = &decode_;  // the current pass's table
};

}  // namespace quern::cpu
