#!/usr/bin/env bash
# A/B of two zbd binaries on a RADOS volume, alternating rounds on one throwaway cluster: 512 MiB
# sequential 1 MiB writes (a fresh volume each round) or reads (one volume, written once by A),
# fio's nbd engine at iodepth 16, 2:1 data. Prints MB/s and the CPU ticks `zbd serve` used.
#   scripts/bench-rados-ab.sh read|write ZBD_A ZBD_B [ROUNDS]
# CREATE_ARGS_A / CREATE_ARGS_B add options to `zbd create` (e.g. "--extent-size 256K").
set -euo pipefail
cd "$(dirname "$0")/.."
mode=$1 a=$(realpath "$2") b=$(realpath "$3") rounds=${4:-3}
[[ $mode == read || $mode == write ]] || { echo "usage: $0 read|write ZBD_A ZBD_B [ROUNDS]" >&2; exit 2; }
work=$(mktemp -d /tmp/zbd-rados-ab.XXXXXX)
spid=""
cleanup() {
  [[ -n "$spid" ]] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null
  bash scripts/ceph-cluster.sh stop "$work/cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
CEPH_CONF=$(bash scripts/ceph-cluster.sh start "$work/cluster" --with-mgr --osd-bytes $((6 << 30)))
export CEPH_CONF
ceph --connect-timeout 10 osd pool create zbdpool 8 >/dev/null 2>&1
declare -A create_args=([$a]="${CREATE_ARGS_A:-}" [$b]="${CREATE_ARGS_B:-}")
serve() {
  "$1" serve rados:zbdpool/vol --socket "$work/s.sock" --pidfile "$work/s.pid" 2>"$work/serve.log" &
  spid=$!
  for _ in $(seq 1500); do [[ -S "$work/s.sock" ]] && return 0; sleep 0.02; done
  echo "bench-rados-ab: server never listened (see $work/serve.log)" >&2; exit 1
}
stop() { kill "$spid"; wait "$spid" 2>/dev/null || true; spid=""; rm -f "$work/s.sock" "$work/s.pid"; }
fio_run() {  # rw
  fio --name=ab --ioengine=nbd --uri="nbd+unix:///?socket=$work/s.sock" --rw="$1" --bs=1M \
    --iodepth=16 --size=512M --refill_buffers --buffer_compress_percentage=50 \
    --buffer_compress_chunk=4k --output-format=json --output="$work/fio.json" >/dev/null
}
ticks() { awk '{print $14 + $15}' "/proc/$spid/stat"; }
create() {  # binary
  # shellcheck disable=SC2086 # word splitting wanted
  "$1" create rados:zbdpool/vol --size 1G --force ${create_args[$1]} >/dev/null
}
if [[ $mode == read ]]; then
  create "$a"; serve "$a"; fio_run write; stop
fi
for _ in $(seq "$rounds"); do
  for bin in "$a" "$b"; do
    [[ $mode == write ]] && create "$bin"
    serve "$bin"
    before=$(ticks)
    fio_run "$mode"
    used=$(( $(ticks) - before ))
    mbps=$(python3 -c "import json; j = json.load(open('$work/fio.json'))['jobs'][0]; print(round(j['$mode']['bw_bytes'] / 1e6))")
    echo "$bin $mode $mbps MB/s, serve CPU $used ticks, load $(cut -d' ' -f1 /proc/loadavg)"
    stop
  done
done
