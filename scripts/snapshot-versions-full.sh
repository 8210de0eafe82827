#!/bin/bash
# How full the data area gets before ENOSPC when snapshots keep old versions of a device:
# writes VERSIONS versions of the whole device (blocks that compress about 3:1, 1200 random
# bytes then zeros per 4 KiB) through `zbd serve` and nbdcopy, a snapshot after each, and
# prints `zbd stat`'s data area use after each version, or where the write failed.
#   scripts/snapshot-versions-full.sh [SIZE=256M] [VERSIONS=5]   (ZBD=path/to/zbd)
set -euo pipefail
size=${1:-256M}
versions=${2:-5}
zbd=${ZBD:-target/release/zbd}
dir=$(mktemp -d /var/tmp/zbd-versions.XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
"$zbd" create "$dir/vol" --size "$size" --metadata-pages >/dev/null
"$zbd" serve "$dir/vol" --socket "$dir/sock" --pidfile "$dir/pid" 2>"$dir/log" &
pid=$!
until [ -e "$dir/pid" ]; do
    kill -0 "$pid" 2>/dev/null || { cat "$dir/log"; exit 1; }
    sleep 0.1
done
bytes=$(numfmt --from=iec "$size")
for v in $(seq 1 "$versions"); do
    python3 -c "
import os, sys
out = sys.stdout.buffer
for _ in range($bytes // 4096):
    out.write(os.urandom(1200) + bytes(2896))
" >"$dir/data"
    if ! nbdcopy --flush "$dir/data" "nbd+unix:///?socket=$dir/sock" 2>"$dir/err"; then
        echo "version $v: $(tail -1 "$dir/err")"
        "$zbd" stat "$dir/vol" | grep -E "data area|physical live|extents "
        exit 0
    fi
    "$zbd" snapshot create "$dir/vol@v$v" >/dev/null
    echo "version $v written: $("$zbd" stat "$dir/vol" | grep -E 'data area used' | sed 's/  */ /g')"
done
