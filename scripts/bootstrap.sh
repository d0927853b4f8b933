#!/usr/bin/env bash
# Prepare this checkout on a machine that has only Python 3.11+: a .venv with phasegate and
# its test tools, and PostgreSQL server binaries (from the OS packages) when none exist.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "phasegate needs Python 3.11 or newer (set PYTHON=...)" >&2
  exit 2
fi

have_pg_binaries() {
  command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}
# What a stock Debian/Ubuntu machine lacks, installed in one apt-get run when we are root:
# the PostgreSQL server binaries for the throwaway clusters, python3-venv (Debian's
# python3 ships without venv's ensurepip until it is installed), and for the test command
# only (scripts/demo.sh sets PHASEGATE_DEMO_ONLY): Chromium for the console's browser tests
# (Playwright drives /usr/bin/chromium; it never downloads a browser) with libatomic1, which
# Playwright's bundled node driver links against and Chromium does not pull in, and node + npm
# for the chart README check (scripts/chart_readme.py runs bitnami's generator from npm).
os_packages=()
if [ -z "${PHASEGATE_DEMO_ONLY:-}" ]; then
  [ -x /usr/bin/chromium ] || os_packages+=(chromium)
  # grep reads all of it (no -q): an early exit would SIGPIPE ldconfig and, with pipefail,
  # count a library that is there as missing.
  /sbin/ldconfig -p 2>/dev/null | grep 'libatomic\.so\.1 ' >/dev/null || os_packages+=(libatomic1)
  { command -v node && command -v npm; } >/dev/null 2>&1 || os_packages+=(nodejs npm)
fi
if ! have_pg_binaries && [ -z "${PHASEGATE_TEST_DATABASE_URL:-}" ]; then
  os_packages+=(postgresql)
fi
if [ ! -x .venv/bin/python ] && ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  os_packages+=(python3-venv)
fi
if [ ${#os_packages[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${os_packages[*]} (apt-get install) ..." >&2
    apt_log=$(mktemp)
    if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
             --no-install-recommends "${os_packages[@]}"; } >"$apt_log" 2>&1; then
      tail -30 "$apt_log" >&2
      echo "apt-get install ${os_packages[*]} failed" >&2
      exit 1
    fi
    rm -f "$apt_log"
  else
    for package in "${os_packages[@]}"; do
      case $package in
        postgresql)
          echo "no PostgreSQL server binaries (initdb) found: install the postgresql package" \
               "or set PHASEGATE_TEST_DATABASE_URL / PHASEGATE_DATABASE_URL" >&2 ;;
        python3-venv)
          echo "$python has no venv module: install the python3-venv package" \
               "(sudo apt-get install python3-venv) and run this again" >&2
          exit 2 ;;
        chromium)
          echo "no /usr/bin/chromium: the console's browser tests will be skipped" \
               "(sudo apt-get install chromium)" >&2 ;;
        libatomic1)
          echo "no libatomic.so.1: Playwright's driver cannot start, the browser tests fail" \
               "(sudo apt-get install libatomic1)" >&2 ;;
        npm)
          echo "no node/npm: the test command's chart README check will fail" \
               "(sudo apt-get install nodejs npm)" >&2 ;;
      esac
    done
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=.venv/.phasegate-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ requirements/ci.lock -nt "$stamp" ]; then
  echo "installing phasegate and its test tools into .venv ..." >&2
  log=.venv/install.log
  # Every dependency comes from the hash-pinned lock (scripts/lock.sh regenerates it); the
  # project itself is then installed editable without dependencies and without build
  # isolation (setuptools and wheel are in the lock), so nothing unpinned is downloaded.
  if ! { .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip &&
         .venv/bin/python -m pip install -q --disable-pip-version-check --require-hashes \
           -r requirements/ci.lock &&
         .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
           --no-build-isolation -e .; } >"$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" >&2
    echo "installation failed (full log: $log)" >&2
    exit 1
  fi
  .venv/bin/python -c 'import phasegate.worker, phasegate.orchestrator, phasegate.cli, moto, pytest' \
    || { echo "installation failed" >&2; exit 1; }
  touch "$stamp"
fi
