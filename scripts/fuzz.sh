#!/usr/bin/env bash
# Runs every fuzz target for FUZZ_SECONDS each (default 60) and prints executions per target.
# Installs what it needs (nightly toolchain, cargo-fuzz). Not part of `make test`.
#   FUZZ_SECONDS=600 FUZZ_TARGETS="nbd_requests" make fuzz
# The committed seeds (fuzz/corpus/T) are read, never written: new inputs go to fuzz/work/T,
# crashes to fuzz/artifacts/T. See docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"nbd_handshake nbd_requests superblock checkpoint map_page segment segment_footer metadata_page"}

if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
cargo +nightly fuzz build

mkdir -p work
summary=work/summary.txt
printf '%-14s %12s %8s %8s  %s\n' target executions seconds corpus result | tee "$summary"
failed=0
for target in $targets; do
    mkdir -p "work/$target"
    log="work/$target.log"
    result=ok
    if ! cargo +nightly fuzz run "$target" "work/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
        result="FAILED: see fuzz/$log and fuzz/artifacts/$target"
        failed=1
    fi
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    corpus=$(ls "work/$target" | wc -l)
    printf '%-14s %12s %8s %8s  %s\n' "$target" "$runs" "$seconds" "$corpus" "$result" | tee -a "$summary"
done
exit "$failed"
