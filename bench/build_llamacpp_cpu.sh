#!/bin/bash
# Builds llama.cpp's llama-bench and llama-perplexity for this machine's CPU
# from the llama.cpp that the llama-cpp-python sdist on PyPI vendors: the
# side-by-side figures of bench/run_cpu_decode.sh. The ISA extensions are this
# CPU's (what -DGGML_NATIVE=ON picks) except AMX: on the project's Xeon VM
# ggml's AMX kernels crash on the first prompt (SIGSEGV in
# ggml_backend_amx_mul_mat), so the native build cannot be measured. A few
# minutes on 2 cores.
#   bench/build_llamacpp_cpu.sh OUT_DIR [VERSION]
# Result: OUT_DIR/bin-cpu/llama-bench, OUT_DIR/bin-cpu/llama-perplexity.
set -euo pipefail
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
SRC=$(bash "$(dirname "$0")/fetch_llamacpp_src.sh" "$OUT" "${2:-0.3.36}")
has() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
cmake -S "$SRC" -B "$OUT/build-cpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_CUDA=OFF \
  -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_BMI2="$(has bmi2)" -DGGML_FMA="$(has fma)" \
  -DGGML_F16C="$(has f16c)" -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VBMI="$(has avx512vbmi)" \
  -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_BF16="$(has avx512_bf16)" -DGGML_AVX_VNNI="$(has avx_vnni)" \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
cmake --build "$OUT/build-cpu" -j"$(nproc)" --target llama-bench llama-perplexity
mkdir -p "$OUT/bin-cpu"
cp "$OUT/build-cpu/bin/llama-bench" "$OUT/build-cpu/bin/llama-perplexity" "$OUT/bin-cpu/"
echo "built: $OUT/bin-cpu/llama-bench $OUT/bin-cpu/llama-perplexity"
