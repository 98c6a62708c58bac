#!/bin/bash
# Runs the CUDA GEMV tests and benchmark from prebuilt binaries on a GPU machine.
#   bench/run_gemv_cuda.sh BIN_DIR OUT_DIR [bench_gemv_cuda args...]
# BIN_DIR holds test_gemv_cuda, bench_gemv_cuda and lib/ (libfmt, libpcre2-8,
# libcudart copied from the build machine). Logs: OUT_DIR/{gpu.txt,test.log,bench.log,bench.csv}.
set -u
BIN=$1
OUT=$2
shift 2
export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,power.limit \
  --format=csv 2>&1 | tee "$OUT/gpu.txt"
"$BIN/test_gemv_cuda" >"$OUT/test.log" 2>&1
rc=$?
echo "test_gemv_cuda exit $rc"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|Failure|error" "$OUT/test.log" | head -30
if [ $rc -ne 0 ]; then
  tail -15 "$OUT/test.log"
  if [ -x "$BIN/test_gemv_cuda_asan" ]; then  # host memory errors: rerun under AddressSanitizer
    ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0 "$BIN/test_gemv_cuda_asan" >"$OUT/test_asan.log" 2>&1
    echo "test_gemv_cuda_asan exit $?"
    grep -A30 "ERROR: AddressSanitizer" "$OUT/test_asan.log" | head -40
    tail -5 "$OUT/test_asan.log"
  fi
fi
"$BIN/bench_gemv_cuda" --csv "$OUT/bench.csv" "$@" 2>&1 | tee "$OUT/bench.log"
