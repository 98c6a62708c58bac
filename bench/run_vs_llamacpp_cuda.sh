#!/bin/bash
# Decode side by side on one GPU: quern and llama.cpp's llama-bench on the
# same GGUF files, written by `quern synth` (synthetic Llama-3-8B shapes).
#   bench/run_vs_llamacpp_cuda.sh QUERN_BIN_DIR LLAMA_BENCH OUT_DIR [WORK_DIR] [QUANTS]
# QUERN_BIN_DIR holds quern and lib/ (libfmt, libpcre2-8, libcudart);
# LLAMA_BENCH is llama-bench or a wrapper that sets its library path.
# Per quant: tg128 from an empty context with quern default (two-level
# activations), quern --fast-act and llama-bench, 5 repetitions; tg128 after
# 4,096 tokens of context (-d 4096) with quern default and llama-bench, 3
# repetitions (quern fills the context token by token: no batched prefill yet).
# Results: OUT_DIR/quern.jsonl and OUT_DIR/llama.jsonl, one JSON record per line.
set -u
BIN=$1
LB=$2
OUT=$3
WORK=${4:-/tmp/quern-vs}
QUANTS=${5:-Q4_K_M Q8_0}
export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT" "$WORK"
for q in $QUANTS; do
  f=$WORK/llama3-8b-$q.gguf
  [ -f "$f" ] || "$BIN/quern" synth llama3-8b --quant "$q" -o "$f" || exit 1
  for d in 0 4096; do
    r=5
    acts=("" --fast-act)
    if [ $d -gt 0 ]; then r=3; acts=(""); fi
    for act in "${acts[@]}"; do
      "$BIN/quern" bench -m "$f" --device cuda -p 0 -n 128 -r $r -d $d $act --json 2>/dev/null |
        python3 -c 'import json,sys; [print(json.dumps(r)) for r in json.load(sys.stdin)]' | tee -a "$OUT/quern.jsonl"
    done
    "$LB" -m "$f" -p 0 -n 128 -r $r -d $d -o jsonl 2>>"$OUT/llama-stderr.log" | tee -a "$OUT/llama.jsonl"
  done
done
