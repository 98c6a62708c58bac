#!/bin/bash
# The CUDA decode path on a GPU machine, from prebuilt binaries: GPU tests,
# `quern run --verify` and greedy text on the default model, and decode
# benchmarks of synthetic Llama-3-8B shapes.
#   bench/run_decode_cuda.sh BIN_DIR OUT_DIR [MODEL.gguf] [what...]
# BIN_DIR holds quern, test_session_cuda, test_gemv_cuda, test_ops_cuda and
# lib/ (libfmt, libpcre2-8, libcudart from the build machine). `what` picks
# parts: tests, run, bench, bench-depth, variants, profile (default: all). Logs go to OUT_DIR.
set -u
BIN=$1
OUT=$2
MODEL=${3:-}
shift $(( $# < 3 ? $# : 3 ))
WHAT=${*:-tests run bench bench-depth variants profile}
export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
if [ -n "$MODEL" ] && [ -f "$MODEL" ]; then
  mkdir -p /tmp/quern-home/models
  ln -sf "$(readlink -f "$MODEL")" /tmp/quern-home/models/SmolLM2-135M-Instruct.Q4_1.gguf
  export QUERN_HOME=/tmp/quern-home
fi
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv \
  >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

if has tests; then
  for t in test_session_cuda test_gemv_cuda test_ops_cuda; do
    "$BIN/$t" >"$OUT/$t.log" 2>&1
    echo "$t exit $?"
    grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|error:|Failure|relative error|golden|verify|greedy" "$OUT/$t.log" | head -80
  done
fi

if has run; then
  {
    for p in "The capital of France is" \
      $'<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n<|im_start|>assistant\n' \
      "In 1969, Neil Armstrong became the first person to walk on the Moon. The mission, Apollo 11, launched from Florida and"; do
      for dev in cpu cuda; do
        echo "== $dev: $p"
        extra=""
        [ $dev = cuda ] && extra="--verify"
        "$BIN/quern" run --device $dev $extra -p "$p" -n 48 --temp 0 2>&1
      done
    done
  } >"$OUT/run.log" 2>&1
  cat "$OUT/run.log"
fi

if has bench; then
  for q in Q4_K_M Q8_0; do
    "$BIN/quern" bench --device cuda --synthetic llama3-8b --quant $q -p 0 -n 128 -r 5 2>&1 | tee -a "$OUT/bench.log"
  done
fi
if has bench-depth; then
  for q in Q4_K_M Q8_0; do
    "$BIN/quern" bench --device cuda --synthetic llama3-8b --quant $q -p 0 -n 128 -r 3 -d 4096 2>&1 | tee -a "$OUT/bench.log"
  done
fi
if has variants; then  # one-level activations; kernels launched one by one
  "$BIN/quern" bench --device cuda --synthetic llama3-8b --quant Q4_K_M -p 0 -n 128 -r 5 --fast-act 2>&1 | tee -a "$OUT/bench.log"
  "$BIN/quern" bench --device cuda --synthetic llama3-8b --quant Q4_K_M -p 0 -n 128 -r 5 --no-cuda-graph 2>&1 | tee -a "$OUT/bench.log"
fi
if has profile; then  # GPU time per op kind (events between ops, uncaptured)
  for q in Q4_K_M Q8_0; do
    "$BIN/quern" bench --cuda-profile --device cuda --synthetic llama3-8b --quant $q -p 0 -n 32 -r 1 2>&1 | tee -a "$OUT/profile.log"
  done
fi
