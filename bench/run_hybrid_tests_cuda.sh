#!/bin/bash
# The GPU checks of the hybrid (Qwen3.5) path, from prebuilt binaries
# (bench/pack_cuda.sh quern and the tests/cuda binaries into BIN_DIR): the
# DeltaNet and gated kernels against their references, the hybrid tests
# (the tiny presets against the CPU, prompt passes in chunks, greedy, the
# serving engine with state slots), transformers' logits on the Qwen3.5 GPU
# fixtures (token by token), the batch runner against the CPU's with state
# slots, `quern run --verify` on the tiny Qwen3.5 presets, then the other
# GPU suites. The
# decode-step listings go to OUT_DIR/lowering (copy them to tests/data/lowering
# when a change is intended). Logs in OUT_DIR; the repository root must be
# reachable at the path the tests were built with (QUERN_SOURCE_DIR).
#   bench/run_hybrid_tests_cuda.sh BIN_DIR OUT_DIR
set -u
B=$1
OUT=$2
mkdir -p "$OUT/lowering"
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
run() {
  t=$1
  timeout "${T:-150}" "$B/$t" >"$OUT/$t.log" 2>&1
  echo "== $t exit $?"
  grep -E "FAILED|Failure|PASSED|worst|one call|cut at|requests as alone" "$OUT/$t.log" | head -40
}
run test_delta_rule_cuda
run test_hybrid_cuda
run test_hf_golden_cuda
run test_batch_cuda
for p in qwen3.5-27b qwen3.5-35b-a3b; do
  for q in Q8_0 Q4_K_M; do
    "$B/quern" synth "$p" --tiny --quant $q -o /tmp/hybrid-tiny.gguf >/dev/null 2>&1
    echo "== verify $p tiny $q"
    timeout 60 "$B/quern" run -m /tmp/hybrid-tiny.gguf -p "Hello world, this is a test of the thing" -n 8 --temp 0 \
      --device cuda --verify 2>&1 | tail -4
  done
done
LOWERING_LISTING_OUT=$OUT/lowering run test_lowering_cuda
T=120 run test_ops_cuda
T=120 run test_prefill_cuda
T=200 run test_session_cuda
