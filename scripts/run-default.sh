#!/usr/bin/env bash
# The embedded default end to end: tiny DeepSeek-V3-architecture model, sample data, embedded
# server, extraction, verification. Rerunning resumes into the same output.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
WORK=${WORK:-work}
PORT=${HSX_PORT:-30000}
METRICS_PORT=${HSX_METRICS_PORT:-9400}
DUMP_DIR=${HSX_DUMP_DIR:-/dev/shm/hsextract-default}
mkdir -p "$WORK"

[[ -f $WORK/model/config.json ]] || "$BIN/hsextract" make-tiny-model "$WORK/model"
[[ -f $WORK/data.jsonl ]] || "$BIN/hsextract" make-sample-data "$WORK/data.jsonl" --num 64

if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
  echo "error: port $PORT is already in use; stop what holds it (fuser -k $PORT/tcp) or set HSX_PORT" >&2
  exit 2
fi

echo "starting the embedded server on port $PORT (log: $WORK/server.log)"
"$BIN/hsextract" serve --model "$WORK/model" --port "$PORT" --dump-dir "$DUMP_DIR" >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
stop_server() { kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true; }
trap stop_server EXIT

"$BIN/hsextract" extract --server "http://127.0.0.1:$PORT" --dataset "$WORK/data.jsonl" \
  --output "$WORK/output" --metrics-port "$METRICS_PORT" --health-timeout-s 180
"$BIN/hsextract" verify "$WORK/output"
echo
echo "output: $(cd "$WORK/output" && pwd)  (data_config.json, samples.jsonl, errors.jsonl, rows_*/data_*.ckpt)"
