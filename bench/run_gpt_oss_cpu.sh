#!/usr/bin/env bash
# gpt-oss on the CPU: prefill (pp64) and decode (tg32) of synthetic
# gpt-oss-20b in llama.cpp's MXFP4_MOE layout (experts MXFP4, the rest Q8_0),
# written once as a GGUF file (11.5 GiB) so that llama.cpp's llama-bench runs
# the same file when LLAMA_BENCH=/path/to/llama-bench is set. Short tests:
# on a few cores one decode step reads the 3.6B active parameters (~2 GB).
#
#   bash bench/run_gpt_oss_cpu.sh [OUTDIR]    (default /tmp/quern-bench-out; record with
#   bench/append_results.py gpt-oss-cpu OUTDIR/gpt-oss-cpu-DATE.json --commit ... --machine ...)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/quern-bench-out}
REPS=${REPS:-3}
THREADS=${THREADS:-$(nproc)}
FILE=${GPT_OSS_GGUF:-/tmp/quern-bench/gpt-oss-20b-MXFP4_MOE.gguf}
mkdir -p "$OUT" "$(dirname "$FILE")"
[ -f "$FILE" ] || ./build/quern synth gpt-oss-20b --quant MXFP4_MOE -o "$FILE"
stamp=$(date -u +%Y%m%d)
host="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
{
  echo "{\"date\": \"$(date -u +%FT%TZ)\", \"host\": \"$host\", \"threads\": $THREADS, \"runs\": ["
  ./build/quern bench -m "$FILE" -p 64 -n 32 -r "$REPS" -t "$THREADS" --json
  if [ -n "${LLAMA_BENCH:-}" ]; then
    echo ","
    echo "{\"llama_bench\": $("$LLAMA_BENCH" -m "$FILE" -p 64 -n 32 -r "$REPS" -t "$THREADS" -o json)}"
  fi
  echo "]}"
} > "$OUT/gpt-oss-cpu-$stamp.json"
echo "wrote $OUT/gpt-oss-cpu-$stamp.json"
