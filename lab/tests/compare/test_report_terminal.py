"""Golden test of the terminal table on generated data (benchstat-style: median ± CI, % change with
p and n, `~`, a geomean row, footnotes). Regenerate with ZBDLAB_UPDATE_GOLDEN=1 after a deliberate
format change, and read the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zbdlab.parsers import load_set
from zbdlab.report.terminal import render_terminal
from zbdlab.stats.compare import Options, analyse

from .conftest import copy_set, write_iozone_set

GOLDEN = Path(__file__).parent / "golden" / "terminal_iozone_5sets.txt"


@pytest.fixture(scope="module")
def terminal(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("golden")
    write_iozone_set(root / "base", seed=1)
    copy_set(root / "base", root / "same")
    write_iozone_set(root / "slow", scale=0.8, seed=1)
    write_iozone_set(root / "tiny", scale=1.01, seed=5)  # 1 % faster: inside the 2 % margin
    write_iozone_set(root / "few", runs=2, scale=1.3, seed=6)  # 5+2 runs: per-cell tests cannot reach 0.05
    sets = [load_set(name, root / name) for name in ("base", "same", "slow", "tiny", "few")]
    return render_terminal(analyse(sets, Options(bootstrap=400, seed=3)))


def test_report_terminal_matches_golden(terminal: str) -> None:
    if os.environ.get("ZBDLAB_UPDATE_GOLDEN"):
        GOLDEN.write_text(terminal)
    assert terminal == GOLDEN.read_text()


def test_report_terminal_marks(terminal: str) -> None:
    lines = terminal.splitlines()
    assert max(len(line) for line in lines) <= 120
    # the per-operation table comes in groups of sets; collect each set's column per operation
    columns: dict[str, dict[str, str]] = {}
    names: list[str] = []
    for line in lines:
        parts = line.split("│")
        if len(parts) < 3:
            continue
        if parts[0].strip() == "" and parts[1].strip() == "base":
            names = [p.split()[0] for p in parts[2:] if p.strip()]
        elif parts[0].strip():
            for name, cell in zip(names, parts[2:], strict=False):
                columns.setdefault(name, {})[parts[0].strip()] = cell
    assert set(columns) == {"same", "slow", "tiny", "few"}
    for op in ("write", "read", "freread"):
        assert "~ (q=" in columns["same"][op]  # same vs base: no verdict
        assert "-20.00% (q=" in columns["slow"][op]  # IOzone prints integers: the ratio is 0.8 to 4 digits
        assert "~ (q=" in columns["tiny"][op]  # 1 % is inside the margin
        assert "% (q=" in columns["few"][op] and "+" in columns["few"][op]
    assert "geomean" in columns["slow"]
    # said once, not per cell: 5+2 runs cannot reach 0.05 with Mann-Whitney (2 / C(7, 2) = 0.095)
    assert terminal.count("smallest p they can reach is 0.095") == 1
    assert "for few (5+2 runs)" in terminal
