#!/usr/bin/env bash
# `make demo`: the quick study. Plain ext4, the transport baseline (ext4 on nbdkit file via the same
# NBD path as zbd), btrfs lzo / zstd:1 beside ext4 on zbd lz4 / zstd:1, each on loop devices zbdlab
# creates and removes itself; an IOzone-style matrix on data of declared
# compressibility plus a copy of a real file tree; then the comparison report (ext4 = baseline).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${DEMO_OUT:-demo-out}
rm -rf "$out"
.venv/bin/zbdlab run lab/studies/quick.toml -o "$out"
echo
echo "Results: $out/runs.csv (one row per run), report: $out/report/index.html"
