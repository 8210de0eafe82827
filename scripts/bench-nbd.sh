#!/usr/bin/env bash
# NBD benchmarks (results go in docs/benchmarks.md, "NBD" section):
#   1. fio's nbd engine against `zbd serve` (lz4 and none) and against `nbdkit file` on a plain
#      image in the same directory (same disk): 1 MiB sequential write and read, 4 KiB random
#      read and write at iodepth 16, two jobs (two connections); zbd/nbdkit ratios. Each test
#      runs REPS times, the targets interleaved (so background load hits all alike); medians.
#   2. Space savings of a real file tree copied onto ext4 on a served, attached volume.
# Usage: scripts/bench-nbd.sh [--quick]
#   env: ZBD_BIN, BENCH_DIR, BENCH_NBD_SIZE, BENCH_NBD_RUNTIME, BENCH_NBD_REPS
set -euo pipefail

zbd=$(realpath "${ZBD_BIN:-target/release/zbd}")
size=${BENCH_NBD_SIZE:-1G}          # device size; sequential passes cover all of it
runtime=${BENCH_NBD_RUNTIME:-10}    # seconds per random test
reps=${BENCH_NBD_REPS:-3}
if [[ "${1:-}" == "--quick" ]]; then
  size=256M
  runtime=3
  reps=1
fi
for tool in fio nbdkit nbdfuse losetup mkfs.ext4 python3; do
  command -v "$tool" >/dev/null || { echo "bench-nbd: $tool missing (run scripts/install-deps.sh)" >&2; exit 1; }
done
[[ -x "$zbd" ]] || { echo "bench-nbd: no zbd binary at $zbd (cargo build --release)" >&2; exit 1; }

# Same disk for every target: /var/tmp is on disk (not tmpfs) here; override with BENCH_DIR.
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/zbd-bench-nbd.XXXXXX")
pids=()
mounted=""
attached=""
cleanup() {
  [[ -n "$mounted" ]] && umount "$mounted" 2>/dev/null || true
  [[ -n "$attached" ]] && "$zbd" detach "$attached" --state-dir "$work/state" >/dev/null 2>&1 || true
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 500); do kill -0 "$pid" 2>/dev/null || break; sleep 0.02; done
  done
  rm -rf "$work"
}
trap cleanup EXIT

# Waits (bounded) for a pidfile to appear.
wait_pidfile() {
  for _ in $(seq 1500); do [[ -s "$1" ]] && return 0; sleep 0.02; done
  echo "bench-nbd: $1 never appeared" >&2
  exit 1
}

start_zbd() {  # codec|fs; sets $socket (not a $(...) subshell: the server must be our child)
  local codec=${1/fs/lz4} dir="$work/zbd-$1"
  mkdir -p "$dir"
  "$zbd" create "$dir/vol.zbd" --size "$size" --codec "$codec" >/dev/null
  "$zbd" serve "$dir/vol.zbd" --socket "$dir/sock" --pidfile "$dir/pid" 2>"$dir/serve.log" &
  pids+=($!)
  wait_pidfile "$dir/pid"
  socket="$dir/sock"
}

start_nbdkit() {  # sets $socket
  local dir="$work/nbdkit"
  mkdir -p "$dir"
  truncate -s "$size" "$dir/disk.img"
  nbdkit -f -U "$dir/sock" -P "$dir/pid" file "file=$dir/disk.img" 2>"$dir/nbdkit.log" &
  pids+=($!)
  wait_pidfile "$dir/pid"
  socket="$dir/sock"
}

stop_last() {
  local pid=${pids[-1]}
  kill "$pid"
  wait "$pid" || { echo "bench-nbd: server $pid did not exit cleanly" >&2; exit 1; }
  unset 'pids[-1]'
}

# fio on one socket: prints "MB/s IOPS". Half-compressible, refilled buffers: fio's default
# buffers compress about 11:1 and would flatter compression.
fio_run() {  # socket rw bs output.json
  local socket=$1 rw=$2 bs=$3 out=$4 half
  half=$(python3 -c "import re,sys; s='$size'; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]]//2 if s[-1] in m else int(s)//2)")
  local timing=(--size="$half")
  [[ "$rw" == rand* ]] && timing+=(--time_based --runtime="$runtime")
  fio --name=bench --ioengine=nbd --uri="nbd+unix:///?socket=$socket" \
    --rw="$rw" --bs="$bs" --iodepth=16 --numjobs=2 --offset_increment="$half" "${timing[@]}" \
    --refill_buffers --buffer_compress_percentage=50 --buffer_compress_chunk=4k \
    --group_reporting --output-format=json --output="$out" >/dev/null 2>"$out.err" || true
  python3 - "$out" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
bw = (job["read"]["bw_bytes"] + job["write"]["bw_bytes"]) / 1e6
iops = job["read"]["iops"] + job["write"]["iops"]
print(f"{bw:.0f} {iops:.0f} {job['error']}")
EOF
}

