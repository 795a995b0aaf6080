#!/usr/bin/env bash
# The embedded default end to end: tiny DeepSeek-V3-architecture model (with its tokenizer and a Kimi-K2-shaped
# chat template), sample conversations, prepare (SpecForge's rows), embedded server, extraction, verification.
# Rerunning resumes into the same output (prepare and extract skip what is done).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
WORK=${WORK:-work}
PORT=${HSX_PORT:-30000}
METRICS_PORT=${HSX_METRICS_PORT:-9400}
DUMP_DIR=${HSX_DUMP_DIR:-/dev/shm/hsextract-default}
mkdir -p "$WORK"

# Both ports before any work (hsextract serve and extract check them again, exit 2 naming the setting)
for port_setting in "$PORT HSX_PORT" "$METRICS_PORT HSX_METRICS_PORT"; do
  read -r port setting <<<"$port_setting"
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "error: port $port is already in use; stop what holds it (fuser $port/tcp shows it) or set $setting" >&2
    exit 2
  fi
done

[[ -f $WORK/model/config.json ]] || "$BIN/hsextract" make-tiny-model "$WORK/model"
[[ -f $WORK/conversations.jsonl ]] || "$BIN/hsextract" make-sample-data "$WORK/conversations.jsonl" --num 64 --conversations sharegpt

echo "== prepare: conversations -> SpecForge 0.2.0's rows (input_ids, loss_mask) =="
"$BIN/hsextract" prepare --model "$WORK/model" --dataset "$WORK/conversations.jsonl" --output "$WORK/prepared" \
  --like specforge --specforge-template kimi-k2-instruct


echo "starting the embedded server on port $PORT (log: $WORK/server.log)"
"$BIN/hsextract" serve --model "$WORK/model" --port "$PORT" --dump-dir "$DUMP_DIR" >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
stop_server() { kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true; }
trap stop_server EXIT

echo "== extract: the prepared rows -> hidden states =="
"$BIN/hsextract" extract --server "http://127.0.0.1:$PORT" --dataset "$WORK/prepared" \
  --output "$WORK/output" --metrics-port "$METRICS_PORT" --health-timeout-s 180
"$BIN/hsextract" verify "$WORK/output"
echo
echo "output: $(cd "$WORK/output" && pwd)  (data_config.json, samples.jsonl, errors.jsonl, rows_*/data_*.ckpt)"
