#!/bin/bash
# Serving benchmark on the CPU: starts `quern serve` on a free loopback port,
# runs bench/loadgen.py against it at several concurrency levels, stops it.
#   bench/run_serve_cpu.sh [OUT.json] [-- extra quern serve options]
# Environment: QUERN (default ./build/quern), CONCURRENCY (default 1,4,16,64),
# MAX_TOKENS (default 64), REQUESTS (per level; default max(8, 2 x concurrency)).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
QUERN=${QUERN:-./build/quern}
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
LOG=$(mktemp)
"$QUERN" serve --port "$PORT" --parallel 64 -c 512 -q "$@" >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 $PID 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.2
done
python3 bench/loadgen.py --base-url "http://127.0.0.1:$PORT/v1" --concurrency "${CONCURRENCY:-1,4,16,64}" \
  --max-tokens "${MAX_TOKENS:-64}" ${REQUESTS:+--requests $REQUESTS} ${OUT:+--json "$OUT"}
