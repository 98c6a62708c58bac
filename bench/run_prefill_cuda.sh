#!/bin/bash
# The CUDA prefill path on a GPU machine, from prebuilt binaries: the prefill
# kernel tests, pp512 / pp2048 of synthetic Llama-3-8B shapes (medians of 5,
# JSON), the same GGUF files through llama.cpp's llama-bench when given, and
# a per-op profile of one chunk.
#   bench/run_prefill_cuda.sh BIN_DIR OUT_DIR [LLAMA_BENCH]
# BIN_DIR holds quern, test_prefill_cuda and lib/ (libfmt, libpcre2-8,
# libcudart from the build machine). LLAMA_BENCH: a llama-bench binary built
# for sm_90a (it needs cuBLAS 13 on LD_LIBRARY_PATH). Logs and records go to
# OUT_DIR (prefill.jsonl: one JSON array per quern bench call).
set -u
BIN=$1
OUT=$2
LB=${3:-}
export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
"$BIN/test_prefill_cuda" >"$OUT/test_prefill_cuda.log" 2>&1
echo "test_prefill_cuda exit $?"; grep -E "^\[  FAILED|^\[  PASSED" "$OUT/test_prefill_cuda.log"
for q in Q4_K_M Q8_0 NVFP4; do
  "$BIN/quern" bench --device cuda --synthetic llama3-8b --quant $q -p 512,2048 -n 0 -r 5 --json 2>/dev/null \
    | tee -a "$OUT/prefill.jsonl" | grep -E '"(model|test|median_ts|gflops)"'
done
if [ -n "$LB" ]; then
  for q in Q4_K_M Q8_0; do
    f=/tmp/llama3-8b-$q.gguf
    [ -f "$f" ] || "$BIN/quern" synth llama3-8b --quant $q -o "$f" >/dev/null 2>&1
    "$LB" -m "$f" -p 512,2048 -n 0 -r 3 -ngl 99 -o jsonl 2>/dev/null | tee -a "$OUT/prefill-llamacpp.jsonl"
  done
fi
"$BIN/quern" bench --cuda-profile --device cuda --synthetic llama3-8b -p 2048 -n 0 -r 1 2>&1 \
  | grep -E "^  " | tee "$OUT/profile.txt"
