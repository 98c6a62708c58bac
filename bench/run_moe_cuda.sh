#!/bin/bash
# Mixture-of-experts prefill on a GPU machine, from prebuilt binaries:
# synthetic qwen3-30b-a3b prompts (pp512, pp2048; medians of 3, JSON) with
# expert banks in Q8_0, NVFP4 and Q4_K_M, each bank multiplied by its grouped
# kernel; Q8_0 also with token tiles of 64 rows only (QUERN_CUDA_DQ_TOKENS=64);
# then llama3-8b's dense prompts. (The host-routed per-expert GEMMs and the
# decoding grouped kernel in place of the bq layouts, measured slower in
# bench/models-cuda-h200.md, have no switch any more.)
#   bench/run_moe_cuda.sh BIN_DIR OUT_DIR
# BIN_DIR holds quern and lib/ (libfmt, libpcre2-8, libcpp-httplib,
# libcudart from the build machine; cuBLASLt is found in the machine's
# nvidia-cublas package when it is not in lib/). Records go to OUT_DIR.
set -u
BIN=$1
OUT=$2
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
run() {  # NAME QUANT [VAR=VALUE ...]   (PRESET=... picks another shape)
  local name=$1 quant=$2
  shift 2
  env "$@" "$BIN/quern" bench --device cuda --synthetic "${PRESET:-qwen3-30b-a3b}" --quant "$quant" -p 512,2048 -n 0 -r 3 --json \
    2>"$OUT/moe-$name.err" >"$OUT/moe-$name.json"
  python3 -c "
import json, sys
for x in json.load(open(sys.argv[1])): print(sys.argv[2], x.get('test', ''), round(x['median_ts'], 1), round(x['stddev_ts'], 1), round(x['gflops'] / 1000, 1), 'TFLOP/s')" \
    "$OUT/moe-$name.json" "$name" || tail -3 "$OUT/moe-$name.err"
}
run q8-grouped Q8_0
run q8-grouped-t64 Q8_0 QUERN_CUDA_DQ_TOKENS=64
run nvfp4-grouped NVFP4
run q4km-bq Q4_K_M
# Dense prompts (the per-chunk BF16 dequantization shares the decoders).
PRESET=llama3-8b run l8-q4km Q4_K_M
PRESET=llama3-8b run l8-q8 Q8_0
# One file with every run (the machine returns few files).
python3 -c "
import glob, json, os, sys
out = {os.path.basename(f)[4:-5]: json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + '/moe-*.json')) if os.path.getsize(f)}
json.dump(out, open(sys.argv[1] + '/all.json', 'w'), indent=1)" "$OUT"
