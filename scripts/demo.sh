#!/usr/bin/env bash
# `make demo`: the platform on this machine, a 2-shard table, a DLRM-style model
# trained against it, a checkpoint, then a clean shutdown.
# DEMO_STEPS=N changes the training length; DEMO_KEEP=1 leaves the platform up
# (dashboard and metrics) until Ctrl-C; DEMO_STATE=DIR puts its state there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RECSTORE=("$PY" -m recstore)
STATE=${DEMO_STATE:-$(mktemp -d -t recstore-demo-XXXXXX)}
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"
export RECSTORE_ADMIN_URL=$URL
ARGS=(--state-dir "$STATE")

echo "==> recstore up (state in $STATE)"
"${RECSTORE[@]}" up --state-dir "$STATE" --port "$PORT" >"$STATE/up.log" 2>&1 &
UP_PID=$!
stop() {
  if kill -0 "$UP_PID" 2>/dev/null; then
    echo "==> stopping the platform (nodes write a final checkpoint)"
    kill -INT "$UP_PID"
    wait "$UP_PID" || true
  fi
}
trap stop EXIT
"$PY" - "$URL" <<'PYEOF'
import sys, time, urllib.request
deadline = time.monotonic() + 60
while True:
    try:
        urllib.request.urlopen(sys.argv[1] + "/readyz", timeout=1)
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("the platform did not start; see up.log")
        time.sleep(0.2)
PYEOF
cat "$STATE/up.log"

echo "==> recstore apply -f examples/tables/demo-clicks.yaml"
"${RECSTORE[@]}" apply -f examples/tables/demo-clicks.yaml "${ARGS[@]}"
"${RECSTORE[@]}" wait demo-clicks --for Ready --timeout 120 "${ARGS[@]}"
"${RECSTORE[@]}" get table demo-clicks "${ARGS[@]}"

echo "==> training the DLRM-style example against the table"
"$PY" examples/platform_demo.py --admin-url "$URL" --token-file "$STATE/admin-token" \
  --ps-token-file "$STATE/ps-token" \
  --steps "${DEMO_STEPS:-300}"

echo "==> recstore checkpoint demo-clicks"
"${RECSTORE[@]}" checkpoint demo-clicks "${ARGS[@]}"
"${RECSTORE[@]}" get tables "${ARGS[@]}"

TOKEN_FILE="$STATE/admin-token"
METRICS=$("$PY" - "$URL" "$TOKEN_FILE" <<'PYEOF'
import json, sys, urllib.request
token = open(sys.argv[2]).read().strip()
req = urllib.request.Request(sys.argv[1] + "/api/v1/nodes?table=demo-clicks",
                             headers={"Authorization": f"Bearer {token}"})
nodes = json.load(urllib.request.urlopen(req))["items"]
print(" ".join(f"http://{n['metrics_endpoint']}/metrics" for n in nodes))
PYEOF
)
echo
echo "Where to look:"
echo "  dashboard     $URL/   (log in with the token in $TOKEN_FILE)"
echo "  admin API     $URL/docs"
echo "  node metrics  $METRICS"
echo "  state         $STATE (catalogue, checkpoints, node logs)"
if [[ "${DEMO_KEEP:-0}" == "1" ]]; then
  echo "The platform keeps running; Ctrl-C stops it."
  wait "$UP_PID" || true
fi
