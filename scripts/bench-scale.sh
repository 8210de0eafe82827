#!/usr/bin/env bash
# Scale benchmarks (issue 9), run by `make bench` after the others: peak RSS of `zbd serve` on a
# 1 TiB volume after 40,000 random 4 KiB writes over its whole range then random reads, and on a
# 64 GiB volume holding 8 GiB; time to create / stat a 1 TiB volume; reopen after kill -9 under
# write load at 1 TiB and 64 GiB; an 8 MiB map cache on 64 GiB (hit rate, map bytes read per host
# byte read, IOPS against a cache holding the whole map). fio's nbd engine with explicit data
# (half-compressible buffers, refilled).
# Usage: scripts/bench-scale.sh OUTDIR [WORKDIR]   env: ZBD_BIN; QUICK=1 skips the 8 GiB fill.
set -euo pipefail
cd "$(dirname "$0")/.."
zbd=$(realpath "${ZBD_BIN:-target/release/zbd}")
out=${1:?usage: bench-scale.sh OUTDIR [WORKDIR]}
work=${2:-$(mktemp -d /var/tmp/zbd-scale.XXXXXX)}
mkdir -p "$out" "$work"
pid=""
cleanup() {
  [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
log() { echo "$*" | tee -a "$out/scale.txt"; }

data=(--refill_buffers --buffer_compress_percentage=50 --buffer_compress_chunk=4k)

# Starts `zbd serve VOL SOCK [ARGS]` and waits until the socket answers; sets `pid` and `took`
# (seconds from start until the socket answers).
serve() {
  local vol=$1 sock=$2
  shift 2
  rm -f "$sock"
  local t0
  t0=$(date +%s.%N)
  "$zbd" serve "$vol" --socket "$sock" "$@" >"$work/serve.log" 2>&1 &
  pid=$!
  until nbdinfo --size "nbd+unix:///?socket=$sock" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log" >&2; return 1; }
    sleep 0.02
  done
  took=$(echo "$(date +%s.%N) - $t0" | bc)
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""; }
hwm() { awk '/VmHWM/ {print $2 " KiB"}' "/proc/$pid/status"; }
# fio_nbd JSON_OUT SOCK [FIO ARGS]
fio_nbd() {
  local json=$1 sock=$2
  shift 2
  fio --name=scale --ioengine=nbd --uri="nbd+unix:///?socket=$sock" --bs=4k --iodepth=8 \
    "${data[@]}" --output-format=json --output="$json" "$@" >/dev/null
}

# kill_under_load SOCK [FIO ARGS]: kill -9 the server 3 s into a random-write load.
kill_under_load() {
  local sock=$1
  shift
  fio_nbd "$work/load.json" "$sock" --rw=randwrite --time_based --runtime=5 "$@" 2>/dev/null &
  local fio=$!
  sleep 3
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
  wait "$fio" 2>/dev/null || true
}

log "== scale benchmarks $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD), noisy shared machine"

# --- create / stat of 1 TiB (1 MiB extents: the extent table is RAM per extent, docs/design.md)
for ext in 1M 32K; do
  rm -f "$work/t.zbd"
  /usr/bin/time -f "%e s %M KiB" -o "$work/time" "$zbd" create "$work/t.zbd" --size 1T --extent-size "$ext" >/dev/null
  log "create 1 TiB (extents $ext): $(cat "$work/time") (wall, peak RSS)"
  /usr/bin/time -f "%e s %M KiB" -o "$work/time" "$zbd" stat "$work/t.zbd" >/dev/null
  log "stat 1 TiB (extents $ext): $(cat "$work/time")"
done
rm -f "$work/t.zbd"

# --- 1 TiB: 40,000 random writes over the whole range, then random reads
"$zbd" create "$work/big.zbd" --size 1T --extent-size 1M >/dev/null
sock=$work/big.sock
serve "$work/big.zbd" "$sock" --map-cache 64M
log "1 TiB open: ${took} s"
fio_nbd "$out/scale-1t-write.json" "$sock" --rw=randwrite --number_ios=40000
fio_nbd "$out/scale-1t-read.json" "$sock" --rw=randread --number_ios=40000
log "1 TiB after 40k random writes + 40k random reads, --map-cache 64M: peak RSS $(hwm)"
"$zbd" stat --json "$work/big.zbd" >"$out/scale-1t-stat.json" || true
kill_under_load "$sock"
serve "$work/big.zbd" "$sock" --map-cache 64M
log "1 TiB reopen after kill -9 under write load: ${took} s (until the socket answers)"
stop
rm -f "$work/big.zbd"

# --- 64 GiB holding 8 GiB
"$zbd" create "$work/mid.zbd" --size 64G >/dev/null
sock=$work/mid.sock
serve "$work/mid.zbd" "$sock" --map-cache 64M
if [[ "${QUICK:-0}" != 1 ]]; then
  fio_nbd "$out/scale-64g-fill.json" "$sock" --rw=write --size=8g --bs=1m --iodepth=4
fi
fio_nbd "$out/scale-64g-read.json" "$sock" --rw=randread --number_ios=40000
log "64 GiB with 8 GiB data after random reads, --map-cache 64M: peak RSS $(hwm)"
kill_under_load "$sock" --size=8g
serve "$work/mid.zbd" "$sock" --map-cache 8M
log "64 GiB reopen after kill -9 under write load: ${took} s"
# --- an 8 MiB map cache (the map of 64 GiB is 2 x 64 MiB): random reads over the data
fio_nbd "$out/scale-64g-8m-read.json" "$sock" --rw=randread --number_ios=40000 --size=8g
"$zbd" stat --json "$work/mid.zbd" >"$out/scale-64g-8m-stat.json"
python3 - "$out/scale-64g-8m-stat.json" "$out/scale-64g-8m-read.json" <<'EOF' | tee -a "$out/scale.txt"
import json, sys
s = json.load(open(sys.argv[1]))
r = json.load(open(sys.argv[2]))["jobs"][0]["read"]
m = s["map_cache"]
look = m["hits"] + m["faults"]
print(f"64 GiB, --map-cache 8M, 40k random 4 KiB reads over 8 GiB: map hit rate "
      f"{m['hits'] / max(look, 1):.3f}, map bytes read {m['bytes_read']} for "
      f"{s['counters']['host_bytes_read']} host bytes read "
      f"({m['bytes_read'] / max(s['counters']['host_bytes_read'], 1):.3f} per host byte), "
      f"{r['iops']:.0f} IOPS")
EOF
stop
# --- the same reads with a cache that holds the whole map in use (warmed by the same reads
# first: fio repeats its random offsets), for the paper's Fig. 13 comparison
serve "$work/mid.zbd" "$sock" --map-cache 128M
fio_nbd "$work/warm.json" "$sock" --rw=randread --number_ios=40000 --size=8g
fio_nbd "$out/scale-64g-full-read.json" "$sock" --rw=randread --number_ios=40000 --size=8g
python3 - "$out/scale-64g-8m-read.json" "$out/scale-64g-full-read.json" <<'EOF' | tee -a "$out/scale.txt"
import json, sys
small, full = (json.load(open(p))["jobs"][0]["read"]["iops"] for p in sys.argv[1:3])
print(f"64 GiB, --map-cache 128M (whole map resident, warmed), the same reads: {full:.0f} IOPS; "
      f"8M cache / whole map: {small / full:.2f}x")
EOF
stop

# --- 16 TiB with inline dedup (issue 27's RAM goal: under 512 MiB RSS under scattered writes
# and reads): the default extent size (512 KiB: 31.5 M extents, 9 bytes each resident), a 15 TiB
# data area (ext4 caps a file at 16 TiB), the default 64 MiB dedup index and map cache; rounds of random 4 KiB writes over the whole range (half of
# them duplicates, half-compressible; each round's own seed, so rounds do not repeat each other)
# and random reads, RSS after each round.
"$zbd" create "$work/huge.zbd" --size 16T --capacity 15T --max-size 16T --max-capacity 15T \
  --metadata-pages --dedup on >/dev/null 2>&1
sock=$work/huge.sock
serve "$work/huge.zbd" "$sock"
log "16 TiB, dedup on, open: ${took} s, RSS $(awk '/VmRSS/ {print $2 " KiB"}' "/proc/$pid/status")"
rounds=${RSS_ROUNDS:-4}
for round in $(seq 1 "$rounds"); do
  fio_nbd "$out/scale-16t-write-$round.json" "$sock" --rw=randwrite --iodepth=16 \
    --random_generator=tausworthe64 --number_ios=200000 --dedupe_percentage=50 \
    --randseed="$round"

  fio_nbd "$out/scale-16t-read-$round.json" "$sock" --rw=randread --iodepth=16 \
    --random_generator=tausworthe64 --number_ios=50000
  log "16 TiB, dedup on, after round $round of 200k random writes (50 % duplicates) + 50k random reads: RSS $(awk '/VmRSS/ {print $2 " KiB"}' "/proc/$pid/status")"
done
log "16 TiB, dedup on, peak RSS over $rounds rounds: $(hwm)"
"$zbd" stat --json "$work/huge.zbd" >"$out/scale-16t-stat.json"
python3 - "$out/scale-16t-stat.json" "$out"/scale-16t-write-*.json <<'EOF2' | tee -a "$out/scale.txt"
import json, sys
s = json.load(open(sys.argv[1]))
d = s["dedup_index"] or {}
iops = [json.load(open(p))["jobs"][0]["write"]["iops"] for p in sys.argv[2:]]
print(f"16 TiB, dedup on: dedup ratio {s['dedup_ratio']:.2f}:1, index {d.get('budget_bytes', 0) >> 20} MiB, "
      f"hit rate {d.get('hit_rate', 0):.3f} (declared 0.5), {d.get('rejected', 0)} candidates differed; "
      f"metadata RAM {s['metadata_ram_bytes'] >> 20} MiB; write IOPS per round {[round(i) for i in iops]}")
EOF2
stop
rm -f "$work/huge.zbd"
