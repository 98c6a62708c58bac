#!/usr/bin/env bash
# The sanitizer job: builds quern and its CPU test suite with clang,
# AddressSanitizer and UBSan (build-san/), runs the suite under them, then
# each fuzz harness for FUZZ_SECONDS (tools/fuzz.sh). Any sanitizer report
# fails the test it happens in.
#   tools/sanitize.sh [FUZZ_SECONDS] [CTEST ARGS...]    (default 20 s a harness)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h | --help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
fuzz_secs=${1:-20}
shift || true
B=build-san
source tools/sanitize_config.sh
configure_sanitized "$B"
cmake --build "$B" -j"$(nproc)"
# Leak checking off for the suite: detached server threads and static caches
# live until exit by design. The fuzz harnesses keep it on.
(cd "$B" && ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j"$(nproc)" --timeout 1800 "$@")
bash tools/fuzz.sh "$fuzz_secs"
