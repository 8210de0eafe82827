#!/usr/bin/env bash
# `make bench` (as root): `zbdlab bench`, the same-run ratios in alternating rounds with their
# intervals and targets (engine, NBD fast and slow disk, filesystems), written with raw fio JSON
# under bench/results/<date>-<commit>/; then what is not a ratio (codec table, write amplification,
# cleaner, the heavy engine tests), kept in the same directory under raw/other/, and the read
# latency behind checkpoints and the cleaner (scripts/bench-latency.sh: latency.md, raw/latency/).
# Usage: scripts/bench.sh [--quick] [--only GROUP]... (any `zbdlab bench` option; --quick and
#   --only run the ratios alone). env: ZBD_BIN (the binary measured), BENCH_OUT (results dir),
#   BASE_ZBD (a second binary for the latency before/after).
set -euo pipefail
cd "$(dirname "$0")/.."
zbd=$(realpath "${ZBD_BIN:-target/release/zbd}")
[[ -x "$zbd" ]] || { echo "bench: no zbd binary at $zbd (cargo build --release)" >&2; exit 1; }
out=${BENCH_OUT:-bench/results/$(date -u +%F)-$(git rev-parse --short HEAD)}
# A failed group (exit 1, named on stderr) still leaves the rest to run; its status is the end's.
status=0
.venv/bin/zbdlab bench --zbd "$zbd" -o "$out" "$@" || status=$?
[[ $status == 130 ]] && exit 130  # interrupted: stop here
for arg in "$@"; do
  [[ "$arg" == --quick || "$arg" == --only* ]] && exit "$status"
done
other=$out/raw/other
mkdir -p "$other"
echo "== zbd bench codec (built-in mixed sample)"
"$zbd" bench codec | tee "$other/codec.txt"
echo "== zbd bench engine (write amplification of 4 KiB write + flush)"
"$zbd" bench engine --size 256M | tee "$other/engine.txt"
echo "== zbd bench cleaner"
"$zbd" bench cleaner --capacity 64M --factor 4 --csv "$other/cleaner-series.csv" | tee "$other/cleaner.txt"
echo "== scale: paged map, open time, RSS at 1 TiB and 64 GiB (scripts/bench-scale.sh)"
ZBD_BIN="$zbd" scripts/bench-scale.sh "$other/scale"
echo "== read latency behind checkpoints and the cleaner"
ZBD_BIN=$zbd scripts/bench-latency.sh "$out" ${BASE_ZBD:+"$(realpath "$BASE_ZBD")"}
echo "== space savings vs btrfs and ZFS, 4 KiB reads per compression unit size (docs/savings.md)"
SAVINGS_ZFS=${SAVINGS_ZFS:-1} SAVINGS_UNITS="4K 8K 16K" bash scripts/bench-savings.sh "$other/savings" | tee "$other/savings.txt"
for u in 4K 16K; do
  echo "== engine tests with $u units instead of the default 8 KiB"
  ZBD_TEST_UNIT_SIZE=$u cargo test --release -p zbd-core --test model --test durability --test engine -- \
    sequential:: crash:: faults::beyond_power_loss:: volume:: read::cache:: 2>&1 | tee "$other/tests-$u-units.txt"
done
echo "== heavy engine tests (ignored in make test)"
cargo test --release -p zbd-core -- --ignored --skip make_v1_fixture 2>&1 | tee "$other/heavy-tests.txt"
exit "$status"
