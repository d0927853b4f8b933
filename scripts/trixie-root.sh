# Sourced by scripts/pgbouncer-current.sh and scripts/postgres-current.sh: a minimal Debian 13
# (trixie) root file system holding one package, for software whose Debian 13 build needs a
# newer libc than the host's Debian 12 has; it runs there under chroot, sharing the host's
# network. Needs root and deb.debian.org.

# trixie_root DIR PACKAGE CHECK: build DIR with PACKAGE unless the file CHECK (a path inside the
# root) exists already. One build at a time (parallel test sessions may ask together); a failed
# build leaves nothing behind but DIR.log.
trixie_root() {
  local dir=$1 package=$2 check=$3
  mkdir -p "$(dirname "$dir")"
  exec 9>"$dir.lock"
  flock 9
  if [ ! -e "$dir$check" ]; then
    if ! command -v debootstrap >/dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 || {
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    fi
    rm -rf "$dir.partial"
    echo "== building a trixie root with $package in $dir (debootstrap, about a minute)" >&2
    debootstrap --variant=minbase --include="$package" trixie "$dir.partial" \
      http://deb.debian.org/debian > "$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; exit 1; }
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
  fi
  exec 9>&-
}
