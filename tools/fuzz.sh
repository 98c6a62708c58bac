#!/usr/bin/env bash
# Runs the libFuzzer harnesses of tests/fuzz (GGUF, safetensors + Hugging Face
# folders, Jinja templates, tokenizers, API request parsers), each for
# SECONDS, built with clang, AddressSanitizer and UBSan in build-san/ (the
# build tools/sanitize.sh tests). Corpora start from tools/fuzz_seeds.py and
# grow in build-san/corpus/NAME between runs; a crash, a sanitizer report, a
# 10 s hang or 2 GiB of memory fails the run and leaves its input in
# build-san/crashes/. A short summary per harness (runs, executions, corpus)
# goes to stdout. QUERN_FUZZ_RUNS=N also stops each harness after N
# executions (the recorded long runs of bench/fuzz.md use it).
#   tools/fuzz.sh [SECONDS] [NAME...]     (default: 60 s each, every harness)
# Examples:
#   tools/fuzz.sh 20                      CI's bounded run
#   QUERN_FUZZ_JOBS=2 tools/fuzz.sh 3600 jinja
#   QUERN_FUZZ_RUNS=10000000 tools/fuzz.sh 86400 gguf
#   build-san/fuzz_gguf build-san/crashes/gguf-crash-...   replays one input
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
secs=${1:-60}
shift || true
names=("$@")
((${#names[@]})) || names=(gguf safetensors jinja tokenizer requests)
B=build-san
source tools/sanitize_config.sh
configure_sanitized "$B"
cmake --build "$B" -j"$(nproc)" --target "${names[@]/#/fuzz_}"
python3 tools/fuzz_seeds.py "$B/seeds"
mkdir -p "$B/crashes"
jobs=${QUERN_FUZZ_JOBS:-1}
par=()
# Parallel jobs write their logs to fuzz-N.log in the working folder.
((jobs > 1)) && par=(-fork="$jobs" -ignore_crashes=0)
[[ -n "${QUERN_FUZZ_RUNS:-}" ]] && par+=(-runs="$QUERN_FUZZ_RUNS")
status=0
for n in "${names[@]}"; do
  mkdir -p "$B/corpus/$n"
  log="$B/fuzz-$n.log"
  start=$SECONDS
  if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "$B/fuzz_$n" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
      -max_len=262144 -print_final_stats=1 "${par[@]}" \
      -artifact_prefix="$B/crashes/$n-" "$B/corpus/$n" "$B/seeds/$n" >"$log" 2>&1; then
    echo "fuzz $n: FAILED (log: $log)"
    grep -E "ERROR|SUMMARY|Test unit written|==[0-9]+==" "$log" | head -5
    status=1
  fi
  # One process prints "#N<TAB>NEW ..." lines and its final stats; -fork's
  # parent prints "#N: cov: ..." totals (its jobs' stats go to their own logs).
  execs=$(awk '/stat::number_of_executed_units/ {s += $2} /^#[0-9]+.*(DONE|pulse|NEW|REDUCE)/ || /^#[0-9]+: cov:/ {n = substr($1, 2) + 0} END {print (s ? s : n)}' "$log")
  echo "fuzz $n: $((SECONDS - start)) s, $execs executions, corpus $(ls "$B/corpus/$n" | wc -l) files"
done
exit $status
