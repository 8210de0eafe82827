"""Per-cell tests, smallest reachable p, Benjamini-Hochberg."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from zbdlab.stats.tests import benjamini_hochberg, cell_test, smallest_p


def test_stats_smallest_p_five_vs_five_is_2_over_252() -> None:
    assert smallest_p(5, 5, "mwu") == pytest.approx(2 / 252)
    assert smallest_p(3, 3, "mwu") == pytest.approx(0.1)
    assert smallest_p(5, 5, "welch") == 0.0
    assert math.isnan(smallest_p(1, 5, "mwu"))


def test_stats_complete_separation_reaches_the_smallest_p() -> None:
    low, high = np.array([1.0, 2, 3, 4, 5]), np.array([6.0, 7, 8, 9, 10])
    assert cell_test(low, high, "mwu") == pytest.approx(2 / 252)


def test_stats_cell_tests_match_scipy() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.normal(10, 1, 7), rng.normal(11, 2, 6)
    assert cell_test(a, b, "mwu") == pytest.approx(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    assert cell_test(a, b, "welch") == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert math.isnan(cell_test(a[:1], b, "mwu"))


def test_stats_benjamini_hochberg_hand_computed() -> None:
    # sorted p: 0.005, 0.01, 0.03, 0.04 -> p*m/rank: 0.02, 0.02, 0.04, 0.04 (already monotone)
    q = benjamini_hochberg(np.array([0.01, 0.04, 0.03, 0.005, math.nan]))
    assert q[:4] == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert math.isnan(q[4])
    # m = 3: 0.01*3/1 = 0.03, 0.02*3/2 = 0.03, 0.5*3/3 = 0.5
    assert benjamini_hochberg(np.array([0.01, 0.02, 0.5])) == pytest.approx([0.03, 0.03, 0.5])
