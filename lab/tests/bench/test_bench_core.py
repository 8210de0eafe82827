"""The bench harness's own logic on synthetic numbers: rounds, ratios and intervals, targets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zbdlab.bench.core import Figure, Goal, Rounds, round_order, run_rounds
from zbdlab.stats.compare import Options, median_ratio_interval


def test_round_order_rotates_so_no_arm_always_goes_first() -> None:
    assert [round_order(["A", "B"], r) for r in range(4)] == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]
    orders = [round_order(["A", "B", "C"], r) for r in range(3)]
    assert [o[0] for o in orders] == ["A", "B", "C"]
    assert all(sorted(o) == ["A", "B", "C"] for o in orders)


def test_run_rounds_measures_every_arm_once_per_round_in_order() -> None:
    calls: list[tuple[str, int]] = []

    def measure(arm: str, r: int) -> dict[str, float]:
        calls.append((arm, r))
        return {"speed": 100.0 * (r + 1) + (1 if arm == "B" else 0)}

    rounds = run_rounds(["A", "B"], 3, measure)
    assert calls == [("A", 0), ("B", 0), ("B", 1), ("A", 1), ("A", 2), ("B", 2)]
    assert rounds.get("A", "speed") == [100.0, 200.0, 300.0]
    assert rounds.get("B", "speed") == [101.0, 201.0, 301.0]
    assert rounds.order == [["A", "B"], ["B", "A"], ["A", "B"]]


def test_rounds_pad_missing_rounds_with_nan() -> None:
    rounds = Rounds(["A"])
    rounds.add(0, "A", {"x": 1.0})
    rounds.add(2, "A", {"x": 3.0})
    got = rounds.get("A", "x")
    assert got[0] == 1.0 and math.isnan(got[1]) and got[2] == 3.0


def test_ratio_of_medians_and_its_interval() -> None:
    a = [200.0, 210.0, 190.0, 205.0, 195.0]
    b = [100.0, 101.0, 99.0, 100.5, 99.5]
    ratio, low, high = median_ratio_interval(a, b, Options(bootstrap=2000, seed=3))
    assert ratio == pytest.approx(200.0 / 100.0)
    assert low <= ratio <= high
    assert 1.8 < low and high < 2.2


def test_noisy_rounds_give_a_wider_interval() -> None:
    rng = np.random.default_rng(7)
    base = rng.uniform(95, 105, 9)
    quiet = median_ratio_interval(base * 2 * rng.uniform(0.99, 1.01, 9), base)
    noisy = median_ratio_interval(base * 2 * rng.uniform(0.5, 1.5, 9), base)
    assert (noisy[2] - noisy[1]) > 3 * (quiet[2] - quiet[1])


def test_paired_resampling_cancels_load_shared_by_both_arms() -> None:
    # each round's load slows A and B alike: the paired ratio is exactly 2 in every resample
    load = np.array([1.0, 0.5, 0.8, 0.3, 0.9])
    ratio, low, high = median_ratio_interval(200 * load, 100 * load)
    assert ratio == pytest.approx(2.0) and low == pytest.approx(2.0) and high == pytest.approx(2.0)


def test_interval_is_reproducible_with_the_seed() -> None:
    a, b = [3.0, 4.0, 5.0, 4.5, 3.5], [2.0, 2.5, 1.5, 2.2, 1.8]
    assert median_ratio_interval(a, b, Options(seed=5)) == median_ratio_interval(a, b, Options(seed=5))


def test_figure_scale_and_failed_rounds() -> None:
    fig = Figure("engine", "x", [160.0, math.nan, 150.0, 170.0], [100.0, 100.0, 100.0, 100.0], scale=2)
    fig.compute(Options())
    assert fig.rounds == 3  # the failed round drops out of both sides
    assert fig.ratio == pytest.approx(160.0 / 200.0)


def test_empty_figure_has_no_data() -> None:
    fig = Figure("nbd-fast", "x", [], [], goal=Goal(at_least=1.0)).compute(Options())
    assert math.isnan(fig.ratio) and fig.verdict == "no data"


@pytest.mark.parametrize(
    ("goal", "low", "high", "verdict"),
    [
        (Goal(at_least=0.8), 0.85, 0.95, "pass"),
        (Goal(at_least=0.8), 0.5, 0.79, "miss"),
        (Goal(at_least=0.8), 0.7, 0.9, "unsure"),
        (Goal(at_most=0.85), 0.6, 0.8, "pass"),
        (Goal(at_most=0.85), 0.9, 1.0, "miss"),
        (Goal(at_most=0.85), 0.8, 0.9, "unsure"),
    ],
)
def test_goal_verdict_is_judged_on_the_interval(goal: Goal, low: float, high: float, verdict: str) -> None:
    assert goal.verdict(low, high) == verdict


def test_goal_needs_exactly_one_bound() -> None:
    with pytest.raises(ValueError):
        Goal()
    with pytest.raises(ValueError):
        Goal(at_least=1.0, at_most=2.0)


def test_too_few_rounds_never_pass_or_miss() -> None:
    one = Figure("engine", "x", [200.0], [100.0], goal=Goal(at_least=1.5)).compute(Options())
    assert one.low == one.high == 2.0  # a degenerate interval...
    assert one.verdict == "unsure"  # ...is not evidence
    three = Figure("engine", "x", [200.0] * 3, [100.0] * 3, goal=Goal(at_least=1.5)).compute(Options())
    assert three.verdict == "pass"
