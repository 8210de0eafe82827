#!/usr/bin/env bash
# zbd on RADOS vs an RBD image in the same throwaway cluster (scripts/ceph-cluster.sh, memstore,
# one OSD, pools of size 1), same run:
#   1. bytes each pool stores (its objects' sizes, as `rados df` counts them) after copying a
#      real tree onto ext4 on the device,
#   2. fio over NBD (fio's nbd engine): sequential 1M write/read, 4 KiB random write/read.
# zbd serves `rados:zbdpool/vol`; qemu-nbd serves `rbd:rbdpool/img` through qemu's rbd driver
# (qemu-block-extra). Both become block devices the same way (`zbd attach`: nbdfuse + loop).
# Results: JSON in $BENCH_CEPH_OUT (default bench/raw/ceph-<UTC time>.json, ignored by git) and on
# stdout; details on stderr. `zbdlab bench --only ceph` runs it and keeps the JSON in its results.
#   scripts/bench-ceph.sh [SIZE (default 2G)] [RANDOM_SECONDS (default 20)]
# ZBD_SERVE_ARGS adds options to `zbd serve` (e.g. "--threads 16").
set -euo pipefail
cd "$(dirname "$0")/.."
zbd=$(realpath "${ZBD_BIN:-target/release/zbd}")
size=${1:-2G}
runtime=${2:-20}
for tool in qemu-nbd fio rbd rados nbdfuse losetup mkfs.ext4; do
  command -v "$tool" >/dev/null || { echo "bench-ceph: $tool missing (make deps-ceph)" >&2; exit 1; }
done
[[ -e /usr/lib/x86_64-linux-gnu/qemu/block-rbd.so ]] ||
  echo "bench-ceph: qemu's rbd driver may be missing (apt-get install qemu-block-extra)" >&2

# The machine's load when we start and end: numbers from a busy machine are noise.
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
work=$(mktemp -d /tmp/zbd-bench-ceph.XXXXXX)
out=${BENCH_CEPH_OUT:-bench/raw/ceph-$(date -u +%Y%m%dT%H%M%SZ).json}
mkdir -p "$(dirname "$out")"
pids=()
attached=""
mounted=""
cleanup() {
  [[ -n "$mounted" ]] && umount "$mounted" 2>/dev/null
  [[ -n "$attached" ]] && "$zbd" detach "$attached" --state-dir "$work/state" >/dev/null 2>&1
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
  bash scripts/ceph-cluster.sh stop "$work/cluster"
  rm -rf "$work"
}
trap cleanup EXIT

conf=$(bash scripts/ceph-cluster.sh start "$work/cluster" --with-mgr --osd-bytes $((12 << 30)))
export CEPH_CONF=$conf
for pool in zbdpool rbdpool; do ceph --connect-timeout 10 osd pool create "$pool" 8 >/dev/null 2>&1; done
rbd pool init rbdpool

wait_pidfile() {
  for _ in $(seq 1500); do [[ -s "$1" ]] && return 0; sleep 0.02; done
  echo "bench-ceph: $1 never appeared" >&2
  exit 1
}

start_zbd() {  # sets $socket
  "$zbd" create rados:zbdpool/vol --size "$size" --force >/dev/null
  # shellcheck disable=SC2086 # word splitting wanted
  "$zbd" serve rados:zbdpool/vol ${ZBD_SERVE_ARGS:-} --socket "$work/zbd.sock" --pidfile "$work/zbd.pid" 2>"$work/zbd.log" &
  pids+=($!)
  wait_pidfile "$work/zbd.pid"
  socket="$work/zbd.sock"
}

start_rbd() {  # sets $socket
  rbd rm rbdpool/img >/dev/null 2>&1 || true
  rbd create --size "$size" rbdpool/img
  qemu-nbd -f raw --persistent --cache=writeback --discard=unmap -k "$work/rbd.sock" --pid-file "$work/rbd.pid" \
    "rbd:rbdpool/img:conf=$conf" 2>"$work/rbd.log" &
  pids+=($!)
  wait_pidfile "$work/rbd.pid"
  socket="$work/rbd.sock"
}

stop_last() {
  local pid=${pids[-1]}
  kill "$pid" 2>/dev/null || true
  wait "$pid" || true
  unset 'pids[-1]'
}

# Bytes a pool stores: the sum of its objects' sizes, which is what `rados df` reports as the
# pool's size, read directly (the manager's statistics lag and were seen to read 0). Prints the
# total; the split by object kind (name up to the first dot) goes to stderr.
pool_bytes() {
  /usr/bin/python3 - "$1" "$CEPH_CONF" <<'PY'
import collections, sys, rados
pool, conf = sys.argv[1], sys.argv[2]
with rados.Rados(conffile=conf) as cluster, cluster.open_ioctx(pool) as io:
    kinds = collections.Counter()
    count = collections.Counter()
    for obj in io.list_objects():
        size, _ = io.stat(obj.key)
        kind = obj.key.split(".")[0]
        kinds[kind] += size
        count[kind] += 1
split = ", ".join(f"{k}: {count[k]} objects {kinds[k]} bytes" for k in sorted(kinds))
print(f"{pool}: {split}", file=sys.stderr)
print(sum(kinds.values()))
PY
}

