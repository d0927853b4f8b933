#!/usr/bin/env bash
# Run LocalStack (SQS only) without Docker, in a venv of its own.
#
#   localstack/run-without-docker.sh            # foreground on 127.0.0.1:4566
#   PHASEGATE_LOCALSTACK_PORT=4599 localstack/run-without-docker.sh
#   localstack/run-without-docker.sh --install-only
#
# What works on Python 3.11 (newer LocalStack releases fail to import there):
# localstack-core[runtime]==4.13.1 with cbor2<6, pyopenssl<26, cryptography>=45.0.7,<47 and
# service-identity. The venv is cached in .phasegate/localstack-venv; the state directory
# (FILESYSTEM_ROOT) is per port, so two instances never share files.
#
# When LocalStack is ready, the same init hook the compose stack uses
# (localstack/init/ready.d/10-create-queues.py) creates the FIFO queue pair.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PHASEGATE_LOCALSTACK_PYTHON:-python3.11}"
VENV="${PHASEGATE_LOCALSTACK_VENV:-$ROOT/.phasegate/localstack-venv}"
PORT="${PHASEGATE_LOCALSTACK_PORT:-4566}"
STATE="${PHASEGATE_LOCALSTACK_STATE:-$ROOT/.phasegate/localstack-state-$PORT}"
STAMP="$VENV/.phasegate-pins"
PINS=(
  "localstack-core[runtime]==4.13.1"
  "cbor2<6"
  "pyopenssl<26"
  "cryptography>=45.0.7,<47"
  "service-identity"
)

install_venv() {
  # Reuse the venv only when it was completed with exactly these pins.
  if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "${PINS[*]}" ]]; then
    return 0
  fi
  echo "localstack: creating $VENV (takes a few minutes the first time)" >&2
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}" \
      >"$VENV/.install.log" 2>&1; then
    cat "$VENV/.install.log" >&2
    echo "localstack: pip install failed (log above)" >&2
    exit 1
  fi
  printf '%s' "${PINS[*]}" >"$STAMP"
}

install_venv
if [[ "${1:-}" == "--install-only" ]]; then
  exit 0
fi

mkdir -p "$STATE/etc/localstack/init"
# In host mode LocalStack reads its init hooks from $FILESYSTEM_ROOT/etc/localstack/init.
ln -sfn "$ROOT/localstack/init/ready.d" "$STATE/etc/localstack/init/ready.d"
export OVERRIDE_IN_DOCKER=0          # the host may carry a /.dockerenv; we are not in Docker
export FILESYSTEM_ROOT="$STATE"
export SERVICES=sqs
export EAGER_SERVICE_LOADING=1
export GATEWAY_LISTEN="127.0.0.1:$PORT"
export LOCALSTACK_HOST="127.0.0.1:$PORT"
export SQS_ENDPOINT_STRATEGY=path
export SKIP_SSL_CERT_DOWNLOAD=1
export DISABLE_EVENTS=1
export DNS_ADDRESS=0               # no DNS server (it would try to bind port 53)
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}"
export PHASEGATE_LOCALSTACK_ENDPOINT="http://127.0.0.1:$PORT"
exec "$VENV/bin/python" -m localstack.runtime.main
