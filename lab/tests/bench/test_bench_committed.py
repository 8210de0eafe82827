"""What bench/results may hold: per run summary.md, figures.json and environment.json (and figures
drawn as PNG/SVG), in a directory named <date>-<commit>-<group>; the raw tool output stays out of git
(bench/raw/). The whole folder stays small enough to clone without noticing."""

from __future__ import annotations

import re

from zbdlab.app import repo_root
from zbdlab.bench.report import RESULT_FILES

COMMITTED_BYTES_MAX = 5 * 2**20  # bench/results as a whole
RUN_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}-[0-9a-f]{7,}-[a-z0-9+-]+$")


def test_committed_results_are_summaries_under_the_size_cap() -> None:
    results = repo_root() / "bench" / "results"
    total = sum(p.stat().st_size for p in results.rglob("*") if p.is_file())
    assert total < COMMITTED_BYTES_MAX, f"bench/results holds {total} bytes"
    for run in results.iterdir():
        if run.name.startswith("reproduce-"):  # `zbdlab reproduce` reports (docs/reproduction.md)
            continue
        assert RUN_NAME.match(run.name), f"{run.name}: not <date>-<commit>-<group>"
        extra = [
            p.name for p in run.iterdir() if p.name not in RESULT_FILES and p.suffix not in (".png", ".svg")
        ]
        assert not extra, f"{run.name} holds raw output: {extra}"
