#!/usr/bin/env bash
# Runs the whole test suite: installs dependencies, builds, fetches the default
# model (the model tests need it) and runs every test through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
bash tools/build.sh
bash tools/fetch-model.sh
bash tools/fetch-tool-model.sh  # the tool-call end-to-end test's model
cd build && ctest --output-on-failure -j"$(nproc)" "$@"
