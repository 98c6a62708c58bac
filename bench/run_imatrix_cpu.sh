#!/bin/bash
# quern imatrix and quantize --imatrix on real models: for each model, its F16
# (converted from the file at hand), an importance matrix over the second half
# of genesis-kjv.txt (the calibration text) with `quern imatrix` and with
# llama.cpp's llama-imatrix, then Q2_K, Q3_K_M, Q4_0 and Q4_K_M without and
# with quern's imatrix. llama-quantize --imatrix with the same imatrix file is
# compared byte for byte with quern's output. Perplexity of the first 20
# chunks of genesis-kjv.txt (-c 512; text the imatrix never saw) by quern on
# every file. Also compares the two imatrix files (cosine per matrix).
#   bench/run_imatrix_cpu.sh LLAMA_BIN_DIR OUT_DIR [MODEL.gguf ...]
# LLAMA_BIN_DIR holds llama-imatrix and llama-quantize (a CPU build of
# llama.cpp). Results: OUT_DIR/imatrix.jsonl.
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
CAL=$OUT/calibration.txt
tail -c $(( $(stat -c %s "$TEXT") / 2 )) "$TEXT" > "$CAL"
ppl() { "$Q" perplexity -m "$1" -f "$TEXT" -c 512 --chunks 20 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["ppl"])'; }
for src in "${MODELS[@]}"; do
  name=$(basename "$src" .gguf)
  f16=$OUT/$name-F16.gguf
  "$Q" quantize "$src" "$f16" F16 --allow-requantize --force 2>/dev/null || { echo "cannot convert $src"; continue; }
  qi=$OUT/$name.quern.imatrix.gguf
  li=$OUT/$name.llama.imatrix.gguf
  t0=$(date +%s.%N)
  "$Q" imatrix -m "$f16" -f "$CAL" -c 512 --chunks 40 -o "$qi" --force 2>/dev/null
  t1=$(date +%s.%N)
  "$LB/llama-imatrix" -m "$f16" -f "$CAL" -c 512 --chunks 40 -o "$li" -t "$(nproc)" >/dev/null 2>&1
  t2=$(date +%s.%N)
  cos=$(python3 - "$qi" "$li" <<'PY'
import sys, numpy as np
from gguf import GGUFReader
a = {t.name: np.array(t.data, dtype=np.float64).ravel() for t in GGUFReader(sys.argv[1]).tensors}
b = {t.name: np.array(t.data, dtype=np.float64).ravel() for t in GGUFReader(sys.argv[2]).tensors}
cs = [a[n] @ b[n] / (np.linalg.norm(a[n]) * np.linalg.norm(b[n])) for n in a if n.endswith(".in_sum2") and n in b]
print(f"{min(cs):.6f}" if cs and sorted(a) == sorted(b) else "null")
PY
)
  echo "{\"model\": \"$name\", \"imatrix_seconds_quern\": $(python3 -c "print(round($t1 - $t0, 1))"), \"imatrix_seconds_llama\": $(python3 -c "print(round($t2 - $t1, 1))"), \"min_cosine_vs_llama_imatrix\": $cos, \"ppl_f16\": $(ppl "$f16")}" | tee -a "$OUT/imatrix.jsonl"
  for t in Q2_K Q3_K_M Q4_0 Q4_K_M; do
    plain=$OUT/$name-$t.gguf
    withi=$OUT/$name-$t-imatrix.gguf
    "$Q" quantize "$f16" "$plain" $t --force 2>/dev/null
    "$Q" quantize "$f16" "$withi" $t --imatrix "$qi" --force 2>/dev/null
    "$LB/llama-quantize" --imatrix "$qi" "$f16" "$OUT/ref.gguf" $t >/dev/null 2>&1
    if cmp -s "$withi" "$OUT/ref.gguf"; then same=true; else same=false; fi
    echo "{\"model\": \"$name\", \"type\": \"$t\", \"bytes\": $(stat -c %s "$withi"), \"same_as_llama_quantize_imatrix\": $same, \"ppl\": $(ppl "$plain"), \"ppl_imatrix\": $(ppl "$withi")}" | tee -a "$OUT/imatrix.jsonl"
  done
done
