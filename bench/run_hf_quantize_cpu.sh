#!/bin/bash
# quern quantize from Hugging Face folders on real weights. No small
# checkpoint ships on PyPI, so each model's GGUF is written back as the folder
# it was converted from (bench/gguf_to_hf_folder.py: F16 safetensors under
# transformers' names, llama q/k rows un-permuted, config.json, tokenizer.json);
# then `quern quantize FOLDER` to F16 and Q4_K_M, compared tensor by tensor
# with `quern quantize` of the GGUF itself (tools/gguf_tensor_diff.py), and
# perplexity of the first 20 chunks of genesis-kjv.txt (-c 512) on the
# folder-made files with quern and with llama.cpp's llama-perplexity (which
# thereby loads them).
#   bench/run_hf_quantize_cpu.sh LLAMA_BIN_DIR OUT_DIR [MODEL.gguf ...]
# Results: OUT_DIR/hf_quantize.jsonl.
set -u
LB=$1
OUT=$2
shift 2
HERE=$(cd "$(dirname "$0")/.." && pwd)
Q=$HERE/build/quern
M=${QUERN_HOME:-$HOME/.cache/quern}/models
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=("$M/SmolLM2-135M-Instruct.Q4_1.gguf" "$M/qwen2.5-coder-0.5b-instruct.gguf" "$M/gemma-3-270m-q4_k_m.gguf")
TEXT=$HERE/tests/data/genesis-kjv.txt
mkdir -p "$OUT"
for src in "${MODELS[@]}"; do
  name=$(basename "$src" .gguf)
  hf=$OUT/$name-hf
  python3 "$HERE/bench/gguf_to_hf_folder.py" "$src" "$hf" >/dev/null || continue
  "$Q" quantize "$src" "$OUT/$name-gguf-F16.gguf" F16 --allow-requantize --force 2>/dev/null
  for t in F16 Q4_K_M; do
    f=$OUT/$name-hf-$t.gguf
    "$Q" quantize "$hf" "$f" $t --force 2>/dev/null || { echo "quantize $hf $t failed"; continue; }
    ref=$OUT/$name-gguf-F16.gguf
    [ $t != F16 ] && { ref=$OUT/$name-gguf-$t.gguf; "$Q" quantize "$OUT/$name-gguf-F16.gguf" "$ref" $t --force 2>/dev/null; }
    same=$(python3 "$HERE/tools/gguf_tensor_diff.py" "$f" "$ref" | sed -n 's/^\([0-9]*\) of \([0-9]*\) tensors identical$/\1\/\2/p')
    qp=$("$Q" perplexity -m "$f" -f "$TEXT" -c 512 --chunks 20 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["ppl"])')
    lp=$("$LB/llama-perplexity" -m "$f" -f "$TEXT" -c 512 -b 512 --chunks 20 2>&1 | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
    echo "{\"model\": \"$name\", \"type\": \"$t\", \"tensors_identical_to_gguf_route\": \"$same\", \"ppl_quern\": ${qp:-null}, \"ppl_llama\": ${lp:-null}}" | tee -a "$OUT/hf_quantize.jsonl"
  done
done
