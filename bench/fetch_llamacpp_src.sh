#!/bin/bash
# Downloads and unpacks the llama-cpp-python sdist (which vendors llama.cpp)
# into OUT_DIR once, and prints the llama.cpp source folder: the source of
# bench/build_llamacpp_cpu.sh and bench/build_llamacpp_cuda.sh.
#   bench/fetch_llamacpp_src.sh OUT_DIR [VERSION]      (VERSION: 0.3.36, llama.cpp 0c1e570)
set -euo pipefail
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
VER=${2:-0.3.36}
cd "$OUT"
[ -f "llama_cpp_python-$VER.tar.gz" ] ||
  python3 -m pip download -q "llama-cpp-python==$VER" --no-binary :all: --no-deps -d "$OUT" >&2
[ -d "llama_cpp_python-$VER" ] || tar xzf "llama_cpp_python-$VER.tar.gz"
echo "$OUT/llama_cpp_python-$VER/vendor/llama.cpp"
