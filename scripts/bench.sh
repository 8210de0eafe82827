#!/usr/bin/env bash
# `make bench`: benchmarks whose results are written down in docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
zbd=${ZBD_BIN:-target/release/zbd}
out=target/bench
mkdir -p "$out"

echo "== zbd bench codec (built-in mixed sample)"
"$zbd" bench codec
echo "== zbd bench engine"
"$zbd" bench engine --size 256M
echo "== zbd bench cleaner (time series in $out/cleaner-series.csv)"
"$zbd" bench cleaner --capacity 64M --factor 4 --csv "$out/cleaner-series.csv"
echo "== heavy engine tests (ignored in make test)"
cargo test --release -p zbd-core -- --ignored --skip make_v1_fixture
