#!/usr/bin/env bash
# Builds the zbd Debian package with dpkg-deb (no extra tool): the binary, the systemd units,
# the commented volume list (a conffile), man pages and completions generated from the CLI,
# and docs/operations.md. Usage: scripts/build-deb.sh [--bin PATH] [--out DIR]
# (defaults: target/release/zbd, target/deb). Prints the .deb's path.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/target/release/zbd
out=$root/target/deb
while (($#)); do
  case $1 in
  --bin) bin=$2; shift 2 ;;
  --out) out=$2; shift 2 ;;
  *) echo "build-deb: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $bin ]] || { echo "build-deb: no binary at $bin (make build)" >&2; exit 1; }

version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

install -Dm755 "$bin" "$stage/usr/bin/zbd"
# The release profile keeps debug info for profiling; the package ships the binary without it.
strip --strip-debug "$stage/usr/bin/zbd"
install -Dm644 "$root/packaging/systemd/zbd@.service" "$stage/usr/lib/systemd/system/zbd@.service"
install -Dm644 "$root/packaging/systemd/zbd-attach@.service" \
  "$stage/usr/lib/systemd/system/zbd-attach@.service"
install -Dm644 "$root/packaging/volumes" "$stage/etc/zbd/volumes"
install -Dm644 "$root/docs/operations.md" "$stage/usr/share/doc/zbd/operations.md"
install -Dm644 "$root/packaging/prometheus/zbd-alerts.yml" "$stage/usr/share/doc/zbd/zbd-alerts.yml"
"$bin" gen-man "$stage/usr/share/man/man1"
gzip -9n "$stage"/usr/share/man/man1/*.1
mkdir -p "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions" \
  "$stage/usr/share/fish/vendor_completions.d"
"$bin" completions bash >"$stage/usr/share/bash-completion/completions/zbd"
"$bin" completions zsh >"$stage/usr/share/zsh/vendor-completions/_zbd"
"$bin" completions fish >"$stage/usr/share/fish/vendor_completions.d/zbd.fish"

mkdir -p "$stage/DEBIAN"
echo /etc/zbd/volumes >"$stage/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: zbd
Version: $version
Architecture: $arch
Maintainer: zbd developers <zbd@localhost>
Installed-Size: $size
Depends: libc6, fuse3, libnbd-bin, util-linux
Recommends: nbd-client
Suggests: librados2, prometheus-node-exporter
Section: admin
Priority: optional
Description: transparent compressing block device in user space, served over NBD
 zbd stores 4 KiB blocks compressed (lz4, zstd, zlib, lzo) in a log-structured volume
 on a file, block device or Ceph RADOS pool, and serves it over NBD; zbd attach makes a
 block device of it (kernel nbd-client, or nbdfuse and a loop device). Includes systemd
 units to serve and attach the volumes listed in /etc/zbd/volumes at boot, and a
 Prometheus metrics endpoint.
CONTROL
mkdir -p "$out"
deb=$out/zbd_${version}_${arch}.deb
dpkg-deb --root-owner-group --build "$stage" "$deb" >/dev/null
echo "$deb"
