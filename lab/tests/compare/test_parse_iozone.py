"""IOzone text parsing: the 20 real fixture files and generated files with known values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zbdlab.parsers import InputError, load_set
from zbdlab.parsers.iozone import parse_iozone_text
from zbdlab.parsers.model import IOZONE_OPERATIONS, CellKey

from .conftest import DESIGN, iozone_fixture_dir, iozone_text

FIXTURE_SETS = ("ext2", "ext3", "ext4", "xfs")


def _independent_rows(path: Path) -> list[list[int]]:
    """Every line made only of 15 integers: the fixture's full table rows, read without our parser."""
    rows = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) == 15 and all(f.isdigit() for f in fields):
            rows.append([int(f) for f in fields])
    return rows


@pytest.mark.parametrize("name", FIXTURE_SETS)
def test_parse_every_fixture_file_matches_an_independent_reading(name: str) -> None:
    directory = iozone_fixture_dir(name)
    files = sorted(directory.glob("*.iozone"))
    assert len(files) == 5
    for path in files:
        run = parse_iozone_text(path.read_text(), str(path))
        expected = _independent_rows(path)
        assert len(expected) == 163
        assert run.operations == list(IOZONE_OPERATIONS)
        assert len(run.rows) == len(expected) * len(IOZONE_OPERATIONS)
        for row in expected:
            for op, value in zip(IOZONE_OPERATIONS, row[2:], strict=True):
                assert run.rows[CellKey(op, row[0], row[1])] == value
        assert run.warnings == []


def test_parse_fixture_directory_is_one_set_of_five_runs_in_mb_per_s() -> None:
    directory = iozone_fixture_dir("xfs")
    data = load_set("xfs", directory)
    assert data.kind == "iozone"
    assert len(data.runs) == 5
    first = _independent_rows(sorted(directory.glob("*.iozone"))[0])[0]
    values = [s.value for s in data.samples if s.cell == CellKey("write", first[0], first[1])]
    assert len(values) == 5
    assert values[0] == pytest.approx(first[2] / 1024)


def test_parse_generated_file_with_known_values_and_blank_cells(tmp_path: Path) -> None:
    table = {cell: [1000.0 * (i + 1) + cell[0] + cell[1] for i in range(13)] for cell in DESIGN}
    table[(64, 4)][3] = None  # reread left blank: must be missing, never zero
    table[(128, 8)][12] = None  # last column blank
    run = parse_iozone_text(iozone_text(table), "gen")
    assert CellKey("reread", 64, 4) not in run.rows
    assert CellKey("freread", 128, 8) not in run.rows
    assert run.rows[CellKey("rewrite", 64, 4)] == 2000 + 68
    assert run.rows[CellKey("fread", 128, 8)] == 12000 + 136
    assert len(run.rows) == len(DESIGN) * 13 - 2


def test_parse_extra_column_keeps_known_ones(tmp_path: Path) -> None:
    text = iozone_text({(64, 4): [float(v) for v in range(100, 113)]})
    lines = text.splitlines()
    heading = next(i for i, line in enumerate(lines) if "reclen" in line)
    lines[heading] += "  newop"
    lines[heading + 1] += "    999"
    run = parse_iozone_text("\n".join(lines), "extra")
    assert run.rows[CellKey("write", 64, 4)] == 100
    assert run.rows[CellKey("freread", 64, 4)] == 112
    assert run.rows[CellKey("newop", 64, 4)] == 999


def test_parse_truncated_file_keeps_rows_with_a_warning() -> None:
    text = iozone_text({cell: [1000.0] * 13 for cell in DESIGN}, complete=False)
    text = text[: len(text) - 40]  # cut inside the last row
    run = parse_iozone_text(text, "cut")
    assert any("truncated" in w for w in run.warnings)
    assert CellKey("write", 64, 4) in run.rows


@pytest.mark.parametrize(
    ("content", "message"),
    [("", "empty file"), ("hello\nworld\n", "no IOzone auto-mode table")],
)
def test_parse_bad_files_are_clear_errors(content: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_iozone_text(content, "bad")


def test_parse_directory_with_one_bad_file_keeps_the_others(tmp_path: Path) -> None:
    (tmp_path / "a.iozone").write_text(iozone_text({(64, 4): [1024.0] * 13}))
    (tmp_path / "b.iozone").write_text("")
    data = load_set("s", tmp_path)
    assert len(data.runs) == 1
    assert any("empty file" in w for w in data.warnings)
    assert np.allclose([s.value for s in data.samples], 1.0)
