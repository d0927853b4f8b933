#!/usr/bin/env bash
# The whole test suite: lint, types, unit + integration tests against real PostgreSQL and a
# real SQS server over HTTP (moto), chart/manifest tests, and the engine's end-to-end test
# once more against LocalStack. Starts every service it needs. Args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh

echo "== ruff"
.venv/bin/ruff check worker orchestrator tests bench
echo "== mypy (strict)"
.venv/bin/mypy worker orchestrator
echo "== pytest"
# Exit status 5 (no tests collected) fails this script like any other failure.
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
if [ -f scripts/localstack-e2e.sh ] && [ -z "${PHASEGATE_SKIP_LOCALSTACK:-}" ] && [ $# -eq 0 ]; then
  echo "== engine end-to-end against LocalStack"
  bash scripts/localstack-e2e.sh
fi
