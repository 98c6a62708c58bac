#!/bin/bash
# Runs the CUDA decode-op tests and benchmark from prebuilt binaries on a GPU machine.
#   bench/run_ops_cuda.sh BIN_DIR OUT_DIR
# BIN_DIR holds test_ops_cuda, bench_ops_cuda and lib/ (libfmt, libpcre2-8,
# libcudart copied from the build machine). Logs: OUT_DIR/{test.log,bench.log,memcheck.log}.
set -u
BIN=$1
OUT=$2
export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
"$BIN/test_ops_cuda" >"$OUT/test.log" 2>&1
echo "test_ops_cuda exit $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|Failure|error|Which is|got|vs" "$OUT/test.log" | head -40
"$BIN/bench_ops_cuda" 2>&1 | tee "$OUT/bench.log"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$CS" ]; then  # out-of-bounds / race checks on the small cases
  timeout 150 "$CS" --tool memcheck --error-exitcode 9 "$BIN/test_ops_cuda" \
    --gtest_filter='-*DecodeAttention*:*RopeKvStore*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?"; tail -4 "$OUT/memcheck.log"
else
  echo "no compute-sanitizer"
fi