sources=(/usr/share/doc)
for p in /usr/lib/python3.11 /usr/share/perl5; do [[ -d "$p" ]] && sources+=("$p"); done
tree_bytes=$(du -sb --apparent-size "${sources[@]}" | awk '{s+=$1} END {print s}')

# ext4 on the device, copy the tree, unmount: what does the pool store?
copy_tree() {  # name
  attached=$("$zbd" attach --socket "$socket" --state-dir "$work/state")
  mkfs.ext4 -q -F -E nodiscard "$attached"
  mounted="$work/mnt"
  mkdir -p "$mounted"
  mount "$attached" "$mounted"
  local start end
  start=$(date +%s.%N)
  cp -a "${sources[@]}" "$mounted/"
  sync -f "$mounted"
  end=$(date +%s.%N)
  umount "$mounted"; mounted=""
  "$zbd" detach "$attached" --state-dir "$work/state" >/dev/null; attached=""
  echo "$1 copy seconds: $(echo "$end - $start" | bc)" >&2
}

fio_run() {  # rw bs
  local rw=$1 bs=$2 json="$work/fio.json" timing=(--size=512M)
  [[ "$rw" == rand* ]] && timing=(--size=512M --time_based --runtime="$runtime")
  fio --name=bench --ioengine=nbd --uri="nbd+unix:///?socket=$socket" \
    --rw="$rw" --bs="$bs" --iodepth=16 --numjobs=1 "${timing[@]}" \
    --refill_buffers --buffer_compress_percentage=50 --buffer_compress_chunk=4k \
    --output-format=json --output="$json" >/dev/null 2>"$json.err"
  python3 -c "
import json; j=json.load(open('$json'))['jobs'][0]
print((j['read']['bw_bytes']+j['write']['bw_bytes'])/1e6, j['read']['iops']+j['write']['iops'])"
}

declare -A stored mbps iops
for name in zbd rbd; do
  "start_$name"
  copy_tree "$name"
  stop_last
  stored[$name]=$(pool_bytes "${name}pool")
  echo "$name pool stores ${stored[$name]} bytes for $tree_bytes bytes of files" >&2
  # The engine's view of the same bytes.
  [[ $name == zbd ]] && { "$zbd" stat rados:zbdpool/vol >&2 || true; }
  # fio on a fresh device of the same size: the tree copy above is not in the way.
  "start_$name"
  for t in "write 1M" "read 1M" "randwrite 4k" "randread 4k"; do
    set -- $t
    read -r bw io < <(fio_run "$1" "$2")
    mbps[$name-$1]=$bw; iops[$name-$1]=$io
    echo "  $name $1 $2: $bw MB/s, $io IOPS" >&2
  done
  stop_last
done

python3 - "$out" "$size" "$tree_bytes" "${stored[zbd]}" "${stored[rbd]}" \
  "${mbps[zbd-write]}" "${mbps[rbd-write]}" "${mbps[zbd-read]}" "${mbps[rbd-read]}" \
  "${iops[zbd-randwrite]}" "${iops[rbd-randwrite]}" "${iops[zbd-randread]}" "${iops[rbd-randread]}" \
  "$load_start" <<'EOF'
import json, sys
a = sys.argv[1:]
r = {
    "size": a[1], "tree_bytes": int(a[2]),
    "loadavg": {"start": a[13], "end": " ".join(open("/proc/loadavg").read().split()[:3])},
    "stored_bytes": {"zbd": int(a[3]), "rbd": int(a[4])},
    "seq_write_mbps": {"zbd": float(a[5]), "rbd": float(a[6])},
    "seq_read_mbps": {"zbd": float(a[7]), "rbd": float(a[8])},
    "rand_write_4k_iops": {"zbd": float(a[9]), "rbd": float(a[10])},
    "rand_read_4k_iops": {"zbd": float(a[11]), "rbd": float(a[12])},
}
ratio = lambda k: r[k]["zbd"] / r[k]["rbd"] if r[k]["rbd"] else float("nan")
r["ratios_zbd_over_rbd"] = {
    k: round(ratio(k), 3) for k in r if isinstance(r[k], dict) and "zbd" in r[k]
}
json.dump(r, open(a[0], "w"), indent=2)
print(json.dumps(r, indent=2))
print(f"results in {a[0]}")
EOF
