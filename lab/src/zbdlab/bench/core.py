"""The harness's own logic: alternating rounds, ratio figures with intervals, targets.

Nothing here runs a tool: groups hand in a `measure(arm)` callable, so this logic is tested on
synthetic numbers (lab/tests/bench).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from zbdlab.stats.compare import Options, median_ratio_interval

Metrics = dict[str, float]
MIN_ROUNDS = 3  # fewer rounds than this never pass or miss a target


def round_order(arms: Sequence[str], round_index: int) -> list[str]:
    """Arms in the order of round `round_index`: rotated by one each round (A B, B A, A B, ... for
    two arms), so every arm runs once per round and none always goes first."""
    if not arms:
        return []
    k = round_index % len(arms)
    return [*arms[k:], *arms[:k]]


@dataclass
class Rounds:
    """Per arm and metric, one value per round (NaN where a round failed for that arm)."""

    arms: list[str]
    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    order: list[list[str]] = field(default_factory=list)  # what ran, round by round

    def add(self, round_index: int, arm: str, metrics: Metrics) -> None:
        per_arm = self.values.setdefault(arm, {})
        for name, value in metrics.items():
            column = per_arm.setdefault(name, [])
            column.extend([math.nan] * (round_index - len(column)))
            column.append(float(value))

    def get(self, arm: str, metric: str) -> list[float]:
        return list(self.values.get(arm, {}).get(metric, []))


def run_rounds(
    arms: Sequence[str],
    rounds: int,
    measure: Callable[[str, int], Metrics],
    progress: Callable[[str], None] | None = None,
) -> Rounds:
    """Runs `measure(arm, round)` for every arm in every round, in `round_order`."""
    result = Rounds(list(arms))
    for r in range(rounds):
        order = round_order(arms, r)
        result.order.append(order)
        for arm in order:
            if progress:
                progress(f"round {r + 1}/{rounds}: {arm}")
            result.add(r, arm, measure(arm, r))
    return result


@dataclass(frozen=True)
class Goal:
    """A target from an issue, judged on the interval: the ratio must be at least `at_least`
    (speed) or at most `at_most` (space, bytes written)."""

    at_least: float | None = None
    at_most: float | None = None

    def __post_init__(self) -> None:
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError("a goal is either at_least or at_most")

    @property
    def label(self) -> str:
        return f">= {self.at_least:g}" if self.at_least is not None else f"<= {self.at_most:g}"

    def verdict(self, low: float, high: float) -> str:
        """pass: the whole interval meets the target; miss: the whole interval fails it; unsure:
        the interval straddles it (a noisy machine, or too few rounds)."""
        if not (math.isfinite(low) and math.isfinite(high)):
            return "no data"
        if self.at_least is not None:
            ok, bad = low >= self.at_least, high < self.at_least
        else:
            assert self.at_most is not None
            ok, bad = high <= self.at_most, low > self.at_most
        return "pass" if ok else "miss" if bad else "unsure"


@dataclass
class Figure:
    """median(numerator) / (scale x median(denominator)), both measured in the same rounds."""

    group: str
    name: str
    numerator: list[float]
    denominator: list[float]
    scale: float = 1.0
    unit: str = "MB/s"
    goal: Goal | None = None
    note: str = ""  # shown beside the figure (e.g. the compression ratio zbd achieved)
    ratio: float = math.nan
    low: float = math.nan
    high: float = math.nan

    def compute(self, options: Options) -> Figure:
        num, den = self.paired()
        self.ratio, self.low, self.high = median_ratio_interval(num, [v * self.scale for v in den], options)
        return self

    def paired(self) -> tuple[list[float], list[float]]:
        """The values that count: with one value per round on each side, a round where either side
        failed (NaN) drops out of both, keeping the pairing; otherwise each side's finite values."""
        if len(self.numerator) == len(self.denominator):
            pairs = [
                (a, b)
                for a, b in zip(self.numerator, self.denominator, strict=True)
                if math.isfinite(a) and math.isfinite(b)
            ]
            return [a for a, _ in pairs], [b for _, b in pairs]
        return finite(self.numerator), finite(self.denominator)

    @property
    def verdict(self) -> str:
        if not self.goal:
            return ""
        if 0 < self.rounds < MIN_ROUNDS:  # an interval from one or two rounds has no width to trust
            return "unsure"
        return self.goal.verdict(self.low, self.high)

    @property
    def rounds(self) -> int:
        return min(len(side) for side in self.paired())

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "name": self.name,
            "ratio": self.ratio,
            "ci_low": self.low,
            "ci_high": self.high,
            "target": self.goal.label if self.goal else None,
            "verdict": self.verdict or None,
            "note": self.note,
            "unit": self.unit,
            "scale": self.scale,
            "numerator": self.numerator,
            "denominator": self.denominator,
        }


def finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def median(values: Sequence[float]) -> float:
    kept = finite(values)
    return statistics.median(kept) if kept else math.nan
