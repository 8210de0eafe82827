#!/usr/bin/env bash
# Space savings of zbd's codec schemes (per block, multi-block units, trained dictionaries) against
# btrfs compress=zstd:1 / compress-force=zstd:1 / compress=lzo and zfs-fuse gzip-1 / lzjb, on the
# same files (issue 10). Needs root (loop devices, mounts), btrfs-progs, compsize, nbdfuse.
#
#   scripts/bench-savings.sh OUTDIR [NAME=DIR ...]
#
# Default trees: "corpus" (zbdlab corpus build --size small) and "mixed" (this machine's docs,
# Python sources, headers, shared libraries, about 50 MiB of each kind, and databases: man-db's
# index and any *.sqlite* over 64 KiB under /var/lib, /root, /home).
# For each tree: `zbd bench codec --dir` (ratio, speed, 4 KiB read cost, engine projection per
# scheme), then the same files copied onto each filesystem on a sparse loop image of its own:
# bytes allocated by the image after sync + fstrim (metadata included). ext4 on zbd is measured
# for lz4 and zstd:1, per block (--unit-size 4K) and with compression units (SAVINGS_UNITS,
# default "4K 8K 16K"); docs/savings.md projects the schemes the engine does not have (larger
# units, dictionaries) from that and the codec numbers (scripts/savings_project.py).
# Then 4 KiB random reads (fio's nbd engine, iodepth 16) of a tar of each tree written onto zbd
# zstd:1 volumes, per block and with each unit size, in alternating rounds (read.tsv).
# Each zbd scheme runs with trained dictionaries off and on (SAVINGS_DICTS, default "off on":
# `zbd serve --dict`).
# env: SAVINGS_UNITS (unit sizes, default "4K 8K 16K"), SAVINGS_DICTS ("off on"), SAVINGS_CODEC=0 (no codec table or
# projections), SAVINGS_SPACE=0 (reads only), SAVINGS_READ_ROUNDS (3), SAVINGS_READ_SECONDS (10),
# SAVINGS_ZFS=1 (zfs-fuse too), SAVINGS_CORPUS (a built corpus).
# Everything created is removed on exit.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
zbd=${ZBD_BIN:-$here/target/release/zbd}
out=${1:?usage: bench-savings.sh OUTDIR [NAME=DIR ...]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
[[ $EUID -eq 0 ]] || { echo "bench-savings: needs root (loop devices, mounts)" >&2; exit 1; }
[[ -x $zbd ]] || { echo "bench-savings: $zbd missing: run cargo build --release" >&2; exit 1; }
for t in mkfs.btrfs compsize mkfs.ext4 losetup nbdfuse fstrim; do
    command -v "$t" >/dev/null || { echo "bench-savings: $t not installed (make deps)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/zbd-savings.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
loop=""
dev=""
serve_pid=""
zfs_pid=""
pool=""
attach_dir=$work/attach

cleanup() {
    set +e
    mountpoint -q "$mnt" && umount "$mnt"
    [[ -n $pool ]] && { zpool export "$pool" || zpool destroy -f "$pool"; } 2>/dev/null
    [[ -n $loop ]] && losetup -d "$loop" 2>/dev/null
    [[ -n $dev ]] && "$zbd" detach "$dev" --state-dir "$attach_dir" >/dev/null 2>&1
    [[ -n $serve_pid ]] && kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null
    [[ -n $zfs_pid ]] && kill "$zfs_pid" 2>/dev/null && wait "$zfs_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# Bytes a file really occupies (sparse images: only what was written and not trimmed).
allocated() { echo $(($(stat -c %b "$1") * 512)); }

mixed_tree() {
    local dst=$1 cap=$((50 << 20))
    mkdir -p "$dst"
    /usr/bin/python3 - "$dst" "$cap" <<'EOF'
import os, shutil, sys
dst, cap = sys.argv[1], int(sys.argv[2])
kinds = {
    "doc": ["/usr/share/doc"],
    "python": ["/usr/lib/python3.11"],
    "include": ["/usr/include"],
    "lib": ["/usr/lib/x86_64-linux-gnu"],
}
def files(roots, want):
    for root in roots:
        for d, dirs, names in os.walk(root):
            dirs.sort()
            for n in sorted(names):
                p = os.path.join(d, n)
                if os.path.isfile(p) and not os.path.islink(p) and want(p):
                    yield p
for kind, roots in kinds.items():
    want = (lambda p: ".so" in os.path.basename(p)) if kind == "lib" else (lambda p: True)
    total = 0
    for p in files(roots, want):
        size = os.path.getsize(p)
        if total + size > cap:
            continue
        target = os.path.join(dst, kind, os.path.relpath(p, "/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(p, target)
        total += size
# Databases: man-db's index (gdbm) here; SQLite files found below are added by the caller.
os.makedirs(os.path.join(dst, "sqlite"), exist_ok=True)
for cand in ["/var/cache/man/index.db"]:
    if os.path.isfile(cand):
        shutil.copyfile(cand, os.path.join(dst, "sqlite", os.path.basename(cand)))
EOF
    find /var/lib /root /home -xdev -type f \( -name '*.sqlite' -o -name '*.sqlite3' \) -size +64k 2>/dev/null \
        | head -5 | while read -r f; do cp "$f" "$dst/sqlite/"; done
}

trees=("$@")
if [[ ${#trees[@]} -eq 0 ]]; then
    corpus=${SAVINGS_CORPUS:-/tmp/zbd-savings-corpus}
    if [[ ! -d $corpus/data ]]; then
        "$here/.venv/bin/zbdlab" corpus build -o "$corpus" --size small >/dev/null
    fi
    mixed_tree "$work/mixed"
    trees=("corpus=$corpus/data" "mixed=$work/mixed")
fi

# image size for a tree: enough for the tree uncompressed plus filesystem overhead
image_bytes() { echo $(( ($(du -sb "$1" | cut -f1) * 2 + (512 << 20)) / 4096 * 4096 )); }

fresh_image() {
    rm -f "$work/img"
    truncate -s "$1" "$work/img"
    loop=$(losetup --find --show "$work/img")
}

release_image() {
    losetup -d "$loop"
    loop=""
}

copy_and_trim() {
    cp -a "$1/." "$mnt/"
    sync
    fstrim "$mnt" || true
    sync
}

tsv=$out/space.tsv
printf 'tree\ttarget\tfiles_bytes\timage_allocated_bytes\tnote\n' >"$tsv"
printf 'tree\tscheme\tround\tiops_4k_randread_qd16\n' >"$out/read.tsv"
units=${SAVINGS_UNITS:-4K 8K 16K}
dicts=${SAVINGS_DICTS:-off on}
scheme() {
    if [[ $1 == 4K ]]; then printf 'per block'; else printf '%s units' "$1"; fi
    if [[ $2 == on ]]; then printf ', dictionary'; fi
}

# Serves volume $1 with dictionaries $2 (on/off) on $work/sock (zbd serve, in the background)
# until stop_volume.
serve_volume() {
    rm -f "$work/sock" "$work/pid"
    "$zbd" serve "$1" --dict "${2:-off}" --socket "$work/sock" --pidfile "$work/pid" >"$work/serve.log" 2>&1 &
    serve_pid=$!
    for _ in $(seq 300); do [[ -S $work/sock && -s $work/pid ]] && break; kill -0 $serve_pid || break; sleep 0.1; done
}

stop_volume() {
    kill "$serve_pid"
    wait "$serve_pid" || true
    serve_pid=""
}

# Bytes each filesystem and zbd scheme allocates for tree $name ($dir), into space.tsv.
space() {
    for opt in compress=zstd:1 compress-force=zstd:1 compress=lzo; do
        fresh_image "$size"
        mkfs.btrfs -q -f "$loop"
        mount -o "$opt" "$loop" "$mnt"
        copy_and_trim "$dir"
        compsize -b "$mnt" >"$out/compsize-$name-${opt/:/}.txt" 2>&1 || true
        umount "$mnt"
        printf '%s\tbtrfs %s\t%s\t%s\t\n' "$name" "$opt" "$files_bytes" "$(allocated "$work/img")" >>"$tsv"
        release_image
    done

    fresh_image "$size"
    mkfs.ext4 -q -F "$loop"
    mount "$loop" "$mnt"
    copy_and_trim "$dir"
    umount "$mnt"
    printf '%s\text4\t%s\t%s\tno compression\n' "$name" "$files_bytes" "$(allocated "$work/img")" >>"$tsv"
    release_image

    for codec in lz4 zstd:1; do
        for unit in $units; do
          for d in $dicts; do
            vol=$work/vol.zbd
            rm -f "$vol"
            "$zbd" create "$vol" --size "$size" --codec "$codec" --unit-size "$unit" --force >/dev/null
            serve_volume "$vol" "$d"
            dev=$("$zbd" attach --socket "$work/sock" --state-dir "$attach_dir" | grep -o '/dev/[a-z0-9]*' | tail -1)
            mkfs.ext4 -q -F "$dev"
            mount "$dev" "$mnt"
            copy_and_trim "$dir"
            umount "$mnt"
            "$zbd" detach "$dev" --state-dir "$attach_dir" >/dev/null
            dev=""
            stop_volume
            "$zbd" stat "$vol" >"$out/zbd-stat-$name-${codec/:/}-$unit-dict$d.txt" 2>&1 || true
            printf '%s\text4 on zbd %s (%s)\t%s\t%s\t\n' "$name" "$codec" "$(scheme "$unit" "$d")" \
                "$files_bytes" "$(allocated "$vol")" >>"$tsv"
            rm -f "$vol"
          done
        done
    done

    # zfs-fuse runs one daemon per machine, which other users may share: opt in with SAVINGS_ZFS=1.
    if [[ ${SAVINGS_ZFS:-0} == 1 ]] && command -v zpool >/dev/null && command -v zfs-fuse >/dev/null; then
        if ! pgrep -x zfs-fuse >/dev/null; then
            zfs-fuse --no-daemon >"$work/zfs-fuse.log" 2>&1 &
            zfs_pid=$!
            for _ in $(seq 300); do zpool list >/dev/null 2>&1 && break; sleep 0.1; done
        fi
        for comp in gzip-1 lzjb; do
            rm -f "$work/img"
            truncate -s "$size" "$work/img"
            pool=zbdsav$$
            if zpool create -f -o cachefile=none -m "$mnt" -O compression="$comp" -O recordsize=128K "$pool" "$work/img" 2>"$work/zfs.err"; then
                cp -a "$dir/." "$mnt/" || true
                sync
                # zfs-fuse accounts written data at transaction-group commit: export/import forces it.
                zpool export "$pool" && zpool import -o cachefile=none -d "$work" "$pool"
                alloc=$(zfs get -H -p -o value used "$pool")
                ratio=$(zfs get -H -o value compressratio "$pool")
                # Export (unmounts, releases the image) rather than destroy, which zfs-fuse may
                # refuse as "busy" right after an import.
                zpool export "$pool" || zpool destroy -f "$pool"
                printf '%s\tzfs-fuse %s recordsize=128K\t%s\t%s\tzfs used (image not trimmed by zfs-fuse); compressratio %s\n' \
                    "$name" "$comp" "$files_bytes" "$alloc" "$ratio" >>"$tsv"
            else
                printf '%s\tzfs-fuse %s\t%s\t\tskipped: %s\n' "$name" "$comp" "$files_bytes" "$(head -1 "$work/zfs.err")" >>"$tsv"
            fi
            pool=""
        done
        if [[ -n $zfs_pid ]]; then kill "$zfs_pid"; wait "$zfs_pid" || true; zfs_pid=""; fi
    fi
}

# 4 KiB random reads of the tree's bytes (a tar written onto the volume) per unit size, same run.
random_reads() {
    tar cf "$work/tree.tar" -C "$dir" .
    tar_bytes=$(stat -c %s "$work/tree.tar")
    for unit in $units; do
      for d in $dicts; do
        "$zbd" create "$work/read-$unit-$d.zbd" --size "$size" --codec zstd:1 --unit-size "$unit" --force >/dev/null
        serve_volume "$work/read-$unit-$d.zbd" "$d"
        nbdcopy --flush "$work/tree.tar" "nbd+unix:///?socket=$work/sock"
        stop_volume
      done
    done
    for round in $(seq "${SAVINGS_READ_ROUNDS:-3}"); do
        for unit in $units; do
          for d in $dicts; do
            serve_volume "$work/read-$unit-$d.zbd" "$d"
            fio --name=randread --ioengine=nbd --uri="nbd+unix:///?socket=$work/sock" --rw=randread \
                --bs=4k --iodepth=16 --size="$tar_bytes" --time_based --runtime="${SAVINGS_READ_SECONDS:-10}" \
                --randrepeat=0 --output-format=json --output="$out/fio-$name-$unit-$d-$round.json" >/dev/null
            stop_volume
            iops=$(/usr/bin/python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["jobs"][0]["read"]["iops"]))' \
                "$out/fio-$name-$unit-$d-$round.json")
            printf '%s\tzstd:1 (%s)\t%s\t%s\n' "$name" "$(scheme "$unit" "$d")" "$round" "$iops" >>"$out/read.tsv"
          done
        done
    done
    rm -f "$work"/read-*.zbd "$work/tree.tar"
}

for spec in "${trees[@]}"; do
    name=${spec%%=*}
    dir=${spec#*=}
    files_bytes=$(du -sb --apparent-size "$dir" | cut -f1)
    size=$(image_bytes "$dir")
    echo "== $name: $dir ($((files_bytes >> 20)) MiB)"
    # SAVINGS_CODEC=0 skips the codec table and the projections (minutes on a loaded machine).
    if [[ ${SAVINGS_CODEC:-1} == 1 ]]; then
        "$zbd" bench codec --codecs none --dir "$dir" --json >"$out/codec-$name.json"
    fi

    # SAVINGS_SPACE=0: the random reads alone.
    if [[ ${SAVINGS_SPACE:-1} == 1 ]]; then space; fi
    random_reads
done

/usr/bin/python3 "$here/scripts/savings_project.py" "$out" | tee "$out/summary.md"
