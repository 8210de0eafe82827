"""The comparison engine on generated sets with known truth: identical, scaled by 0.8, faster by 10 %,
and sets whose operations or cells do not match."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from zbdlab.parsers import load_set
from zbdlab.parsers.model import IOZONE_OPERATIONS, CellKey, DataSet, Sample
from zbdlab.stats.compare import ALL, Options, analyse
from zbdlab.stats.slope import tls_line, tls_through_origin
from zbdlab.stats.tests import benjamini_hochberg

from .conftest import DESIGN, copy_set, write_iozone_set

OPTIONS = Options(bootstrap=400, seed=3)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("sets")
    written = {
        "base": write_iozone_set(root / "base", seed=1),
        "slow": write_iozone_set(root / "slow", scale=0.8, seed=1),  # same noise, every value x 0.8
        "fast": write_iozone_set(root / "fast", scale=1.1, seed=2),
    }
    copy_set(root / "base", root / "same")
    written["same"] = written["base"]
    names = ["base", "same", "slow", "fast"]
    sets = [load_set(n, root / n) for n in names]
    return {"root": root, "written": written, "analysis": analyse(sets, OPTIONS)}


def _cell_means(written: list[dict], op_index: int) -> np.ndarray:
    return np.array([np.mean([run[cell][op_index] for run in written]) for cell in DESIGN]) / 1024


def test_stats_identical_set_has_no_significant_difference_anywhere(generated: dict) -> None:
    analysis = generated["analysis"]
    primaries = [p for p in analysis.primaries if p.set_name == "same"]
    assert len(primaries) == len(IOZONE_OPERATIONS) + 1
    for p in primaries:
        assert p.ratio == pytest.approx(1.0)
        assert p.verdict == "no significant difference"
        assert p.ci_low <= 1 <= p.ci_high
    tests = analysis.tests_for("same")
    assert len(tests) == len(DESIGN) * len(IOZONE_OPERATIONS)
    assert not any(t.significant(OPTIONS.alpha) for t in tests)
    for s in analysis.slopes:
        if s.set_name == "same":
            assert s.slope == pytest.approx(1.0)


def test_stats_scaled_set_is_slower_with_slope_interval_containing_0_8(generated: dict) -> None:
    analysis = generated["analysis"]
    for op_index, op in enumerate(IOZONE_OPERATIONS):
        p = analysis.primary("slow", op)
        assert p.verdict == "slower"
        # independent: geometric mean of per-cell mean ratios from the values written to the files
        ratios = _cell_means(generated["written"]["slow"], op_index) / _cell_means(
            generated["written"]["base"], op_index
        )
        assert p.ratio == pytest.approx(stats.gmean(ratios), rel=1e-9)
        assert p.ratio == pytest.approx(0.8, abs=1e-4)
        assert p.ci_low < p.ratio < p.ci_high
        slope = next(s for s in analysis.slopes if s.set_name == "slow" and s.operation == op)
        assert slope.ci_low <= 0.8 <= slope.ci_high
        assert slope.log_ci_low <= 1.0 <= slope.log_ci_high
    assert analysis.primary("slow", ALL).verdict == "slower"


def test_stats_faster_set_is_detected_per_operation_and_per_cell(generated: dict) -> None:
    analysis = generated["analysis"]
    for op in IOZONE_OPERATIONS:
        p = analysis.primary("fast", op)
        assert p.verdict == "faster"
        assert 1.05 < p.ratio < 1.15
    tests = analysis.tests_for("fast")
    # 5 vs 5 runs, 10 % apart, 2 % noise: complete separation in nearly every cell -> p = 2/252
    share = np.mean([t.significant(OPTIONS.alpha) for t in tests])
    assert share > 0.9
    assert all(t.smallest_p == pytest.approx(2 / 252) for t in tests)


def test_stats_tls_slope_matches_an_eigenvector_computation() -> None:
    rng = np.random.default_rng(4)
    x = rng.uniform(10, 1000, 50)
    y = 0.7 * x + rng.normal(0, 20, 50)
    # independent: principal axis of the uncentred scatter matrix
    points = np.vstack([x, y])
    _, vectors = np.linalg.eigh(points @ points.T)
    expected = vectors[1, -1] / vectors[0, -1]
    assert tls_through_origin(x, y) == pytest.approx(expected)
    # centred version: SVD of the centred points
    logs = np.vstack([np.log(x), np.log(y)]).T
    _, _, vt = np.linalg.svd(logs - logs.mean(axis=0))
    d, c = tls_line(np.log(x), np.log(y))
    assert d == pytest.approx(vt[0, 1] / vt[0, 0])
    assert c == pytest.approx(np.log(y).mean() - d * np.log(x).mean())


def test_stats_mismatched_sets_compare_what_matches(tmp_path: Path) -> None:
    write_iozone_set(tmp_path / "base", runs=3, seed=1)
    write_iozone_set(tmp_path / "other", runs=3, seed=2)
    # drop one operation column and one file size from the other set's files
    for path in (tmp_path / "other").iterdir():
        lines = path.read_text().splitlines()
        kept = [line for line in lines if not line.strip().startswith("512 ")]
        path.write_text(
            "\n".join(
                line[:-9] if ("reclen" in line or line.strip()[:1].isdigit()) else line for line in kept
            )
            + "\n"
        )
    analysis = analyse([load_set("base", tmp_path / "base"), load_set("other", tmp_path / "other")], OPTIONS)
    text = " | ".join(analysis.mismatches)
    assert "other lacks operations of base: freread" in text
    assert "only in base" in text
    assert analysis.primary("other", "freread") is None
    write = analysis.primary("other", "write")
    assert write is not None and write.cells == len([c for c in DESIGN if c[0] != 512])
    assert CellKey("write", 512, 4) not in {t.cell for t in analysis.tests_for("other")}


def test_stats_verdict_margin_rule(generated: dict) -> None:
    from zbdlab.stats.compare import _verdict

    shown, not_shown = (0.01, 0.05), (0.2, 0.05)  # (q, alpha)
    assert _verdict(0.97, 0.96, 0.98, 0.02, *shown) == ("slower", "")
    assert _verdict(0.99, 0.985, 0.995, 0.02, *shown) == ("no significant difference", "equivalent")
    assert _verdict(0.985, 0.975, 0.995, 0.02, *shown) == ("no significant difference", "below margin")
    assert _verdict(0.97, 0.90, 1.04, 0.02, *shown) == ("no significant difference", "inconclusive")
    assert _verdict(1.05, 1.01, 1.09, 0.02, *shown) == ("faster", "")
    # the interval and the margin say slower, the adjusted p does not: no verdict
    assert _verdict(0.97, 0.96, 0.98, 0.02, *not_shown) == ("no significant difference", "inconclusive")
    assert _verdict(1.05, 1.01, 1.09, 0.02, *not_shown) == ("no significant difference", "inconclusive")
    assert _verdict(0.97, 0.96, 0.98, 0.02, math.nan, 0.05)[0] == "no significant difference"
    assert not math.isnan(generated["analysis"].primary("fast", ALL).p)


def _one_cell_set(name: str, values: dict[str, list[float]]) -> DataSet:
    data = DataSet(name, "test", "zbdlab")
    for op, runs in values.items():
        data.samples += [Sample(CellKey(op, 65536, 1024), f"rep{i + 1}", v) for i, v in enumerate(runs)]
    data.runs = sorted({s.run for s in data.samples})
    return data


def test_stats_no_verdict_when_the_adjusted_p_does_not_show_the_change() -> None:
    # read: the 90 % interval lies below 1 and the estimate beyond the 2 % margin, but the two-sided
    # p is 0.09: the old interval-only rule called it "slower" beside a p that says it does not differ.
    base = {"write": [100, 104, 96, 101, 99], "read": [100, 102, 98, 101, 99]}
    other = {"write": [50, 52, 48, 50.5, 49.5], "read": [v * 0.975 for v in (100, 104, 92, 103, 97)]}
    analysis = analyse([_one_cell_set("base", base), _one_cell_set("set", other)], Options(seed=1))
    read = analysis.primary("set", "read")
    assert read is not None
    assert read.ci_high < 1 and read.ratio <= 1 - analysis.options.margin
    assert read.q >= analysis.options.alpha
    assert read.verdict == "no significant difference" and read.qualifier == "inconclusive"
    write = analysis.primary("set", "write")
    assert write is not None and write.verdict == "slower" and write.q < analysis.options.alpha


def test_stats_every_verdict_agrees_with_its_adjusted_p(generated: dict) -> None:
    analysis = generated["analysis"]
    alpha = analysis.options.alpha
    for data in analysis.others:
        primaries = [p for p in analysis.primaries if p.set_name == data.name]
        expected = benjamini_hochberg(np.array([p.p for p in primaries]))
        for p, q in zip(primaries, expected, strict=True):
            assert p.q == pytest.approx(q) and p.q >= p.p
            if p.verdict in ("faster", "slower"):
                assert p.q < alpha
                assert (p.ci_low > 1) if p.verdict == "faster" else (p.ci_high < 1)
