#!/bin/bash
# CPU prefill and decode on real model sizes, quern and llama.cpp side by side
# on the same files, interleaved (for each model and thread count: quern, then
# llama.cpp): pp512 and tg128 with 1 and 2 threads (THREADS), achieved GB/s
# for tg beside the machine's read bandwidth (bench_read_bw).
#   bench/run_cpu_decode.sh LLAMA_BIN_DIR OUT_DIR [MODEL_DIR]
# LLAMA_BIN_DIR: llama-bench for this CPU (bench/build_llamacpp_cpu.sh; empty
# or missing: quern alone). MODEL_DIR (default /tmp/quern-cpu-models) keeps the
# synthetic llama3-1b / llama3-8b files (quern synth, Q4_K_M and Q8_0) between
# runs; the default model and Qwen2.5-Coder-0.5B come from tools/fetch-*.sh.
# Results: OUT_DIR/quern.jsonl, OUT_DIR/llama.jsonl, OUT_DIR/read_bw.txt,
# OUT_DIR/profile-*.txt (quern --cpu-profile of 16 decode steps per model);
# the table: python3 bench/summarize_cpu_decode.py OUT_DIR.
# REPS (default 3; 2 for the 8B files) and THREADS (default "1 2") override.
set -u
cd "$(dirname "$0")/.."
LB=${1:-}
OUT=$2
MD=${3:-/tmp/quern-cpu-models}
REPS=${REPS:-3}
THREADS=${THREADS:-1 2}
Q=./build/quern
mkdir -p "$OUT" "$MD"
home=${QUERN_HOME:-$HOME/.cache/quern}
bash tools/fetch-model.sh >/dev/null && bash tools/fetch-tool-model.sh >/dev/null || { echo "model fetch failed"; exit 1; }
models="$home/models/SmolLM2-135M-Instruct.Q4_1.gguf $home/models/qwen2.5-coder-0.5b-instruct.gguf"
for m in llama3-1b llama3-8b; do
  for q in Q4_K_M Q8_0; do
    f=$MD/$m-$q.gguf
    [ -f "$f" ] || $Q synth $m --quant $q -o "$f" >/dev/null || { echo "synth $m $q failed"; exit 1; }
    models="$models $f"
  done
done
grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs | tee "$OUT/cpu.txt"
./build/bench/bench_read_bw --threads 1,2 --reps 5 | tee "$OUT/read_bw.txt"
tag() { python3 -c 'import json,sys; [print(json.dumps({**r, "file": sys.argv[1], "engine": sys.argv[2]})) for r in json.load(sys.stdin)]' "$1" "$2"; }
for f in $models; do
  name=$(basename "$f" .gguf)
  r=$REPS
  case $name in *8b*) r=${REPS8:-2} ;; esac
  for t in $THREADS; do
    echo "== $name t$t"
    $Q bench -m "$f" -p 512 -n 128 -r "$r" -t "$t" --json 2>>"$OUT/quern-stderr.log" | tag "$name" quern |
      tee -a "$OUT/quern.jsonl"
    if [ -x "$LB/llama-bench" ]; then
      "$LB/llama-bench" -m "$f" -p 512 -n 128 -r "$r" -t "$t" -o jsonl 2>>"$OUT/llama-stderr.log" |
        python3 -c 'import json,sys; [print(json.dumps({**json.loads(l), "file": sys.argv[1], "engine": "llama.cpp"})) for l in sys.stdin if l.strip()]' "$name" |
        tee -a "$OUT/llama.jsonl"
    fi
  done
  $Q bench -m "$f" -p 0 -n 16 -r 1 -t 1 --cpu-profile >/dev/null 2>"$OUT/profile-$name.txt"
done
