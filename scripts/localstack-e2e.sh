#!/usr/bin/env bash
# Run the engine's end-to-end test once against LocalStack (in addition to moto).
#
# LocalStack runs without Docker from its own cached venv (.phasegate/localstack-venv, see
# localstack/run-without-docker.sh) on a free port with a throwaway FILESYSTEM_ROOT, and is
# stopped on exit whatever happens. The test suite talks to it through
# PHASEGATE_TEST_SQS_ENDPOINT_URL instead of starting moto.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TEST="tests/integration/test_engine_e2e.py"
PYTHON="${PHASEGATE_PYTHON:-$ROOT/.venv/bin/python}"
READY_DEADLINE_S="${PHASEGATE_LOCALSTACK_READY_DEADLINE_S:-120}"

if [[ ! -f "$TEST" ]]; then
  echo "localstack-e2e: $TEST is missing; there is no end-to-end test to run" >&2
  exit 1
fi
if [[ ! -x "$PYTHON" ]]; then
  echo "localstack-e2e: $PYTHON not found; create the project venv first" >&2
  exit 1
fi

# Install (or reuse) LocalStack's venv before the clock for readiness starts.
localstack/run-without-docker.sh --install-only

PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
STATE="$(mktemp -d "${TMPDIR:-/tmp}/phasegate-localstack.XXXXXX")"
LOG="$STATE/localstack.log"
LS_PID=""

stop_localstack() {
  local status=$?
  if [[ -n "$LS_PID" ]] && kill -0 "$LS_PID" 2>/dev/null; then
    kill -TERM "$LS_PID" 2>/dev/null || true
    # Bounded wait for a clean stop, then force it.
    for _ in $(seq 1 100); do
      kill -0 "$LS_PID" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$LS_PID" 2>/dev/null || true
    wait "$LS_PID" 2>/dev/null || true
  fi
  if [[ $status -ne 0 && -f "$LOG" ]]; then
    echo "localstack-e2e: last lines of the LocalStack log:" >&2
    tail -n 40 "$LOG" >&2 || true
  fi
  rm -rf "$STATE"
  exit $status
}
trap stop_localstack EXIT INT TERM

echo "localstack-e2e: starting LocalStack on 127.0.0.1:$PORT"
PHASEGATE_LOCALSTACK_PORT="$PORT" PHASEGATE_LOCALSTACK_STATE="$STATE/fs" \
  localstack/run-without-docker.sh >"$LOG" 2>&1 &
LS_PID=$!

ENDPOINT="http://127.0.0.1:$PORT"
"$PYTHON" - "$ENDPOINT" "$READY_DEADLINE_S" "$LS_PID" <<'PY'
"""Poll LocalStack's health endpoint until SQS is up, within a deadline."""
import json
import os
import sys
import time
import urllib.request

endpoint, deadline_s, pid = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + deadline_s
last = "no answer yet"
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("localstack-e2e: LocalStack exited before it was ready")
    try:
        with urllib.request.urlopen(f"{endpoint}/_localstack/health", timeout=2) as resp:
            services = json.load(resp).get("services", {})
        last = f"sqs={services.get('sqs')}"
        if services.get("sqs") in ("running", "available"):
            print(f"localstack-e2e: LocalStack ready ({last})")
            sys.exit(0)
    except OSError as exc:
        last = str(exc)
    time.sleep(0.25)
sys.exit(f"localstack-e2e: LocalStack not ready after {deadline_s:.0f}s ({last})")
PY

export PHASEGATE_TEST_SQS_ENDPOINT_URL="$ENDPOINT"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}"
"$PYTHON" -m pytest "$TEST" -q -p no:cacheprovider
