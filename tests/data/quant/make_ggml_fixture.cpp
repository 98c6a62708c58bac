// Writes ggml_<TYPE>.bin: ggml's own quantize_row_<type>_ref applied to
// quern_fixture::make_input(), and ggml_<TYPE>_imatrix.bin: ggml's
// quantize_<type> with quant_weights (llama-quantize --imatrix's path) on the
// same input as rows of kImatrixRow under make_importance(), for
// tests/unit/quant_test.cpp. Not built by
// quern's CMake; build it against the ggml sources of a llama.cpp checkout:
//
//   G=path/to/llama.cpp/ggml
//   gcc -O2 -std=c11 -c $G/src/ggml-quants.c -I$G/include -I$G/src -o ggml-quants.o
//   g++ -O2 -std=c++20 make_ggml_fixture.cpp ggml-quants.o -o make_ggml_fixture
//   ./make_ggml_fixture OUTPUT_DIR
//
// (on x86-64 without -march flags, so no FMA contraction). The few ggml
// symbols ggml-quants.c references but these functions never call are stubbed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fixture_input.h"

extern "C" {
void quantize_row_q4_0_ref(const float*, void*, int64_t);
void quantize_row_q4_1_ref(const float*, void*, int64_t);
void quantize_row_q5_0_ref(const float*, void*, int64_t);
void quantize_row_q5_1_ref(const float*, void*, int64_t);
void quantize_row_q8_0_ref(const float*, void*, int64_t);
void quantize_row_q8_1_ref(const float*, void*, int64_t);
void quantize_row_q2_K_ref(const float*, void*, int64_t);
void quantize_row_q3_K_ref(const float*, void*, int64_t);
void quantize_row_q4_K_ref(const float*, void*, int64_t);
void quantize_row_q5_K_ref(const float*, void*, int64_t);
void quantize_row_q6_K_ref(const float*, void*, int64_t);
void quantize_row_q8_K_ref(const float*, void*, int64_t);
size_t quantize_q4_0(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q4_1(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q5_0(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q5_1(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q2_K(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q3_K(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q4_K(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q5_K(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q6_K(const float*, void*, int64_t, int64_t, const float*);
void ggml_abort(const char*, int, const char*, ...) { std::abort(); }
// ggml_type ids and block sizes / bytes of the types quantize_<type> asks about.
size_t ggml_row_size(int type, int64_t ne) {
    switch (type) {
        case 2: return ne / 32 * 18;    // Q4_0
        case 3: return ne / 32 * 20;    // Q4_1
        case 6: return ne / 32 * 22;    // Q5_0
        case 7: return ne / 32 * 24;    // Q5_1
        case 10: return ne / 256 * 84;  // Q2_K
        case 11: return ne / 256 * 110; // Q3_K
        case 12: return ne / 256 * 144; // Q4_K
        case 13: return ne / 256 * 176; // Q5_K
        case 14: return ne / 256 * 210; // Q6_K
        default: std::abort();
    }
}
const char* ggml_type_name(int) { return "?"; }
size_t ggml_type_size(int) { std::abort(); }
}

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
        return 2;
    }
    struct Job {
        const char* name;
        void (*fn)(const float*, void*, int64_t);
        int block, bytes;
    } jobs[] = {
        {"Q4_0", quantize_row_q4_0_ref, 32, 18},   {"Q4_1", quantize_row_q4_1_ref, 32, 20},
        {"Q5_0", quantize_row_q5_0_ref, 32, 22},   {"Q5_1", quantize_row_q5_1_ref, 32, 24},
        {"Q8_0", quantize_row_q8_0_ref, 32, 34},   {"Q8_1", quantize_row_q8_1_ref, 32, 36},
        {"Q2_K", quantize_row_q2_K_ref, 256, 84},  {"Q3_K", quantize_row_q3_K_ref, 256, 110},
        {"Q4_K", quantize_row_q4_K_ref, 256, 144}, {"Q5_K", quantize_row_q5_K_ref, 256, 176},
        {"Q6_K", quantize_row_q6_K_ref, 256, 210}, {"Q8_K", quantize_row_q8_K_ref, 256, 292},
    };
    const auto x = quern_fixture::make_input();
    for (const auto& j : jobs) {
        // Zero-filled: ggml leaves the bsums of an all-zero Q8_K block unwritten.
        std::vector<unsigned char> out(static_cast<size_t>(x.size() / j.block * j.bytes), 0);
        j.fn(x.data(), out.data(), static_cast<int64_t>(x.size()));
        const std::string path = std::string(argv[1]) + "/ggml_" + j.name + ".bin";
        FILE* f = std::fopen(path.c_str(), "wb");
        if (!f || std::fwrite(out.data(), 1, out.size(), f) != out.size() || std::fclose(f) != 0) {
            std::perror(path.c_str());
            return 1;
        }
    }
    struct WeightedJob {
        const char* name;
        size_t (*fn)(const float*, void*, int64_t, int64_t, const float*);
        int block, bytes;
    } weighted[] = {
        {"Q4_0", quantize_q4_0, 32, 18},   {"Q4_1", quantize_q4_1, 32, 20},   {"Q5_0", quantize_q5_0, 32, 22},
        {"Q5_1", quantize_q5_1, 32, 24},   {"Q2_K", quantize_q2_K, 256, 84},  {"Q3_K", quantize_q3_K, 256, 110},
        {"Q4_K", quantize_q4_K, 256, 144}, {"Q5_K", quantize_q5_K, 256, 176}, {"Q6_K", quantize_q6_K, 256, 210},
    };
    const auto w = quern_fixture::make_importance();
    for (const auto& j : weighted) {
        std::vector<unsigned char> out(static_cast<size_t>(x.size() / j.block * j.bytes), 0);
        j.fn(x.data(), out.data(), quern_fixture::kImatrixRows, quern_fixture::kImatrixRow, w.data());
        const std::string path = std::string(argv[1]) + "/ggml_" + j.name + "_imatrix.bin";
        FILE* f = std::fopen(path.c_str(), "wb");
        if (!f || std::fwrite(out.data(), 1, out.size(), f) != out.size() || std::fclose(f) != 0) {
            std::perror(path.c_str());
            return 1;
        }
    }
    return 0;
}
