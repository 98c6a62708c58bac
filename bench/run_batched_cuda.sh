#!/bin/bash
# Batched decode and serving on a GPU machine, from prebuilt binaries: the
# batch-runner tests, `quern bench --batch` over 1 to 256 sequences of
# 128-token prompts and 128 generated tokens (native and FP8 weights, medians
# of 3, JSON), llama.cpp's llama-batched-bench on the same file when LLAMA_DIR
# holds it (bench/build_llamacpp_cuda.sh), a per-op profile of the passes, and
# bench/loadgen.py against `quern serve --device cuda` at concurrency 1 to 256
# (greedy).
#   bench/run_batched_cuda.sh BIN_DIR OUT_DIR [LLAMA_DIR]
# BIN_DIR holds quern, test_batch_cuda and lib/ (libfmt, libpcre2-8,
# libcudart from the build machine). loadgen.py needs the `openai` package
# (pip install openai, or wheels carried to the machine). Records go to
# OUT_DIR.
set -u
BIN=$1
OUT=$2
LB=${3:-}
HERE=$(cd "$(dirname "$0")/.." && pwd)
export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
"$BIN/test_batch_cuda" >"$OUT/test_batch_cuda.log" 2>&1
echo "test_batch_cuda exit $?"; grep -E "^\[  FAILED|^\[  PASSED" "$OUT/test_batch_cuda.log"
M=/tmp/llama3-8b-Q4_K_M.gguf
[ -f "$M" ] || "$BIN/quern" synth llama3-8b --quant Q4_K_M -o "$M" >/dev/null 2>&1
for w in native fp8; do
  "$BIN/quern" bench --device cuda --gpu-weights $w -m "$M" --batch 1,8,32,64,128,256 -p 128 -n 128 -r 3 --json \
    2>/dev/null >"$OUT/batch-$w.json"
  python3 -c "
import json, sys
for x in json.load(open(sys.argv[1])): print(sys.argv[2], x['parallel'], round(x['decode_tps_median'], 1), round(x['gen_tps_median'], 1))" \
    "$OUT/batch-$w.json" $w
done
if [ -n "$LB" ] && [ -x "$LB/llama-batched-bench" ]; then
  # Same prompts and generation; S_TG is its decode tok/s over all sequences.
  "$LB/llama-batched-bench" -m "$M" -ngl 99 -c 70000 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,8,32,64,128,256 \
    2>>"$OUT/llama-stderr.log" | tee "$OUT/llama-batched.txt"
fi
"$BIN/quern" bench --cuda-profile --device cuda -m "$M" --batch 64 -p 128 -n 128 -r 1 2>&1 \
  | grep -E "^  " | tee "$OUT/profile.txt"
PORT=18080
"$BIN/quern" serve -m "$M" --device cuda --port $PORT --parallel 256 -c 1024 --token-budget 2048 -q \
  >"$OUT/serve.log" 2>&1 &
PID=$!
for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.5; done
python3 "$HERE/bench/loadgen.py" --base-url "http://127.0.0.1:$PORT/v1" --concurrency 1,16,64,256 \
  --max-tokens 128 --temperature 0 --json "$OUT/serve-greedy.json"
kill $PID; wait $PID 2>/dev/null
