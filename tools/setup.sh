#!/usr/bin/env bash
# One command from a fresh machine to generated text: installs dependencies,
# builds, fetches the default model (once) and runs it on a prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
bash tools/build.sh
bash tools/fetch-model.sh
./build/quern run -p "${1:-The capital of France is}" -n "${2:-64}" --temp 0
