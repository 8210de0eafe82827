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
    rows = {line.split("│")[0].strip(): line for line in lines if "│" in line}
    assert set(rows) >= {"write", "freread", "geomean"}
    for op in ("write", "read", "freread"):
        columns = rows[op].split("│")
        assert "~ (p=" in columns[2]  # same vs base: no significant difference
        assert "-20.00% (p=" in columns[3]  # IOzone prints integers: the ratio is 0.8 to 4 digits
        assert "~ (p=" in columns[4]  # 1 % is inside the margin
        assert "% (p=" in columns[5] and "+" in columns[5]
    footnotes = [line for line in lines if line[:1] in "¹²³⁴"]
    assert any("5+2 runs cannot reach p < 0.05 (smallest p = 0.0952)" in line for line in footnotes)
