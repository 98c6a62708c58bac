#!/bin/bash
# quern quantize on real models: each model's F16 (converted from the file
# at hand; dequantizing is exact), then Q4_K_M, Q5_K_M, Q6_K and Q8_0 from
# that F16, with quern and with llama.cpp's llama-quantize; the two files
# compared byte for byte (tools/gguf_tensor_diff.py when they differ), and
# the perplexity of genesis-kjv.txt (-c 512, the first 20 chunks) on every file with quern and
# with llama-perplexity.
#   bench/run_quantize_cpu.sh LLAMA_BIN_DIR OUT_DIR [MODEL.gguf ...]
# LLAMA_BIN_DIR holds llama-quantize and llama-perplexity (a CPU build of
# llama.cpp); models default to the default model and Gemma 3 270M
# (tools/fetch-model.sh, tools/fetch-gemma3-270m.sh). Results: OUT_DIR/quantize.jsonl.
set -u
LB=$1
OUT=$2
shift 2
HERE=$(cd "$(dirname "$0")/.." && pwd)
Q=$HERE/build/quern
M=${QUERN_HOME:-$HOME/.cache/quern}/models
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=("$M/SmolLM2-135M-Instruct.Q4_1.gguf" "$M/gemma-3-270m-q4_k_m.gguf")
TEXT=$HERE/tests/data/genesis-kjv.txt
mkdir -p "$OUT"
for src in "${MODELS[@]}"; do
  name=$(basename "$src" .gguf)
  f16=$OUT/$name-F16.gguf
  "$Q" quantize "$src" "$f16" F16 --allow-requantize --force 2>/dev/null || { echo "cannot convert $src"; continue; }
  for t in F16 Q8_0 Q6_K Q5_K_M Q4_K_M; do
    f=$f16
    same=null
    if [ $t != F16 ]; then
      f=$OUT/$name-$t.gguf
      "$Q" quantize "$f16" "$f" $t --force 2>/dev/null
      "$LB/llama-quantize" "$f16" "$OUT/ref.gguf" $t >/dev/null 2>&1
      if cmp -s "$f" "$OUT/ref.gguf"; then same=true; else same=false; python3 "$HERE/tools/gguf_tensor_diff.py" "$f" "$OUT/ref.gguf" | tail -3; fi
    fi
    qp=$("$Q" perplexity -m "$f" -f "$TEXT" -c 512 --chunks 20 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["ppl"])')
    lp=$("$LB/llama-perplexity" -m "$f" -f "$TEXT" -c 512 -b 512 --chunks 20 2>&1 | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
    bytes=$(stat -c %s "$f")
    echo "{\"model\": \"$name\", \"type\": \"$t\", \"bytes\": $bytes, \"same_as_llama_quantize\": $same, \"ppl_quern\": ${qp:-null}, \"ppl_llama\": ${lp:-null}}" | tee -a "$OUT/quantize.jsonl"
  done
done
