#!/usr/bin/env bash
# The whole system on this machine: throwaway Postgres, local SQS server, workers, sample
# workflows, a SIGKILL mid-run, a live progress view and a summary. Args go to `phasegate demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The demo needs no browser: only the test command installs Chromium (the console tests).
PHASEGATE_SKIP_BROWSER=1 bash scripts/bootstrap.sh
exec .venv/bin/phasegate demo "$@"
