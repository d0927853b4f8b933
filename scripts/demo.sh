#!/usr/bin/env bash
# The whole system on this machine: throwaway Postgres, local SQS server, workers, sample
# workflows, a SIGKILL mid-run, a live progress view and a summary. Args go to `phasegate demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The demo needs no browser and no node: only the test command installs Chromium (the
# console tests) and npm (the chart README check).
PHASEGATE_DEMO_ONLY=1 bash scripts/bootstrap.sh
exec .venv/bin/phasegate demo "$@"
