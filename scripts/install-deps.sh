#!/usr/bin/env bash
# Installs the system packages zbd and zbdlab need. Idempotent: does nothing when all are present.
# Usage: scripts/install-deps.sh [--with-browser] [--with-ceph]
set -euo pipefail

packages=(
  fio postmark                      # workloads
  gcc libc6-dev                     # builds the PostMark data shim (workloads/postmark_data.c)
  libnbd-bin nbdkit fuse3           # nbdinfo/nbdcopy/nbdfuse, reference NBD server, fusermount3
  python3-libnbd                    # libnbd bindings for /usr/bin/python3 (bad-input tests)
  qemu-utils                        # qemu-img, qemu-io
  e2fsprogs xfsprogs btrfs-progs btrfs-compsize zfs-fuse
  duperemove                        # btrfs dedup anchor (scripts/bench-dedup-space.py)
  util-linux procps psmisc sysstat
  librados2                         # loaded by zbd for rados:POOL/NAME volumes (not to build)
  prometheus                        # promtool + a real server: the metrics tests
)
for flag in "$@"; do
  case $flag in
  --with-browser) packages+=(chromium) ;;
  # A throwaway one-node cluster for tests and benchmarks (scripts/ceph-cluster.sh); qemu's rbd
  # driver serves the RBD image that scripts/bench-ceph.sh compares with (qemu-nbd rbd:...).
  --with-ceph) packages+=(ceph-mon ceph-mgr ceph-osd ceph-common qemu-block-extra) ;;
  *) echo "install-deps: unknown option $flag" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: need root to install: ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
