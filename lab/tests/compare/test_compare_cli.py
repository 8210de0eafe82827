"""`zbdlab compare` and `zbdlab report` end to end: fio and IOzone inputs, mismatches, user errors,
the fixture comparison of ext4 against xfs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from zbdlab.cli import main

from .conftest import fio_document, fio_job, iozone_fixture_dir, iozone_text, write_results_dir

FIO_CELLS = [("write", "4k"), ("write", "64k"), ("randwrite", "4k"), ("randwrite", "64k"), ("read", "64k")]


def _fio_set(directory: Path, factor: float, runs: int, seed: int, skip: str | None = None) -> dict:
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    values: dict[tuple[str, str], list[float]] = {}
    for run in range(runs):
        jobs = []
        for index, (rw, bs) in enumerate(FIO_CELLS):
            if rw == skip:
                continue
            mb = (100 + 40 * index) * factor * (1 + 0.03 * rng.standard_normal())
            values.setdefault((rw, bs), []).append(mb)
            direction = "read" if "read" in rw else "write"
            jobs.append(fio_job(f"{rw}-{bs}", rw, bs, "256m", mb * 1048576, direction))
        (directory / f"run{run}.json").write_text(json.dumps(fio_document(jobs)))
    return values


def _invoke(*args: str) -> object:
    return CliRunner().invoke(main, list(args))


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_compare_fio_sets_with_welch_and_a_missing_operation(tmp_path: Path) -> None:
    base = _fio_set(tmp_path / "base", 1.0, 5, 1)
    slow = _fio_set(tmp_path / "slow", 0.7, 5, 2, skip="read")
    _fio_set(tmp_path / "same", 1.0, 5, 3)
    out = tmp_path / "out"
    result = _invoke(
        "compare",
        "--set", f"base={tmp_path / 'base'}",
        "--set", f"slow={tmp_path / 'slow'}",
        "--set", f"same={tmp_path / 'same'}",
        "--test", "welch", "--bootstrap", "300", "--no-plots", "-o", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "warning: slow lacks operations of base: read" in result.stderr
    primary = {(r["set"], r["operation"]): r for r in _rows(out / "tables" / "primary.csv")}
    assert primary[("slow", "write")]["verdict"] == "slower"
    assert primary[("slow", "random_write")]["verdict"] == "slower"
    assert ("slow", "read") not in primary
    assert primary[("same", "read")]["verdict"] == "no significant difference"
    tests = {
        (r["set"], r["operation"], r["record_size_kb"]): r for r in _rows(out / "tables" / "cell_tests.csv")
    }
    expected_p = stats.ttest_ind(
        base[("write", "4k")], _fio_values(tmp_path / "slow", "write-4k"), equal_var=False
    )
    assert float(tests[("slow", "write", "4")]["p"]) == pytest.approx(expected_p.pvalue, rel=1e-9)
    assert float(tests[("slow", "write", "4")]["smallest_reachable_p"]) == 0.0
    assert slow  # generated
    latency = [r for r in _rows(out / "tables" / "metrics.csv") if r["metric"] == "latency p50 (us)"]
    assert {r["set"] for r in latency} == {"base", "slow", "same"}
    assert "~" in result.stdout and "geomean" in result.stdout


def _fio_values(directory: Path, job: str) -> list[float]:
    values = []
    for path in sorted(directory.iterdir()):
        for entry in json.loads(path.read_text())["jobs"]:
            if entry["jobname"] == job:
                values.append(entry["write"]["bw_bytes"] / 1048576)
    return values


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--set", "nonsense"], 2, "is not NAME=PATH"),
        (["--set", "a=/nonexistent/x", "--set", "b=/nonexistent/y"], 2, "does not exist"),
        (["--set", "a=EMPTY", "--set", "b=GOOD"], 1, "baseline unusable"),
        (["--set", "a=GOOD"], 2, "at least two sets"),
        (["--set", "a=GOOD", "--set", "a=GOOD"], 2, "must be unique"),
        (["--set", "a=GOOD", "--set", "b=GOOD", "--detail", "nosuchop"], 1, "no such operation"),
        (["--set", "a=GOOD", "--set", "b=GOOD", "--margin", "lots"], 2, "not a number"),
    ],
)
def test_compare_user_errors_are_one_line(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    (tmp_path / "empty.iozone").write_text("")
    (tmp_path / "good.iozone").write_text(iozone_text({(64, 4): [1000.0] * 13, (64, 8): [2000.0] * 13}))
    args = [
        a.replace("EMPTY", str(tmp_path / "empty.iozone")).replace("GOOD", str(tmp_path / "good.iozone"))
        for a in args
    ]
    result = _invoke("compare", *args, "-o", str(tmp_path / "out"))
    assert result.exit_code == code
    assert message in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


def test_compare_truncated_and_empty_files_compare_what_matches(tmp_path: Path) -> None:
    cells = {(64, 4): [1000.0] * 13, (64, 8): [2000.0] * 13, (128, 4): [3000.0] * 13}
    (tmp_path / "base").mkdir()
    (tmp_path / "other").mkdir()
    for i in range(3):
        (tmp_path / "base" / f"r{i}.iozone").write_text(
            iozone_text({c: [v * (1 + i / 100) for v in vs] for c, vs in cells.items()})
        )
    (tmp_path / "other" / "r0.iozone").write_text(
        iozone_text(cells, complete=False).rsplit("\n", 2)[0]
    )  # last row cut
    (tmp_path / "other" / "r1.iozone").write_text("")
    result = _invoke(
        "compare", "--set", f"base={tmp_path / 'base'}", "--set", f"other={tmp_path / 'other'}",
        "--bootstrap", "200", "--no-plots", "-o", str(tmp_path / "out"),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "empty file (file skipped)" in result.stderr
    assert "may be truncated" in result.stderr
    assert "2 cells in common; 1 only in base" in result.stderr
    assert "¹ fewer than 2 runs per cell" in result.stdout


def test_report_one_dir_several_targets_and_several_dirs(tmp_path: Path) -> None:
    write_results_dir(tmp_path / "one", {"ext4": 1.0, "xfs": 0.9}, runs=3)
    result = _invoke(
        "report", str(tmp_path / "one"), "--bootstrap", "200", "--no-plots", "-o", str(tmp_path / "o1")
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "o1" / "comparison.json").read_text())["meta"]
    assert [s["name"] for s in meta["sets"]] == ["ext4", "xfs"]

    write_results_dir(tmp_path / "a", {"ext4": 1.0}, runs=3, study_name="kernel-6.1")
    write_results_dir(
        tmp_path / "b", {"ext4": 1.0}, runs=3, study_name="kernel-6.6", environment={"kernel": "6.6"}
    )
    result = _invoke(
        "report",
        str(tmp_path / "a"),
        str(tmp_path / "b"),
        "--bootstrap",
        "200",
        "--no-plots",
        "-o",
        str(tmp_path / "o2"),
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "o2" / "comparison.json").read_text())["meta"]
    assert [s["name"] for s in meta["sets"]] == ["kernel-6.1", "kernel-6.6"]
    assert "differs from" in result.stderr and "kernel" in result.stderr

    result = _invoke("report", str(tmp_path / "a"), "-o", str(tmp_path / "o3"))
    assert result.exit_code == 2 and "holds one target" in result.output


def test_compare_fixtures_ext4_against_xfs(tmp_path: Path) -> None:
    xfs, ext4 = iozone_fixture_dir("xfs"), iozone_fixture_dir("ext4")
    out = tmp_path / "out"
    result = _invoke(
        "compare", "--set", f"xfs={xfs}", "--set", f"ext4={ext4}", "--bootstrap", "300", "--no-plots",
        "--detail", "iwrite", "-o", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    # Seed 001 fig. 5.1, xfs write by file size: 4 KiB mean 187.53, sd 4.57, CI 183.17-191.9;
    # 8 KiB mean 307.1, sd 143.03
    by_file = {
        (r["operation"], r["file_size_kb"], r["set"]): r for r in _rows(out / "tables" / "by_file_size.csv")
    }
    for size, mean, sd in (("4", 187.53, 4.57), ("8", 307.1, 143.03)):
        row = by_file[("write", size, "xfs")]
        assert round(float(row["mean"]), 2) == pytest.approx(mean)
        assert round(float(row["sd"]), 2) == pytest.approx(sd)
    assert round(float(by_file[("write", "4", "xfs")]["ci_low"]), 2) == pytest.approx(183.17)
    primary = {r["operation"]: r for r in _rows(out / "tables" / "primary.csv")}
    assert primary["write"]["verdict"] == "slower"
    assert primary["random_write"]["verdict"] == "no significant difference"
    page = (out / "index.html").read_text()
    assert "<img" not in page and 'id="op-freread"' in page  # --no-plots: every section, no figure
    assert "run 5" in (out / "detail-write-by-record-size.html").read_text()  # original's name iwrite


def test_compare_results_dir_targets_are_picked_with_at(tmp_path: Path) -> None:
    write_results_dir(tmp_path / "r", {"ext4": 1.0, "ext4-on-zbd": 0.8}, runs=3)
    result = _invoke("compare", "--set", f"a={tmp_path / 'r'}", "--set", f"b={tmp_path / 'r'}")
    assert result.exit_code == 1 and "pick one with NAME=PATH@TARGET" in result.output
    out = tmp_path / "out"
    result = _invoke(
        "compare", "--set", f"ext4={tmp_path / 'r'}@ext4", "--set", f"zbd={tmp_path / 'r'}@ext4-on-zbd",
        "--bootstrap", "200", "--no-plots", "-o", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    primary = {r["operation"]: r for r in _rows(out / "tables" / "primary.csv")}
    assert primary["write"]["verdict"] == "slower"
    assert float(primary["write"]["ratio"]) == pytest.approx(0.8, abs=0.02)


def test_compare_cli_offers_exactly_the_tests_the_engine_knows() -> None:
    from zbdlab.cli.compare import TESTS as offered
    from zbdlab.stats.tests import TESTS as known

    assert offered == known
