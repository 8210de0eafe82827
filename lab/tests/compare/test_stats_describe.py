"""Descriptive statistics against numpy/scipy directly, and against the original comparator's own
published numbers (seed 001, figures 5.1 and 5.3: XFS as baseline, Ext4 as Set1, these fixtures)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from zbdlab.parsers import load_set
from zbdlab.stats.describe import describe

from .conftest import iozone_fixture_dir


def test_stats_describe_matches_numpy_and_scipy() -> None:
    rng = np.random.default_rng(5)
    values = rng.lognormal(5, 0.7, size=37)
    s = describe(values, confidence=0.9)
    half = stats.t.ppf(0.95, 36) * np.std(values, ddof=1) / math.sqrt(37)
    assert s.n == 37
    assert s.mean == pytest.approx(np.mean(values))
    assert s.sd == pytest.approx(np.std(values, ddof=1))
    assert s.ci_low == pytest.approx(np.mean(values) - half)
    assert s.ci_high == pytest.approx(np.mean(values) + half)
    assert s.gmean == pytest.approx(stats.gmean(values))
    assert s.median == pytest.approx(np.median(values))
    assert s.q1 == pytest.approx(np.quantile(values, 0.25))
    assert s.q3 == pytest.approx(np.quantile(values, 0.75))
    assert (s.min, s.max) == (values.min(), values.max())


def test_stats_describe_hand_computed() -> None:
    s = describe([1.0, 2.0, 4.0, 8.0])
    assert s.mean == 3.75
    assert s.gmean == pytest.approx(64 ** (1 / 4))
    assert s.median == 3.0
    assert s.q1 == 1.75  # linear interpolation at position 0.75
    assert s.q3 == 5.0
    single = describe([5.0])
    assert single.mean == 5.0 and math.isnan(single.sd) and math.isnan(single.ci_low)


def _pooled(name: str, op: str | None) -> np.ndarray:
    data = load_set(name, iozone_fixture_dir(name))
    return np.array([s.value for s in data.samples if op is None or s.cell.operation == op])


# Published by the original tool (seed 001, fig. 5.3, rounded to 2 decimals): xfs = baseline, ext4 = set1.
PUBLISHED = {
    ("xfs", None): dict(
        mean=952.81,
        sd=737.06,
        ci_low=941.03,
        ci_high=964.59,
        gmean=644.99,
        median=905.82,
        q1=466.34,
        q3=1257.44,
        min=9.68,
        max=5864.95,
    ),
    ("xfs", "write"): dict(
        mean=1231.01,
        sd=364.56,
        ci_low=1209.98,
        ci_high=1252.04,
        gmean=1164.85,
        median=1201.91,
        q1=1079.67,
        q3=1346.86,
        min=50.43,
        max=2169.82,
    ),
    ("ext4", None): dict(
        mean=884.4,
        sd=640.56,
        ci_low=874.16,
        ci_high=894.63,
        gmean=613.45,
        median=832.46,
        q1=458.66,
        q3=1209.61,
        min=9.69,
        max=4650.82,
    ),
    ("ext4", "write"): dict(
        mean=1052.24,
        sd=333.19,
        ci_low=1033.02,
        ci_high=1071.46,
        gmean=992.05,
        median=1000.94,
        q1=904.82,
        q3=1152.13,
        min=96.55,
        max=1835.59,
    ),
}


@pytest.mark.parametrize(("name", "op"), list(PUBLISHED))
def test_stats_fixture_summaries_equal_the_original_published_numbers(name: str, op: str | None) -> None:
    s = describe(_pooled(name, op), confidence=0.90).as_dict()
    for key, published in PUBLISHED[(name, op)].items():
        assert round(s[key], 2) == pytest.approx(published, abs=0.006), key


def test_stats_fixture_median_difference_equals_the_original() -> None:
    # The original printed -16.72 % for write and -8.1 % for ALL (median of ext4 vs median of xfs).
    for op, published in (("write", -16.72), (None, -8.1)):
        change = (np.median(_pooled("ext4", op)) / np.median(_pooled("xfs", op)) - 1) * 100
        assert round(change, 2) == pytest.approx(published, abs=0.006)
