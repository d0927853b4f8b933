#!/usr/bin/env bash
# The whole test suite: lint, types, the documentation site, unit + integration tests against
# real PostgreSQL and a real SQS server over HTTP (moto), chart/manifest tests, the image built
# and run as the chart runs it (scripts/image-test.sh), and the engine's end-to-end test once
# more against LocalStack. Starts every service it needs. Args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh

echo "== ruff"
.venv/bin/ruff check phasegate worker orchestrator tests bench docs
echo "== mypy (strict)"
.venv/bin/mypy phasegate
.venv/bin/mypy bench
echo "== import layers (import-linter)"
# The contracts in pyproject.toml: the core imports neither plane, the planes never import each
# other, only the CLI wires both, and nothing imports worker/orchestrator as top-level packages.
.venv/bin/lint-imports
echo "== docs (mkdocs build --strict)"
# A broken link or anchor, a missing page or an undescribed setting fails here. The site goes to a
# throwaway directory; NO_MKDOCS_2_WARNING silences Material's notice about MkDocs 2.
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
echo "== chart README (readme-generator-for-helm) is current"
.venv/bin/python scripts/chart_readme.py --check
echo "== pytest"
# Two test processes (pytest-xdist), each file whole in one of them (its module fixtures built
# once): most tests wait on workers, servers and visibility timeouts, so two share the two
# cores. Each process has its own moto server and PgBouncers, and every test its own database
# and queues. PHASEGATE_TEST_PROCESSES=0 runs everything in this process; an -n in the
# arguments overrides it.
# Exit status 5 (no tests collected) fails this script like any other failure.
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${PHASEGATE_TEST_PROCESSES:-2}" \
  --dist loadfile "$@"
if [ $# -eq 0 ]; then
  echo "== the image, built and run as the chart's pod specs run it"
  bash scripts/image-test.sh
fi
if [ -f scripts/localstack-e2e.sh ] && [ -z "${PHASEGATE_SKIP_LOCALSTACK:-}" ] && [ $# -eq 0 ]; then
  echo "== engine end-to-end against LocalStack"
  bash scripts/localstack-e2e.sh
fi
