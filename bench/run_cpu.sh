#!/usr/bin/env bash
# CPU benchmarks of issue "quern runs a real GGUF model end to end on the CPU":
# pp512 / tg128 for the default model and for synthetic SmolLM2-135M-shaped
# models in Q4_K_M and Q8_0 (written as GGUF files so that other engines can be
# measured on the same files). With LLAMA_BENCH=/path/to/llama-bench set, the
# same files are also run through llama.cpp's llama-bench.
#
#   bash bench/run_cpu.sh [OUTDIR]     (default /tmp/quern-bench-out; record the run with
#   bench/append_results.py cpu OUTDIR/cpu-DATE.json --commit ... --machine ...)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/quern-bench-out}
REPS=${REPS:-5}
THREADS=${THREADS:-$(nproc)}
mkdir -p "$OUT" /tmp/quern-bench
Q=./build/quern
for quant in Q4_K_M Q8_0; do
  f=/tmp/quern-bench/smollm2-135m-$quant.gguf
  [ -f "$f" ] || $Q synth smollm2-135m --quant "$quant" -o "$f"
done
stamp=$(date -u +%Y%m%d)
host="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
{
  echo "{\"date\": \"$(date -u +%FT%TZ)\", \"host\": \"$host\", \"threads\": $THREADS, \"runs\": ["
  first=1
  for m in "" /tmp/quern-bench/smollm2-135m-Q4_K_M.gguf /tmp/quern-bench/smollm2-135m-Q8_0.gguf; do
    for act in "" "--fast-act"; do
      [ $first = 1 ] || echo ","
      first=0
      $Q bench ${m:+-m "$m"} -p 512 -n 128 -r "$REPS" -t "$THREADS" $act --json
    done
  done
  if [ -n "${LLAMA_BENCH:-}" ]; then
    for m in "$(bash -c 'echo ${QUERN_HOME:-$HOME/.cache/quern}')/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
             /tmp/quern-bench/smollm2-135m-Q4_K_M.gguf /tmp/quern-bench/smollm2-135m-Q8_0.gguf; do
      echo ","
      echo "{\"llama_bench\": $("$LLAMA_BENCH" -m "$m" -p 512 -n 128 -r "$REPS" -t "$THREADS" -o json)}"
    done
  fi
  echo "]}"
} > "$OUT/cpu-$stamp.json"
echo "wrote $OUT/cpu-$stamp.json" >&2