tests=("write 1M" "read 1M" "randread 4k" "randwrite 4k")
declare -A sockets
echo "bench-nbd: size $size, random tests ${runtime}s, $reps repetitions, in $work" >&2
for rep in $(seq "$reps"); do
  # Fresh devices every repetition: each sees the same history (empty, filled sequentially, read,
  # then random reads and writes), so repetitions measure the same thing.
  rm -rf "$work/nbdkit" "$work/zbd-lz4" "$work/zbd-none"
  start_nbdkit; sockets[nbdkit]=$socket
  start_zbd lz4; sockets[zbd-lz4]=$socket
  start_zbd none; sockets[zbd-none]=$socket
  for t in "${tests[@]}"; do
    set -- $t
    for name in nbdkit zbd-lz4 zbd-none; do
      out="$work/fio-$name-$1-$rep.json"
      line=$(fio_run "${sockets[$name]}" "$1" "$2" "$out")
      echo "$line" >>"$work/result-$name-$1"
      read -r mbps iops errno <<<"$line"
      echo "  [$rep] $name $1 $2: $mbps MB/s, $iops IOPS" >&2
      [[ "$errno" == 0 ]] || echo "  (fio error $errno: $(grep -m1 error "$out.err"))" >&2
    done
  done
  lz4_stat=$("$zbd" stat --json "$work/zbd-lz4/vol.zbd")
  stop_last; stop_last; stop_last
done

# Filesystem copy: ext4 on an attached lz4 volume.
start_zbd fs
fs_volume="$work/zbd-fs/vol.zbd"
attached=$("$zbd" attach --socket "$socket" --state-dir "$work/state")
mkfs.ext4 -q -F "$attached"
mounted="$work/mnt"
mkdir -p "$mounted"
mount "$attached" "$mounted"
sources=(/usr/share/doc)
for p in /usr/lib/python3.11 /usr/share/perl5; do [[ -d "$p" ]] && sources+=("$p"); done
copy_start=$(date +%s.%N)
cp -a "${sources[@]}" "$mounted/"
sync -f "$mounted"
copy_end=$(date +%s.%N)
tree_bytes=$(du -sb --apparent-size "${sources[@]}" | awk '{s+=$1} END {print s}')
fs_stat=$("$zbd" stat --json "$fs_volume")
umount "$mounted"; mounted=""
"$zbd" detach "$attached" --state-dir "$work/state"; attached=""
stop_last

python3 - "$size" "$runtime" "$reps" "$work" "$tree_bytes" "$copy_start" "$copy_end" "${sources[*]}" \
  "$fs_stat" "$lz4_stat" <<'EOF'
import json, statistics, sys
size, runtime, reps, work, tree, t0, t1, sources, fs, lz4 = sys.argv[1:]
tree, t0, t1, fs, lz4 = int(tree), float(t0), float(t1), json.loads(fs), json.loads(lz4)


def median(name, test):
    rows = [tuple(map(float, line.split())) for line in open(f"{work}/result-{name}-{test}")]
    errors = sum(1 for row in rows if row[2])
    return statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows), errors


tests = [("write", "1 MiB seq write"), ("read", "1 MiB seq read"),
         ("randread", "4 KiB rand read"), ("randwrite", "4 KiB rand write")]
print(f"fio `ioengine=nbd`, iodepth 16, 2 jobs, device {size}, random tests {runtime} s, "
      f"half-compressible refilled buffers; median of {reps} interleaved runs, each on fresh devices.\n")
print("| test | nbdkit file | zbd lz4 | zbd none | lz4 / nbdkit | none / nbdkit |")
print("|---|---|---|---|---|---|")
for i, (test, label) in enumerate(tests):
    cells = {n: median(n, test) for n in ("nbdkit", "zbd-lz4", "zbd-none")}
    pick = 0 if i < 2 else 1

    def show(v):
        text = f"{v[0]:.0f} MB/s" if i < 2 else f"{v[1] / 1000:.1f}k IOPS"
        return text + (f" ({v[2]} runs failed)" if v[2] else "")

    kit = cells["nbdkit"][pick]
    print(f"| {label} | {show(cells['nbdkit'])} | {show(cells['zbd-lz4'])} | "
          f"{show(cells['zbd-none'])} | {cells['zbd-lz4'][pick] / kit:.2f} | "
          f"{cells['zbd-none'][pick] / kit:.2f} |")
print(f"\nzbd lz4 after the fio runs: savings {lz4['savings_pct']:.1f} %, "
      f"write amplification {lz4['write_amplification']:.2f}.\n")
print(f"Filesystem copy (ext4 on `zbd attach`, lz4): {sources}, {tree / 1e6:.0f} MB of files, "
      f"copied and synced in {t1 - t0:.1f} s; logical in use {fs['logical_bytes_in_use'] / 1e6:.0f} MB, "
      f"physical live {fs['physical_bytes_live'] / 1e6:.0f} MB: savings {fs['savings_pct']:.1f} % "
      f"(ratio {fs['compression_ratio']:.2f}:1), write amplification {fs['write_amplification']:.2f}.")
EOF
