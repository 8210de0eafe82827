#!/usr/bin/env bash
# Read latency behind checkpoints and the cleaner (issue 9): p99 and p99.9 of 4 KiB random reads
# at iodepth 1 (fio's nbd engine on `zbd serve`, Unix socket) on an idle volume, then while a
# writer overwrites at random (2:1 data, a flush every 64 writes) on a volume about 80 % live, so
# that checkpoints come every 32 MiB of extents and the cleaner runs all along.
# And the cost of a flush (issue 26): "4 KiB random write + flush" at iodepth 1 (every write
# followed by an NBD FLUSH), its IOPS, flush latency and write amplification (storage bytes
# written / host bytes written during the phase, from `zbd stat` before and after).
# Per round and binary: a fresh volume (512 MiB logical, 320 MiB data area, lz4), filled once
# sequentially, then the flush phase, the idle phase and the loaded phase. Binaries alternate
# (A B, B A, ...), and the summary gives medians over rounds and loaded/idle ratios (goal: p99.9
# within 10x).
#
#   scripts/bench-latency.sh OUTDIR [BASE_ZBD]
#
# env: ZBD_BIN (default target/release/zbd), LAT_ROUNDS (3), LAT_SECONDS per phase (20),
#      LAT_DIR where the volumes live (/var/tmp).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
zbd=$(realpath "${ZBD_BIN:-$here/target/release/zbd}")
out=${1:?usage: bench-latency.sh OUTDIR [BASE_ZBD]}
base=${2:-}
rounds=${LAT_ROUNDS:-3}
secs=${LAT_SECONDS:-20}
[[ -x $zbd ]] || { echo "bench-latency: $zbd missing: run cargo build --release" >&2; exit 1; }
[[ -z $base || -x $base ]] || { echo "bench-latency: base binary $base is not executable" >&2; exit 1; }
command -v fio >/dev/null || { echo "bench-latency: fio not installed (make deps)" >&2; exit 1; }
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "bench-latency: fio has no nbd engine" >&2; exit 1; }
mkdir -p "$out/raw/latency"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${LAT_DIR:-/var/tmp}/zbd-latency.XXXXXX")
pid=""
stop_server() {
    if [[ -n $pid ]]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        pid=""
    fi
}
trap 'stop_server; rm -rf "$work"' EXIT

data=(--refill_buffers=1 --buffer_compress_percentage=50 --buffer_compress_chunk=4k)
fio_job() { # NAME ARGS... -> fio JSON in raw/latency/NAME.json
    local name=$1
    shift
    fio --output-format=json --output="$out/raw/latency/$name.json" "$@" >/dev/null
}

one() { # ARM BINARY ROUND
    local arm=$1 bin=$2 round=$3
    local vol=$work/vol.zbd sock=$work/nbd.sock
    rm -f "$vol" "$sock"
    "$bin" create "$vol" --size 512M --capacity 320M --codec lz4 >/dev/null
    "$bin" serve "$vol" --socket "$sock" >"$work/server-$arm-$round.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
    [[ -S $sock ]] || { echo "bench-latency: $arm server did not start" >&2; exit 1; }
    local common=(--ioengine=nbd --uri="nbd+unix:///?socket=$sock" --bs=4k)
    fio_job "fill-$arm-$round" "${common[@]}" --name=fill --rw=write --bs=1M --iodepth=4 \
        --size=512M --end_fsync=1 "${data[@]}"
    "$bin" stat --json "$vol" >"$out/raw/latency/flush-before-$arm-$round.json"
    fio_job "flush-$arm-$round" "${common[@]}" --name=flusher --rw=randwrite --iodepth=1 --fsync=1 \
        --time_based --runtime="$secs" --percentile_list=50:99:99.9 "${data[@]}"
    "$bin" stat --json "$vol" >"$out/raw/latency/flush-after-$arm-$round.json"
    fio_job "idle-$arm-$round" "${common[@]}" --name=reader --rw=randread --iodepth=1 \
        --time_based --runtime="$secs" --percentile_list=99:99.9
    fio_job "loaded-$arm-$round" "${common[@]}" --time_based --runtime="$secs" \
        --percentile_list=99:99.9 \
        --name=reader --rw=randread --iodepth=1 \
        --name=writer --rw=randwrite --bs=64k --iodepth=4 --fsync=64 \
        "${data[@]}"
    "$bin" stat --json "$vol" >"$out/raw/latency/stat-$arm-$round.json" 2>/dev/null || true
    stop_server
}

