"""Per-cell two-sample tests and false-discovery control.

Each cell (one operation, file size and record size) is tested on its own: its runs in the baseline
against its runs in the set. Unlike cells are never pooled, because pooling mixes a 4 KiB-file and a
4 GiB-file throughput into one distribution and a test on that measures the design, not the systems.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats

TESTS = ("mwu", "welch")  # also spelled out in zbdlab.cli.compare, which must not import scipy
TEST_LABELS = {"mwu": "Mann-Whitney U", "welch": "Welch's t"}


def cell_test(baseline: np.ndarray, other: np.ndarray, test: str) -> float:
    """Two-sided p-value; NaN when either side has fewer than 2 values (no test possible)."""
    if baseline.size < 2 or other.size < 2:
        return math.nan
    if test == "mwu":
        if np.array_equal(np.sort(baseline), np.sort(other)):
            return 1.0
        return float(stats.mannwhitneyu(baseline, other, alternative="two-sided").pvalue)
    if test == "welch":
        if np.ptp(baseline) == 0 and np.ptp(other) == 0:
            return 1.0 if baseline[0] == other[0] else 0.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return float(stats.ttest_ind(baseline, other, equal_var=False).pvalue)
    raise ValueError(f"unknown test {test!r}")


def smallest_p(n_baseline: int, n_other: int, test: str) -> float:
    """The smallest two-sided p the design can ever reach (complete separation for Mann-Whitney:
    2 / C(n1+n2, n1); 5 vs 5 gives 2/252 = 0.0079). Welch's t has no floor: 0."""
    if n_baseline < 2 or n_other < 2:
        return math.nan
    if test == "mwu":
        return min(1.0, 2.0 / math.comb(n_baseline + n_other, n_baseline))
    return 0.0


def benjamini_hochberg(pvalues: np.ndarray) -> np.ndarray:
    """BH-adjusted q-values (step-up, monotone); NaN p-values stay NaN and do not count as tests."""
    p = np.asarray(pvalues, dtype=float)
    q = np.full(p.shape, np.nan)
    valid = np.flatnonzero(np.isfinite(p))
    m = valid.size
    if m == 0:
        return q
    order = valid[np.argsort(p[valid], kind="stable")]
    ranked = p[order] * m / np.arange(1, m + 1)
    ranked = np.minimum.accumulate(ranked[::-1])[::-1]
    q[order] = np.minimum(ranked, 1.0)
    return q
