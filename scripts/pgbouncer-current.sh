#!/usr/bin/env bash
# A current PgBouncer (Debian trixie's 1.24, whose max_prepared_statements is 200 by default)
# for the tests and benches, beside Debian 12's 1.18: a minimal trixie root file system with the
# pgbouncer package, built once with debootstrap (about 30 s and 290 MB), then run under chroot
# (bench/pgbouncer.py, root=...). Its libc is newer than bookworm's, so the package cannot be
# installed on the host itself.
#
# Usage: bash scripts/pgbouncer-current.sh [DIR]   builds DIR if it holds no pgbouncer yet and
#                                                  prints DIR (default: PHASEGATE_PGBOUNCER_ROOT,
#                                                  else ~/.cache/phasegate/pgbouncer-trixie)
# Needs root (debootstrap, chroot) and deb.debian.org.
set -euo pipefail
dir=${1:-${PHASEGATE_PGBOUNCER_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/phasegate/pgbouncer-trixie}}
[ "$(id -u)" = 0 ] || { echo "scripts/pgbouncer-current.sh needs root (debootstrap, chroot)" >&2; exit 2; }
mkdir -p "$(dirname "$dir")"
# One build at a time: parallel test sessions may ask together.
exec 9>"$dir.lock"
flock 9
if [ ! -x "$dir/usr/sbin/pgbouncer" ]; then
  if ! command -v debootstrap >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 || {
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  fi
  partial="$dir.partial"
  rm -rf "$partial"
  echo "== building a trixie root with pgbouncer in $dir (debootstrap, about 30 s)" >&2
  debootstrap --variant=minbase --include=pgbouncer trixie "$partial" http://deb.debian.org/debian \
    > "$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; exit 1; }
  rm -rf "$dir"
  mv "$partial" "$dir"
fi
chroot "$dir" /usr/sbin/pgbouncer --version | head -1 >&2
echo "$dir"