arms=(this)
[[ -n $base ]] && arms+=(base)
for ((r = 1; r <= rounds; r++)); do
    order=("${arms[@]}")
    ((r % 2 == 0)) && order=($(printf '%s\n' "${arms[@]}" | tac))
    for arm in "${order[@]}"; do
        bin=$zbd
        [[ $arm == base ]] && bin=$base
        echo "== latency round $r/$rounds: $arm ($bin)"
        one "$arm" "$bin" "$r"
    done
done

python3 - "$out" "$rounds" "$secs" "${arms[@]}" <<'EOF'
import json, statistics, sys
from pathlib import Path
out, rounds, secs, arms = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
raw = out / "raw" / "latency"

def pct(path, q):
    for job in json.loads(path.read_text())["jobs"]:
        if job["jobname"] == "reader":
            return job["read"]["clat_ns"]["percentile"][q] / 1e3  # microseconds
    raise SystemExit(f"bench-latency: no reader job in {path}")

def flush_phase(arm, r):
    job = json.loads((raw / f"flush-{arm}-{r}.json").read_text())["jobs"][0]
    sync = job["sync"]["lat_ns"]["percentile"]
    before, after = (json.loads((raw / f"flush-{w}-{arm}-{r}.json").read_text())["counters"] for w in ("before", "after"))
    delta = {k: after[k] - before[k] for k in after}
    stored = delta["data_bytes_written"] + delta["metadata_bytes_written"] + delta["cleaner_bytes_written"]
    return {
        "write_iops": job["write"]["iops"],
        "flush_p50_us": sync["50.000000"] / 1e3,
        "flush_p99_us": sync["99.000000"] / 1e3,
        "write_amplification": stored / max(1, delta["host_bytes_written"]),
    }

rows, flush_rows, summary = [], [], {}
for arm in arms:
    s = {}
    phases = [flush_phase(arm, r) for r in range(1, rounds + 1)]
    for key in phases[0]:
        s[f"flush_{key}"] = statistics.median(p[key] for p in phases)
        s[f"flush_{key}_rounds"] = [p[key] for p in phases]
    flush_rows.append(
        f"| {arm} | {s['flush_write_iops']:.0f} | {s['flush_flush_p50_us']:.0f} | {s['flush_flush_p99_us']:.0f} "
        f"| {s['flush_write_amplification']:.2f} |"
    )
    for phase in ("idle", "loaded"):
        for q, name in (("99.000000", "p99"), ("99.900000", "p99.9")):
            vals = [pct(raw / f"{phase}-{arm}-{r}.json", q) for r in range(1, rounds + 1)]
            s[f"{phase}_{name}_us"] = statistics.median(vals)
            s[f"{phase}_{name}_us_rounds"] = vals
    s["p99.9_loaded_over_idle"] = s["loaded_p99.9_us"] / s["idle_p99.9_us"]
    summary[arm] = s
    rows.append(
        f"| {arm} | {s['idle_p99_us']:.0f} | {s['idle_p99.9_us']:.0f} | {s['loaded_p99_us']:.0f} "
        f"| {s['loaded_p99.9_us']:.0f} | {s['p99.9_loaded_over_idle']:.1f} |"
    )
(out / "latency.json").write_text(json.dumps(summary, indent=2))
text = [
    "# Read latency behind checkpoints and the cleaner (issue 9)",
    "",
    f"4 KiB random reads at iodepth 1 (fio nbd engine), medians of {rounds} alternating rounds, "
    "microseconds. Loaded: a random 64 KiB writer (iodepth 4, flush every 64 writes, 2:1 data) "
    "on a volume about 80 % live (512 MiB logical, 320 MiB data area). Goal: loaded p99.9 within "
    "10x of idle.",
    "",
    "| binary | idle p99 | idle p99.9 | loaded p99 | loaded p99.9 | loaded/idle p99.9 |",
    "|---|---|---|---|---|---|",
    *rows,
    "",
    "## 4 KiB random write + flush (issue 26)",
    "",
    f"fio nbd engine, iodepth 1, an NBD FLUSH after every write (2:1 data), {secs} s per round on the "
    f"freshly filled volume; medians of {rounds} rounds. Write amplification: storage bytes written "
    "(data, metadata, cleaner) / host bytes written during the phase.",
    "",
    "| binary | write+flush IOPS | flush p50 us | flush p99 us | write amplification |",
    "|---|---|---|---|---|",
    *flush_rows,
]
(out / "latency.md").write_text("\n".join(text) + "\n")
print("\n".join(text))
EOF
