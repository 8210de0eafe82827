#!/usr/bin/env bash
# `make demo` (first version): create a zbd volume in a temp dir, write real files through the
# engine and read them back, print `zbd stat`, clean up.
set -euo pipefail
zbd=${ZBD_BIN:-target/release/zbd}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$zbd" create "$work/demo.zbd" --size 256M --codec lz4
# A real data set: this machine's documentation and binaries, as one tar stream.
tar -cf "$work/data.tar" --ignore-failed-read /usr/share/doc /usr/bin 2>/dev/null || true
head -c 200M "$work/data.tar" > "$work/data"
"$zbd" copy "$work/demo.zbd" "$work/data"
"$zbd" stat "$work/demo.zbd"
"$zbd" check "$work/demo.zbd"
echo "host space used by the volume file: $(du -h "$work/demo.zbd" | cut -f1) (sparse; data copied: $(du -h "$work/data" | cut -f1))"
