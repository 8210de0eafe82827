"""Descriptive statistics of one group of values, exactly the set the original comparator printed:
mean, standard deviation (n-1), Student-t confidence interval of the mean (90 % by default), geometric
mean, median, quartiles (linear interpolation, numpy's default), minimum and maximum."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

STAT_NAMES = ("n", "mean", "sd", "ci_low", "ci_high", "gmean", "median", "q1", "q3", "min", "max")
STAT_LABELS = {
    "n": "n",
    "mean": "mean",
    "sd": "standard deviation",
    "ci_low": "CI low",
    "ci_high": "CI high",
    "gmean": "geometric mean",
    "median": "median",
    "q1": "first quartile",
    "q3": "third quartile",
    "min": "minimum",
    "max": "maximum",
}


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    sd: float
    ci_low: float
    ci_high: float
    gmean: float
    median: float
    q1: float
    q3: float
    min: float
    max: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def describe(values: Sequence[float] | np.ndarray, confidence: float = 0.90) -> Summary:
    data = np.asarray(values, dtype=float)
    data = data[np.isfinite(data)]
    n = int(data.size)
    if n == 0:
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan)
    mean = float(data.mean())
    if n > 1:
        sd = float(data.std(ddof=1))
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    else:
        sd = half = math.nan
    positive = data[data > 0]
    gmean = float(np.exp(np.log(positive).mean())) if positive.size == n else math.nan
    q1, median, q3 = (float(v) for v in np.percentile(data, [25, 50, 75]))
    return Summary(
        n, mean, sd, mean - half, mean + half, gmean, median, q1, q3, float(data.min()), float(data.max())
    )
