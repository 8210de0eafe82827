#!/usr/bin/env bash
# Cost of the metrics endpoint (issue 29): fio 4 KiB random writes at iodepth 16 (nbd engine,
# 2:1 data, ending with a flush) on `zbd serve` without --metrics and with --metrics on
# loopback scraped every second by curl, alternating per round (off on, on off, ...) on a fresh
# volume each time. Summary: median IOPS of each arm, on/off per round and its median
# (goal >= 0.98x).
#
#   scripts/bench-metrics.sh OUTDIR
#
# env: ZBD_BIN (default target/release/zbd), MET_ROUNDS (8), MET_SECONDS per run (15),
#      MET_DIR where the volumes live (/var/tmp).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
zbd=$(realpath "${ZBD_BIN:-$here/target/release/zbd}")
out=${1:?usage: bench-metrics.sh OUTDIR}
rounds=${MET_ROUNDS:-8}
secs=${MET_SECONDS:-15}
[[ -x $zbd ]] || { echo "bench-metrics: $zbd missing: run cargo build --release" >&2; exit 1; }
command -v fio >/dev/null || { echo "bench-metrics: fio not installed (make deps)" >&2; exit 1; }
command -v curl >/dev/null || { echo "bench-metrics: curl not installed" >&2; exit 1; }
mkdir -p "$out/raw/metrics"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${MET_DIR:-/var/tmp}/zbd-metrics.XXXXXX")
pid="" scraper=""
stop_all() { # always succeeds: it runs in the EXIT trap under set -e
    if [[ -n $scraper ]]; then
        kill "$scraper" 2>/dev/null || true
        wait "$scraper" 2>/dev/null || true
        scraper=""
    fi
    if [[ -n $pid ]]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        pid=""
    fi
}
trap 'stop_all; rm -rf "$work"' EXIT

one() { # ARM ROUND
    local arm=$1 round=$2 vol=$work/vol.zbd sock=$work/nbd.sock log=$work/server-$1-$2.log
    rm -f "$vol" "$sock"
    "$zbd" create "$vol" --size 1G --codec lz4 >/dev/null
    local extra=()
    [[ $arm == on ]] && extra=(--metrics 127.0.0.1:0)
    "$zbd" serve "$vol" --socket "$sock" "${extra[@]}" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
    [[ -S $sock ]] || { echo "bench-metrics: server did not start" >&2; exit 1; }
    if [[ $arm == on ]]; then
        local addr
        addr=$(sed -n 's|.*metrics on http://\([^/]*\)/.*|\1|p' "$log" | head -1)
        [[ -n $addr ]] || { echo "bench-metrics: no metrics address in $log" >&2; exit 1; }
        # The load under test: one scrape a second, as Prometheus would.
        (while curl -sf "http://$addr/metrics" >/dev/null; do sleep 1; done) &
        scraper=$!
    fi
    fio --output-format=json --output="$out/raw/metrics/$arm-$round.json" \
        --ioengine=nbd --uri="nbd+unix:///?socket=$sock" --name=w --rw=randwrite --bs=4k \
        --iodepth=16 --size=1G --time_based --runtime="$secs" --end_fsync=1 \
        --refill_buffers=1 --buffer_compress_percentage=50 --buffer_compress_chunk=4k >/dev/null
    stop_all
}

for ((r = 1; r <= rounds; r++)); do
    order=(off on)
    ((r % 2 == 0)) && order=(on off)
    for arm in "${order[@]}"; do
        echo "== metrics round $r/$rounds: $arm"
        one "$arm" "$r"
    done
done

python3 - "$out" "$rounds" "$secs" <<'PY'
import json, statistics, sys
from pathlib import Path
out, rounds, secs = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
raw = out / "raw" / "metrics"
iops = {arm: [json.loads((raw / f"{arm}-{r}.json").read_text())["jobs"][0]["write"]["iops"]
              for r in range(1, rounds + 1)] for arm in ("off", "on")}
ratios = [on / off for on, off in zip(iops["on"], iops["off"])]
summary = {"iops": iops, "on_over_off": ratios, "median_ratio": statistics.median(ratios),
           "min_ratio": min(ratios), "max_ratio": max(ratios)}
(out / "metrics.json").write_text(json.dumps(summary, indent=2))
text = [
    f"fio 4 KiB random writes, iodepth 16, {secs} s per run, 2:1 data, fresh 1 GiB volume per run; "
    f"{rounds} rounds alternating the order. Goal: on/off >= 0.98.",
    "",
    "| arm | median IOPS |",
    "|---|---|",
    f"| without --metrics | {statistics.median(iops['off']):.0f} |",
    f"| --metrics, scraped every second | {statistics.median(iops['on']):.0f} |",
    "",
    f"on/off per round: {', '.join(f'{r:.3f}' for r in ratios)}; median {summary['median_ratio']:.3f} "
    f"(range {summary['min_ratio']:.3f}-{summary['max_ratio']:.3f}).",
]
(out / "metrics.md").write_text("\n".join(text) + "\n")
print("\n".join(text))
PY
