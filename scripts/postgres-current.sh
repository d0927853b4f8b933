#!/usr/bin/env bash
# A current PostgreSQL (Debian trixie's 17) beside the host's 15, to run the suite against: a
# minimal trixie root file system with postgresql-17, built once with debootstrap (about 1 min
# and 330 MB), and a throwaway cluster in it run under chroot. Its libc is newer than
# bookworm's, so the package cannot be installed on the host itself.
#
# Usage: dsn=$(bash scripts/postgres-current.sh start [PORT])   a fresh cluster on 127.0.0.1:PORT
#                                                               (default 55417); prints its DSN
#        PHASEGATE_TEST_DATABASE_URL=$dsn .venv/bin/python -m pytest -q tests/integration
#        bash scripts/postgres-current.sh stop                  stops it and removes the cluster
# The root lives in PHASEGATE_POSTGRES_ROOT, else ~/.cache/phasegate/postgres17-trixie.
# Needs root (debootstrap, chroot) and deb.debian.org.
set -euo pipefail
action=${1:-}
port=${2:-55417}
root=${PHASEGATE_POSTGRES_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/phasegate/postgres17-trixie}
bin=/usr/lib/postgresql/17/bin
data=/tmp/phasegate-pg17
[ "$(id -u)" = 0 ] || { echo "scripts/postgres-current.sh needs root (debootstrap, chroot)" >&2; exit 2; }
as_postgres() { chroot "$root" su postgres -s /bin/sh -c "$1"; }

case "$action" in
  start)
    source "$(dirname "$0")/trixie-root.sh"
    trixie_root "$root" postgresql-17 "$bin/postgres"
    as_postgres "$bin/pg_ctl -D $data status" >/dev/null 2>&1 && as_postgres "$bin/pg_ctl -D $data stop -m fast" >/dev/null
    rm -rf "$root$data"
    as_postgres "$bin/initdb -D $data -A trust -U postgres" > "$root.initdb.log" 2>&1 \
      || { tail -20 "$root.initdb.log" >&2; exit 1; }
    # The suite opens many connections at once, as against the host's server; mmap shared
    # memory, since the chroot has no tmpfs on /dev/shm.
    as_postgres "$bin/pg_ctl -D $data -l $data.log -w -o '-p $port -c listen_addresses=127.0.0.1 -k /tmp -c dynamic_shared_memory_type=mmap -c max_connections=300' start" >&2
    echo "postgresql://postgres@127.0.0.1:$port/postgres"
    ;;
  stop)
    as_postgres "$bin/pg_ctl -D $data stop -m fast" >&2 || true
    rm -rf "${root:?}$data" "$root$data.log"
    ;;
  *)
    echo "usage: bash scripts/postgres-current.sh start [PORT] | stop" >&2
    exit 2
    ;;
esac
