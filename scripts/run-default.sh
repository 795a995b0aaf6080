#!/usr/bin/env bash
# The embedded default end to end: tiny DeepSeek-V3-architecture model (with its tokenizer and a Kimi-K2-shaped
# chat template), sample conversations, prepare (SpecForge's rows), embedded server, extraction, verification.
# Rerunning resumes into the same output (prepare and extract skip what is done).
# DATASET (conversations; made when absent), PREPARED and OUTPUT choose the paths (`make extract OUTPUT=...`).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
WORK=${WORK:-work}
DATASET=${DATASET:-$WORK/conversations.jsonl}
PREPARED=${PREPARED:-$WORK/prepared}
OUTPUT=${OUTPUT:-$WORK/output}
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
if [[ ! -e $DATASET && $DATASET == "$WORK/conversations.jsonl" ]]; then
  "$BIN/hsextract" make-sample-data "$DATASET" --num 64 --conversations sharegpt
fi

echo "== prepare: conversations -> SpecForge 0.2.0's rows (input_ids, loss_mask) =="
"$BIN/hsextract" prepare --model "$WORK/model" --dataset "$DATASET" --output "$PREPARED" \
  --like specforge --specforge-template kimi-k2-instruct


scripts/rotate-log.sh "$WORK/server.log" 3  # the last runs' logs stay: server.log.1 is the run before
echo "starting the embedded server on port $PORT (log: $WORK/server.log)"
"$BIN/hsextract" serve --model "$WORK/model" --port "$PORT" --dump-dir "$DUMP_DIR" >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
stop_server() { kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true; }
trap stop_server EXIT

echo "== extract: the prepared rows -> hidden states =="
"$BIN/hsextract" extract --server "http://127.0.0.1:$PORT" --dataset "$PREPARED" \
  --output "$OUTPUT" --metrics-port "$METRICS_PORT" --health-timeout-s 180
"$BIN/hsextract" verify "$OUTPUT"
echo
echo "output: $(cd "$OUTPUT" && pwd)  (data_config.json, samples.jsonl, errors.jsonl, rows_*/data_*.ckpt)"
