# Sourced by the scripts that need Docker (image-test.sh, fresh-debian.sh): Debian's docker.io
# and debootstrap when missing, and a running dockerd. Images cannot be pulled here, so the
# callers build their bases from Debian packages with debootstrap.

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# docker_up LOG: install what is missing, start dockerd (its output to LOG) unless one answers.
docker_up() {
  local log=$1 need_packages=()
  command -v dockerd >/dev/null || need_packages+=(docker.io)
  command -v debootstrap >/dev/null || need_packages+=(debootstrap)
  if [ ${#need_packages[@]} -gt 0 ]; then
    echo "== installing ${need_packages[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_packages[@]}" >/dev/null
  fi
  if ! docker info >/dev/null 2>&1; then
    echo "== starting dockerd (log: $log)"
    as_root sh -c "nohup dockerd >'$log' 2>&1 &"
    for _ in $(seq 1 120); do
      docker info >/dev/null 2>&1 && break
      sleep 0.5  # polling the daemon's socket until it answers, bounded to 60 s
    done
    docker info >/dev/null 2>&1 || { echo "dockerd did not come up; see $log" >&2; exit 1; }
  fi
}
