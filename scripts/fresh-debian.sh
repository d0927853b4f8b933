#!/usr/bin/env bash
# Check the README's two commands on a stock Debian 12 machine: a minimal bookworm root
# (python3, ca-certificates, git; no python3-venv, no PostgreSQL) imported into Docker, then,
# each from a fresh clone of this checkout's committed HEAD (not the work tree), as root in a
# throwaway container:
#
#   1. ./scripts/demo.sh                          (bootstrap, throwaway Postgres, moto, summary)
#   2. bash scripts/bootstrap.sh && pytest ...    (the test command's bootstrap and a test subset)
#
# Args replace the default pytest selection (tests/unit -x). Needs root (or sudo) for apt,
# debootstrap and dockerd. Not part of scripts/test.sh: it downloads and installs a whole OS
# and takes about five minutes. FRESH_DEBIAN_REBUILD=1 rebuilds the base image.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${FRESH_DEBIAN_IMAGE:-phasegate-fresh:bookworm}
NETWORK=${FRESH_DEBIAN_NETWORK:-bridge}   # bridge: the host's own services are not visible
if [ $# -eq 0 ]; then
  set -- tests/unit -x
fi

# shellcheck source=scripts/docker-daemon.sh
. scripts/docker-daemon.sh  # from the checkout root (cd above)
docker_up /tmp/phasegate-dockerd.log

work=$(mktemp -d "${TMPDIR:-/tmp}/phasegate-fresh-debian.XXXXXX")
# Files the containers wrote (root-owned) go with the directory.
trap 'as_root rm -rf "$work"' EXIT

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

run_fresh() {  # run_fresh NAME COMMAND: COMMAND as root in a fresh container and clone
  local name=$1 command=$2 start status=0
  git clone -q "$PWD" "$work/$name"
  echo "== [$name] $command"
  start=$(date +%s)
  docker run --rm --network "$NETWORK" -v "$work/$name:/src" -w /src "$IMAGE" \
    bash -c "$command" || status=$?
  echo "== [$name] exit $status after $(( $(date +%s) - start )) s"
  return "$status"
}

run_fresh demo './scripts/demo.sh'
run_fresh test "bash scripts/bootstrap.sh && .venv/bin/python -m pytest -q -p no:cacheprovider $(printf '%q ' "$@")"
echo "== both README commands work on a fresh Debian 12 (python3 without venv, as root)"
