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
source "$(dirname "$0")/trixie-root.sh"
trixie_root "$dir" pgbouncer /usr/sbin/pgbouncer
chroot "$dir" /usr/sbin/pgbouncer --version | head -1 >&2
echo "$dir"
