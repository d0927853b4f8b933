#!/usr/bin/env bash
# Build the phasegate image and run it the way the chart's pod spec runs it (tests/image/).
#
# Installs what it needs itself (docker.io, debootstrap), starts dockerd when none answers,
# and builds from the official python base when it can be pulled, else from a stand-in base
# made from Debian packages (debootstrap + a venv at /usr/local, where the official image keeps
# python and pip). The stand-in is cached as a tarball between runs; a fresh machine builds it
# from nothing. Extra args go to pytest. PHASEGATE_SKIP_IMAGE=1 skips the whole step (local
# use only; .ci/run unsets it).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${PHASEGATE_SKIP_IMAGE:-}" ]; then
  echo "image step skipped (PHASEGATE_SKIP_IMAGE is set)"
  exit 0
fi

CACHE=${PHASEGATE_IMAGE_CACHE:-/var/cache/phasegate-image}
IMAGE=${PHASEGATE_IMAGE:-phasegate:ci}
OFFICIAL_BASE=$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile)
STANDIN_BASE=phasegate-standin-python:3.11-bookworm
mkdir -p "$CACHE"

# shellcheck source=scripts/docker-daemon.sh
. scripts/docker-daemon.sh  # from the checkout root (cd above)
docker_up "$CACHE/dockerd.log"

build_standin() {
  local root="$CACHE/rootfs"
  echo "== building the stand-in python base from Debian packages"
  as_root rm -rf "$root"
  as_root debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" http://deb.debian.org/debian >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
  # python and pip where the official image has them.
  as_root chroot "$root" python3 -m venv /usr/local
  # pip inside the build verifies the package registry against the host's CA bundle.
  as_root cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  as_root rm -rf "$root/var/cache/apt/archives"/*.deb "$root/var/lib/apt/lists"/*
  as_root tar -C "$root" -c . | docker import \
    -c 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' -c 'CMD ["python3"]' - "$STANDIN_BASE" >/dev/null
  as_root rm -rf "$root"
  docker save "$STANDIN_BASE" -o "$CACHE/standin-base.tar"
}

base=""
if timeout 30 docker pull -q "$OFFICIAL_BASE" >/dev/null 2>&1; then
  base=$OFFICIAL_BASE
elif docker image inspect "$STANDIN_BASE" >/dev/null 2>&1; then
  base=$STANDIN_BASE
elif [ -f "$CACHE/standin-base.tar" ] && docker load -q -i "$CACHE/standin-base.tar" >/dev/null; then
  base=$STANDIN_BASE
else
  build_standin
  base=$STANDIN_BASE
fi
echo "== base image: $base ($(docker image inspect -f '{{.Size}}' "$base" | awk '{printf "%.0f MB", $1/1e6}'))"

echo "== docker build -t $IMAGE"
start=$(date +%s)
docker build -q --network host --build-arg "PYTHON_IMAGE=$base" -t "$IMAGE" . >/dev/null
echo "   built in $(( $(date +%s) - start )) s;" \
  "image size $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MiB", $1/1048576}')"

echo "== image tests (tests/image)"
PHASEGATE_IMAGE=$IMAGE .venv/bin/python -m pytest -q -p no:cacheprovider tests/image "$@"
