#!/bin/bash
# Qwen3.5 on one GPU, quern and llama.cpp on the same GGUF files (written by
# `quern synth`: the qwen3.5-27b dense and qwen3.5-35b-a3b MoE shapes,
# Q4_K_M): prefill pp512 and pp8192, decode tg128 at depth 0, 4096 and
# 32768 (3 repetitions, 2 at 32768), and batched decode of 1, 32 and 128 sequences (128-token prompts,
# 128 generated tokens: quern bench --batch; llama-batched-bench -npl).
#   bench/run_qwen35_cuda.sh QUERN_BIN_DIR LLAMA_BIN_DIR OUT_DIR [WORK_DIR] [PRESETS]
# PP=512 DEEP= (environment) narrow the prefill sizes and drop the 32768-deep
# decode, for a call with little device time left.
# QUERN_BIN_DIR holds quern and lib/ (bench/pack_cuda.sh); LLAMA_BIN_DIR holds
# llama-bench and llama-batched-bench (bench/build_llamacpp_cuda.sh). Either
# may be missing: its runs are skipped (the GGUF files in WORK_DIR are kept,
# so the two engines can run one after the other on the same machine).
# Results: OUT_DIR/quern.jsonl, OUT_DIR/llama.jsonl, OUT_DIR/llama-batched.txt,
# OUT_DIR/quern-profile-PRESET.txt (quern's decode step per op kind).
set -u
BIN=$1
LB=$2
OUT=$3
WORK=${4:-/tmp/quern-q35}
PRESETS=${5:-qwen3.5-27b qwen3.5-35b-a3b}
PP=${PP:-512,8192}
DEEP=${DEEP-32768}
export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT" "$WORK"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
rows() { python3 -c 'import json,sys; [print(json.dumps({**r, "file": sys.argv[1]})) for r in json.load(sys.stdin)]' "$1"; }
for p in $PRESETS; do
  f=$WORK/$p-Q4_K_M.gguf
  [ -f "$f" ] || "$BIN/quern" synth "$p" --quant Q4_K_M -o "$f" >/dev/null 2>&1 || { echo "synth $p failed"; continue; }
  echo "== $p"
  if [ -x "$BIN/quern" ]; then
  "$BIN/quern" bench -m "$f" --device cuda -p "$PP" -n 0 -r 3 --json 2>"$OUT/quern-stderr.log" | rows "$p" |
    tee -a "$OUT/quern.jsonl"
  "$BIN/quern" bench -m "$f" --device cuda -p 0 -n 128 -d 0,4096 -r 3 --json 2>>"$OUT/quern-stderr.log" |
    rows "$p" | tee -a "$OUT/quern.jsonl"
  [ -z "$DEEP" ] || "$BIN/quern" bench -m "$f" --device cuda -p 0 -n 128 -d "$DEEP" -r 2 --json \
    2>>"$OUT/quern-stderr.log" | rows "$p" | tee -a "$OUT/quern.jsonl"
  "$BIN/quern" bench -m "$f" --device cuda --batch 1,32,128 -p 128 -n 128 -r 1 --json 2>>"$OUT/quern-stderr.log" |
    rows "$p" | tee -a "$OUT/quern.jsonl"
  # Time per op kind of the decode step (the DeltaNet's conv + state update
  # + readout is "delta_rule"): the recurrent step's bandwidth.
  "$BIN/quern" bench -m "$f" --device cuda -p 0 -n 64 -r 1 --cuda-profile >"$OUT/quern-profile-$p.txt" 2>&1
  fi
  if [ -x "$LB/llama-bench" ]; then
    "$LB/llama-bench" -m "$f" -ngl 99 -p "$PP" -n 0 -r 3 -o jsonl 2>>"$OUT/llama-stderr.log" | tee -a "$OUT/llama.jsonl"
    "$LB/llama-bench" -m "$f" -ngl 99 -p 0 -n 128 -d 0,4096 -r 3 -o jsonl 2>>"$OUT/llama-stderr.log" |
      tee -a "$OUT/llama.jsonl"
    [ -z "$DEEP" ] || "$LB/llama-bench" -m "$f" -ngl 99 -p 0 -n 128 -d "$DEEP" -r 2 -o jsonl \
      2>>"$OUT/llama-stderr.log" | tee -a "$OUT/llama.jsonl"
  fi
  if [ -x "$LB/llama-batched-bench" ]; then
    echo "== $p" >>"$OUT/llama-batched.txt"
    "$LB/llama-batched-bench" -m "$f" -ngl 99 -c 40000 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,32,128 \
      2>>"$OUT/llama-stderr.log" | tee -a "$OUT/llama-batched.txt"
  fi
done
