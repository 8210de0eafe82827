#!/usr/bin/env bash
# `make bench`: benchmarks whose results are written down in docs/benchmarks.md.
set -euo pipefail
zbd=${ZBD_BIN:-target/release/zbd}
"$zbd" --help
