#!/usr/bin/env bash
# Runs the whole test suite: installs dependencies, builds, fetches the default
# model (the model tests need it) and runs every test through CTest; then the
# sanitizer job (tools/sanitize.sh: the CPU suite built with clang under
# AddressSanitizer + UBSan, and each fuzz harness for 20 s). QUERN_NO_SANITIZE=1
# skips that job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
bash tools/build.sh
bash tools/fetch-model.sh
bash tools/fetch-tool-model.sh  # the tool-call end-to-end test's model
(cd build && ctest --output-on-failure -j"$(nproc)" "$@")
[ "${QUERN_NO_SANITIZE:-0}" = 1 ] || bash tools/sanitize.sh 20
