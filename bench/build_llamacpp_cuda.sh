#!/bin/bash
# Builds llama.cpp's llama-bench and llama-batched-bench with CUDA (Hopper,
# sm_90a; static libraries, so the two binaries travel alone) from the
# llama.cpp that the llama-cpp-python sdist on PyPI vendors: the side-by-side
# figures of bench/run_qwen35_cuda.sh and bench/run_vs_llamacpp_cuda.sh.
# Needs the CUDA toolkit, not a GPU; ~190 CUDA units (minutes on 16 cores,
# about an hour on 2).
#   bench/build_llamacpp_cuda.sh OUT_DIR [VERSION]
#   LLAMA_SRC=DIR bench/build_llamacpp_cuda.sh OUT_DIR   (an unpacked llama.cpp
#   source: a GPU machine without network builds the copy carried to it)
# Result: OUT_DIR/bin/llama-bench, OUT_DIR/bin/llama-batched-bench.
set -euo pipefail
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
SRC=${LLAMA_SRC:-$(bash "$(dirname "$0")/fetch_llamacpp_src.sh" "$OUT" "${2:-0.3.36}")}
cmake -S "$SRC" -B "$OUT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_NATIVE=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_SERVER=OFF >/dev/null
cmake --build "$OUT/build" -j"$(nproc)" --target llama-bench llama-batched-bench
mkdir -p "$OUT/bin"
cp "$OUT/build/bin/llama-bench" "$OUT/build/bin/llama-batched-bench" "$OUT/bin/"
echo "built: $OUT/bin/llama-bench $OUT/bin/llama-batched-bench"
