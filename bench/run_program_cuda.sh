#!/bin/bash
# The GPU path of the layer program on a GPU machine, from prebuilt binaries:
# the GPU test suites, --verify on the default model and on every synthetic
# preset (tiny, Q4_K_M and Q8_0), and the speed of two builds side by side on
# the same synthetic files (the before/after table of bench/program-cuda-h200.md).
#   bench/run_program_cuda.sh BIN_DIR OUT_DIR [what...]
# BIN_DIR holds quern, quern_old (the build to compare with; bench only),
# test_session_cuda, test_batch_cuda, test_hf_golden_cuda and lib/
# (bench/pack_cuda.sh). `what`: tests verify synth bench (default: all;
# bench runs one round, the builds in the order ORDER gives — default
# "quern_old quern" — over the files synth left in /tmp). The
# default model is read from $QUERN_HOME; test fixtures from the tree the
# test binaries were built in (link it to this checkout). Logs go to OUT_DIR;
# bench/append_results.py program-before-after OUT/bench.log --commit ... appends them
# to bench/results/program-before-after.jsonl.
set -u
BIN=$1
OUT=$2
shift 2
WHAT=${*:-tests verify synth bench}
lt=$(find /usr/local /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$BIN/lib${lt:+:${lt%/*}}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"

if has tests; then
  for t in ${TESTS:-test_session_cuda test_batch_cuda test_hf_golden_cuda}; do
    "$BIN/$t" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$OUT/$t.log" 2>&1
    echo "$t exit $?"
    grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure|worst|verify" "$OUT/$t.log" | head -40
  done
fi

if has verify; then
  {
    for p in "The capital of France is" \
      "In 1969, Neil Armstrong became the first person to walk on the Moon. The mission, Apollo 11, launched from Florida and"; do
      for dev in cpu cuda; do
        echo "== default model, $dev: $p"
        "$BIN/quern" run --device $dev $([ $dev = cuda ] && echo --verify) -p "$p" -n 32 --temp 0 2>&1
        echo
      done
    done
    for preset in $("$BIN/quern" synth --list 2>/dev/null | awk 'NF {print $1}'); do
      for q in Q4_K_M Q8_0; do
        f=/tmp/tiny-$preset-$q.gguf
        "$BIN/quern" synth "$preset" --tiny --quant $q -o "$f" >/dev/null 2>&1 || { echo "synth $preset $q failed"; continue; }
        echo "== $preset tiny $q: $("$BIN/quern" run -m "$f" --device cuda --verify -p "Hello there, how" -n 16 --temp 0 2>&1 | grep -E 'verify|VERIFY|error')"
      done
    done
  } >"$OUT/verify.log" 2>&1
  grep -E "^==|verify|VERIFY|error" "$OUT/verify.log"
fi

if has synth; then
  for q in Q4_K_M Q8_0; do "$BIN/quern" synth llama3-8b --quant $q -o /tmp/l8-$q.gguf >/dev/null 2>&1; done
  "$BIN/quern" synth qwen3-30b-a3b --quant Q4_K_M -o /tmp/moe-Q4_K_M.gguf >/dev/null 2>&1
  ls -la /tmp/*.gguf
fi

if has bench; then
  order=${ORDER:-quern_old quern}
  run() {  # LABEL ARGS...: both builds, in $order; one JSON line per result
    local label=$1
    shift
    for b in $order; do
      "$BIN/$b" bench --device cuda "$@" --json 2>>"$OUT/bench.err" |
        python3 -c "
import json, sys
for x in json.load(sys.stdin):
    x.update(build=sys.argv[1], label=sys.argv[2]); print(json.dumps(x))
    what = x.get('test') or 'batch%s' % x.get('parallel')
    rate = x.get('median_ts') or x.get('decode_tps_median', 0)
    print(sys.argv[1], sys.argv[2], what, 'd%s' % x.get('n_depth', 0), round(rate, 1), file=sys.stderr)" \
          "$b" "$label" >>"$OUT/bench.log" 2>>"$OUT/bench.txt"
    done
  }
  for q in Q4_K_M Q8_0; do
    run l8-$q-tg -m /tmp/l8-$q.gguf -p 0 -n 128 -d 0,4096 -r 3
    run l8-$q-pp -m /tmp/l8-$q.gguf -p 512,2048 -n 0 -r 3
  done
  run l8-Q4_K_M-batch -m /tmp/l8-Q4_K_M.gguf --batch 1,8,32,64,128 -p 128 -n 128 -r 3
  run moe-Q4_K_M -m /tmp/moe-Q4_K_M.gguf -p 512 -n 128 -r 3
  cat "$OUT/bench.txt"
fi
