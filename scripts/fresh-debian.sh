#!/usr/bin/env bash
# Check the README's two commands on a stock Debian 12 machine: a minimal bookworm root
# (python3, ca-certificates, git; no python3-venv, no PostgreSQL, no browser, no node) imported
# into Docker, then, each from a fresh clone of this checkout's committed HEAD (not the work
# tree) owned by another uid than root's, in a throwaway container:
#
#   0. as that uid, ./scripts/demo.sh and ./scripts/test.sh stop at once, naming python3-venv
#   1. as root, ./scripts/demo.sh   bootstrap, throwaway Postgres, moto, workers, a kill, summary
#   2. as root, ./scripts/test.sh ARGS   bootstrap, ruff, mypy, import-linter, mkdocs --strict,
#                                        the chart README check, then pytest -rs ARGS
#
# Usage: bash scripts/fresh-debian.sh            the check: ARGS = CHECK_SELECTION below, and
#                                                  a skipped test fails it (a fresh machine that
#                                                  silently skips the browser test proves nothing)
#        bash scripts/fresh-debian.sh --full     ./scripts/test.sh with no args: the whole suite
#                                                  and the LocalStack end-to-end (the image step
#                                                  needs a Docker daemon, which the container has
#                                                  not: it is skipped and says so); skips listed
#        bash scripts/fresh-debian.sh ARGS...    ./scripts/test.sh ARGS (your pytest selection)
#
# Needs root (or sudo) for apt, debootstrap and dockerd. Not part of scripts/test.sh: it
# downloads and installs a whole OS. FRESH_DEBIAN_REBUILD=1 rebuilds the base image.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${FRESH_DEBIAN_IMAGE:-phasegate-fresh:bookworm}
NETWORK=${FRESH_DEBIAN_NETWORK:-bridge}   # bridge: the host's own services are not visible
# The parts a fresh machine breaks first: the unit tests (docs snippets, locks, layers), the
# console in Debian's Chromium, PgBouncer from Debian's package, and the engine's end-to-end
# module (worker processes killed and restarted, direct and through PgBouncer).
CHECK_SELECTION=(tests/unit tests/integration/test_console_browser.py
                 tests/integration/test_pooler.py tests/integration/test_engine_e2e.py)
# Skips that say what the container's kernel view lacks, not what an install left out: Docker's
# cgroup namespace on a cgroup v1 host shows no PSI (memory.pressure). Any other skip fails
# the check.
KERNEL_SKIPS='no PSI on this host'
# The owner of the clones: a developer's checkout, not root's (the scripts run as root in it).
CHECKOUT_OWNER=${FRESH_DEBIAN_CHECKOUT_OWNER:-1000:1000}

mode=check
if [ "${1:-}" = --full ]; then
  mode=full
  shift
  [ $# -eq 0 ] || { echo "--full takes no pytest args" >&2; exit 2; }
elif [ $# -gt 0 ]; then
  mode=selection
else
  set -- "${CHECK_SELECTION[@]}"
fi

# shellcheck source=scripts/docker-daemon.sh
. scripts/docker-daemon.sh  # from the checkout root (cd above)
docker_up /tmp/phasegate-dockerd.log

work=$(mktemp -d "${TMPDIR:-/tmp}/phasegate-fresh-debian.XXXXXX")
# Files the containers wrote (root-owned) go with the directory.
trap 'as_root rm -rf "$work"' EXIT
began=$(date +%s)

if [ -n "${FRESH_DEBIAN_REBUILD:-}" ] || ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "== debootstrap bookworm (minbase + python3, ca-certificates, git; no python3-venv)"
  start=$(date +%s)
  as_root debootstrap --variant=minbase --include=python3,ca-certificates,git bookworm \
    "$work/root" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  # pip and apt inside verify TLS against the host's CA bundle (which may add a local CA).
  as_root cp /etc/ssl/certs/ca-certificates.crt "$work/root/etc/ssl/certs/ca-certificates.crt"
  as_root rm -rf "$work/root/var/cache/apt/archives"/*.deb "$work/root/var/lib/apt/lists"/*
  as_root tar -C "$work/root" -c . | docker import - "$IMAGE" >/dev/null
  as_root rm -rf "$work/root"
  echo "   $IMAGE built in $(( $(date +%s) - start )) s"
fi

run_fresh() {  # run_fresh NAME COMMAND [DOCKER_RUN_FLAGS...]: in a fresh container and clone
  local name=$1 command=$2 start status=0
  shift 2
  git clone -q "$PWD" "$work/$name"
  as_root chown -R "$CHECKOUT_OWNER" "$work/$name"
  echo "== [$name] $command"
  start=$(date +%s)
  # pipefail: the status is docker's (tee keeps a copy of the output for the checks below).
  if docker run --rm --network "$NETWORK" "$@" -v "$work/$name:/src" -w /src "$IMAGE" \
       bash -c "$command" 2>&1 | tee "$work/$name.log"; then
    status=0
  else
    status=$?
  fi
  echo "== [$name] exit $status after $(( $(date +%s) - start )) s"
  return "$status"
}

# Not root: nothing can be installed, so both commands must stop at once, naming the package.
for command in ./scripts/demo.sh ./scripts/test.sh; do
  name=nonroot-$(basename "$command" .sh)
  if run_fresh "$name" "$command" --user "$CHECKOUT_OWNER"; then
    echo "== $command as uid ${CHECKOUT_OWNER%%:*} should have stopped" >&2; exit 1
  fi
  grep -q "install the python3-venv package" "$work/$name.log" \
    || { echo "== $command as uid ${CHECKOUT_OWNER%%:*} did not name python3-venv" >&2; exit 1; }
done

run_fresh demo './scripts/demo.sh'
grep -q "RESULT: every run completed exactly once" "$work/demo.log" \
  || { echo "== the demo printed no successful summary" >&2; exit 1; }

# -rs: every skipped test is listed with its reason (counted below).
if [ "$mode" = full ]; then
  run_fresh test './scripts/test.sh' -e PYTEST_ADDOPTS=-rs -e PHASEGATE_SKIP_IMAGE=1
else
  run_fresh test "./scripts/test.sh $(printf '%q ' "$@")" -e PYTEST_ADDOPTS=-rs
fi
skipped=$(grep -c '^SKIPPED' "$work/test.log" || true)
unexpected=$(grep '^SKIPPED' "$work/test.log" | grep -v -e "$KERNEL_SKIPS" || true)
echo "== $skipped test(s) skipped in the fresh container"
if [ "$mode" = check ] && [ -n "$unexpected" ]; then
  echo "== skipped on the fresh machine (the check needs every one to run):" >&2
  echo "$unexpected" >&2
  exit 1
fi
echo "== both README commands work on a fresh Debian 12 (python3 without venv, as root)" \
     "in $(( $(date +%s) - began )) s"
