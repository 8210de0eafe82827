#!/usr/bin/env bash
# `make bench`: benchmarks whose results are written down in docs/benchmarks.md.
set -euo pipefail
zbd=${ZBD_BIN:-target/release/zbd}

echo "== zbd bench codec (built-in mixed sample)"
"$zbd" bench codec
echo "== zbd bench engine"
"$zbd" bench engine --size 256M
echo "== heavy engine tests (ignored in make test)"
cargo test --release -p zbd-core -- --ignored
