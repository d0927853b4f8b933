#!/usr/bin/env bash
# Regenerate the hash-pinned lock files from pyproject.toml:
#   requirements/ci.lock     every extra (tests, docs, demo, otel): scripts/bootstrap.sh
#   requirements/image.lock  the runtime dependencies + the build backend: the Dockerfile
# Versions already in a lock are kept (uv prefers them); pass --upgrade, or
# --upgrade-package NAME, to move them. The image lock is resolved inside the CI lock, so the
# image runs exactly the versions the tests ran. Resolution is universal (every platform's
# markers, Python >= 3.11), so one lock serves a laptop, CI and the linux/amd64+arm64 image.
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-.venv/bin/uv}
if ! [ -x "$uv" ] && ! command -v "$uv" >/dev/null 2>&1; then
  echo "no uv at $uv: run scripts/bootstrap.sh first (or set UV=...)" >&2
  exit 2
fi
compile=("$uv" pip compile --quiet --universal --python-version 3.11 --generate-hashes
         --custom-compile-command "bash scripts/lock.sh")
"${compile[@]}" pyproject.toml --all-extras -o requirements/ci.lock "$@"
"${compile[@]}" pyproject.toml requirements/build.in -c requirements/ci.lock \
  -o requirements/image.lock "$@"
echo "wrote requirements/ci.lock and requirements/image.lock" >&2
