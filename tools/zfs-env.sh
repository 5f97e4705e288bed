#!/usr/bin/env bash
# Makes sure this machine can run ZFS commands, for the dev task and the integration tests.
# - If zfs already works (OpenZFS kernel module, or a running zfs-fuse), nothing is changed.
# - Otherwise Debian's zfs-fuse is installed (apt-get, needs root) and its daemon started.
# Usage: tools/zfs-env.sh ensure
set -euo pipefail

zfs_works() {
  command -v zfs >/dev/null 2>&1 && command -v zpool >/dev/null 2>&1 && zpool list -H >/dev/null 2>&1
}

ensure() {
  if [ "$(id -u)" != "0" ]; then
    echo "zfs-env: ZFS tests and the dev pool need root (mount, zpool create)" >&2
    exit 1
  fi
  if zfs_works; then return 0; fi
  if ! command -v zfs-fuse >/dev/null 2>&1; then
    if [ -e /sys/module/zfs ]; then
      echo "zfs-env: the zfs kernel module is loaded but zfs does not answer; install zfsutils-linux" >&2
      exit 1
    fi
    echo "zfs-env: installing zfs-fuse (Debian package) ..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends zfs-fuse >&2
  fi
  if [ ! -e /dev/fuse ]; then
    echo "zfs-env: /dev/fuse is missing; zfs-fuse cannot run here" >&2
    exit 1
  fi
  # Start the daemon if none runs; a daemon that is still shutting down is waited for first.
  for _ in $(seq 1 150); do
    if zfs_works; then return 0; fi
    if ! pgrep -x zfs-fuse >/dev/null 2>&1; then
      echo "zfs-env: starting the zfs-fuse daemon" >&2
      mkdir -p /run /var/lock/zfs
      rm -f /run/zfs-fuse.pid
      zfs-fuse --pidfile /run/zfs-fuse.pid
    fi
    sleep 0.2
  done
  echo "zfs-env: zfs-fuse started but zpool does not answer" >&2
  exit 1
}

case "${1:-}" in
  ensure) ensure ;;
  *) echo "usage: $0 ensure" >&2; exit 2 ;;
esac
