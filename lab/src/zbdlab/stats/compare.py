"""The comparison engine: N sets against the first (the baseline), cell by cell.

Primary comparison (declared in advance, one per operation): the geometric mean over cells of the
ratio set/baseline of per-cell means, with a percentile-bootstrap confidence interval that resamples
runs within each cell of each set (seeded). Its two-sided bootstrap p is adjusted with
Benjamini-Hochberg over all primary comparisons of one set against the baseline (q). Verdict from q,
the interval and the equivalence margin:

  faster   q < alpha, the interval lies above 1 and the estimate is at least 1 + margin
  slower   q < alpha, the interval lies below 1 and the estimate is at most 1 - margin
  no significant difference   otherwise, qualified as
           "equivalent"   the whole interval lies inside [1 - margin, 1 + margin]
           "below margin" the interval excludes 1 but the estimate lies inside the margin
           "inconclusive" the change may exceed the margin but q or the interval does not show it
                          (more runs needed)

Faster and slower need q, the interval and the margin to agree, so a verdict never contradicts the
interval or the adjusted p printed beside it (with the defaults, confidence 0.90 <= 1 - alpha, q < alpha
alone already puts the interval beyond 1).

Secondary: per-cell tests (Mann-Whitney U or Welch) with Benjamini-Hochberg control over all cells of
one set-vs-baseline comparison; orthogonal slopes of per-cell means with bootstrap intervals.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from zbdlab.parsers.model import CellKey, DataSet, operation_order
from zbdlab.stats.slope import tls_line, tls_through_origin
from zbdlab.stats.tests import benjamini_hochberg, cell_test, smallest_p

ALL = "ALL"


@dataclass(frozen=True)
class Options:
    margin: float = 0.02
    confidence: float = 0.90
    alpha: float = 0.05
    test: str = "mwu"
    bootstrap: int = 2000
    seed: int = 1


@dataclass
class Primary:
    set_name: str
    operation: str
    cells: int
    ratio: float
    ci_low: float
    ci_high: float
    p: float  # two-sided percentile-bootstrap p, unadjusted
    verdict: str  # "faster" | "slower" | "no significant difference"
    qualifier: str  # "" | "equivalent" | "below margin" | "inconclusive"
    center_baseline: float  # geometric mean of per-cell means over the compared cells
    center_set: float
    center_set_ci: tuple[float, float]
    center_baseline_ci: tuple[float, float]
    runs: str  # e.g. "5+5" (median runs per cell)
    q: float = math.nan  # p adjusted (Benjamini-Hochberg) over the set's primary comparisons

    @property
    def significant(self) -> bool:
        return self.verdict in ("faster", "slower")


@dataclass
class CellTest:
    set_name: str
    cell: CellKey
    n_baseline: int
    n_set: int
    mean_baseline: float
    mean_set: float
    p: float
    q: float = math.nan
    smallest_p: float = math.nan

    @property
    def change_pct(self) -> float:
        return (self.mean_set / self.mean_baseline - 1) * 100 if self.mean_baseline > 0 else math.nan

    def significant(self, alpha: float) -> bool:
        return bool(np.isfinite(self.q) and self.q < alpha)


@dataclass
class Slope:
    set_name: str
    operation: str
    cells: int
    slope: float
    ci_low: float
    ci_high: float
    log_slope: float  # orthogonal fit of log y = c + d log x; d = 1 when the ratio is uniform
    log_ci_low: float
    log_ci_high: float
    log_ratio: float  # exp(c) with d fixed at 1 = the geometric mean of cell ratios


@dataclass
class Analysis:
    sets: list[DataSet]
    options: Options
    cells: dict[str, dict[CellKey, np.ndarray]]
    operations: list[str]
    units: dict[str, str]
    boot: dict[str, dict[CellKey, np.ndarray]]
    primaries: list[Primary] = field(default_factory=list)
    cell_tests: list[CellTest] = field(default_factory=list)
    slopes: list[Slope] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    @property
    def baseline(self) -> DataSet:
        return self.sets[0]

    @property
    def others(self) -> list[DataSet]:
        return self.sets[1:]

    def common_cells(self, set_name: str, operation: str | None = None) -> list[CellKey]:
        base, other = self.cells[self.baseline.name], self.cells[set_name]
        return sorted(
            c
            for c in base
            if c in other
            and c.operation in self.units
            and (operation is None or c.operation == operation)
            and base[c].mean() > 0
            and other[c].mean() > 0
        )

    def primary(self, set_name: str, operation: str) -> Primary | None:
        return next((p for p in self.primaries if p.set_name == set_name and p.operation == operation), None)

    def tests_for(self, set_name: str, operation: str | None = None) -> list[CellTest]:
        return [
            t
            for t in self.cell_tests
            if t.set_name == set_name and (operation is None or t.cell.operation == operation)
        ]


def group_cells(data: DataSet) -> dict[CellKey, np.ndarray]:
    grouped: dict[CellKey, list[float]] = defaultdict(list)
    for sample in data.samples:
        grouped[sample.cell].append(sample.value)
    return {cell: np.asarray(values, dtype=float) for cell, values in sorted(grouped.items())}


def _bootstrap_means(cells: dict[CellKey, np.ndarray], replicates: int, rng: np.random.Generator):
    """Per cell, `replicates` means of the cell's runs resampled with replacement."""
    out = {}
    for cell, values in cells.items():
        idx = rng.integers(0, values.size, size=(replicates, values.size))
        out[cell] = values[idx].mean(axis=1)
    return out


def _find_mismatches(sets: list[DataSet], cells: dict[str, dict[CellKey, np.ndarray]]) -> list[str]:
    messages = []
    base = sets[0]
    base_ops = set(base.operations())
    for data in sets[1:]:
        ops = set(data.operations())
        if missing := sorted(base_ops - ops, key=operation_order):
            messages.append(f"{data.name} lacks operations of {base.name}: {', '.join(missing)}")
        if extra := sorted(ops - base_ops, key=operation_order):
            messages.append(f"{data.name} has operations {base.name} lacks: {', '.join(extra)}")
        for op in sorted(base_ops & ops, key=operation_order):
            in_base = {c for c in cells[base.name] if c.operation == op}
            in_set = {c for c in cells[data.name] if c.operation == op}
            only_base, only_set = len(in_base - in_set), len(in_set - in_base)
            if only_base or only_set:
                messages.append(
                    f"{op}: {len(in_base & in_set)} cells in common; {only_base} only in {base.name}, "
                    f"{only_set} only in {data.name} (compared: the common ones)"
                )
    return messages


def _units(sets: list[DataSet], mismatches: list[str]) -> dict[str, str]:
    units: dict[str, str] = {}
    conflicts = set()
    for data in sets:
        for op, unit in data.units().items():
            if units.setdefault(op, unit) != unit:
                conflicts.add(op)
    for op in sorted(conflicts):
        mismatches.append(f"{op}: measured in different units across sets; not compared")
        units.pop(op)
    return units


def _interval(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2 * 100
    low, high = np.nanpercentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def _verdict(ratio: float, low: float, high: float, margin: float, q: float, alpha: float) -> tuple[str, str]:
    shown = math.isfinite(q) and q < alpha
    if shown and low > 1 and ratio >= 1 + margin:
        return "faster", ""
    if shown and high < 1 and ratio <= 1 - margin:
        return "slower", ""
    if 1 - margin <= low and high <= 1 + margin:
        return "no significant difference", "equivalent"
    if (low > 1 or high < 1) and 1 - margin < ratio < 1 + margin:
        return "no significant difference", "below margin"
    return "no significant difference", "inconclusive"


def _bootstrap_p(draws: np.ndarray) -> float:
    """Two-sided percentile-bootstrap p for ratio = 1 (the level at which the interval reaches 1)."""
    below, above = float(np.mean(draws <= 1)), float(np.mean(draws >= 1))
    return max(min(1.0, 2 * min(below, above)), 1.0 / draws.size)


def _log_matrix(boot: dict[CellKey, np.ndarray], cells: list[CellKey]) -> np.ndarray:
    return np.log(np.stack([boot[c] for c in cells], axis=1))


def _group_logs(analysis: Analysis, set_name: str, groups: list[list[CellKey]]) -> tuple[float, np.ndarray]:
    """Mean over groups of the mean log cell mean: the point estimate and its bootstrap draws.
    One group is one operation; several groups weigh operations equally (the geomean row)."""
    cells, boot = analysis.cells[set_name], analysis.boot[set_name]
    point = np.mean([np.mean(np.log([cells[c].mean() for c in group])) for group in groups])
    draws = np.mean([_log_matrix(boot, group).mean(axis=1) for group in groups], axis=0)
    return float(point), draws


def _primary(analysis: Analysis, data: DataSet, operation: str, groups: list[list[CellKey]]) -> Primary:
    log_b, boot_b = _group_logs(analysis, analysis.baseline.name, groups)
    log_s, boot_s = _group_logs(analysis, data.name, groups)
    draws = np.exp(boot_s - boot_b)
    ratio = float(np.exp(log_s - log_b))
    low, high = _interval(draws, analysis.options.confidence)
    runs = ""
    if len(groups) == 1:
        n_b = int(np.median([analysis.cells[analysis.baseline.name][c].size for c in groups[0]]))
        n_s = int(np.median([analysis.cells[data.name][c].size for c in groups[0]]))
        runs = f"{n_b}+{n_s}"
    return Primary(
        data.name,
        operation,
        sum(len(group) for group in groups),
        ratio,
        low,
        high,
        _bootstrap_p(draws),
        "",  # verdict and qualifier: by _adjust, once every comparison of the set has its p
        "",
        float(np.exp(log_b)),
        float(np.exp(log_s)),
        _interval(np.exp(boot_s), analysis.options.confidence),
        _interval(np.exp(boot_b), analysis.options.confidence),
        runs,
    )


def _adjust(primaries: list[Primary], options: Options) -> None:
    """Benjamini-Hochberg over one set's primary comparisons, then each verdict from its q."""
    qvalues = benjamini_hochberg(np.array([p.p for p in primaries]))
    for primary, q in zip(primaries, qvalues, strict=True):
        primary.q = float(q)
        primary.verdict, primary.qualifier = _verdict(
            primary.ratio, primary.ci_low, primary.ci_high, options.margin, primary.q, options.alpha
        )


def _slope(analysis: Analysis, data: DataSet, operation: str, cells: list[CellKey]) -> Slope | None:
    if len(cells) < 2:
        return None
    x = np.array([analysis.cells[analysis.baseline.name][c].mean() for c in cells])
    y = np.array([analysis.cells[data.name][c].mean() for c in cells])
    bx = np.exp(_log_matrix(analysis.boot[analysis.baseline.name], cells))
    by = np.exp(_log_matrix(analysis.boot[data.name], cells))
    conf = analysis.options.confidence
    log_d, _ = tls_line(np.log(x), np.log(y))
    boot_log_d, _ = tls_line(np.log(bx), np.log(by))
    return Slope(
        data.name,
        operation,
        len(cells),
        float(tls_through_origin(x, y)),
        *_interval(tls_through_origin(bx, by), conf),
        float(log_d),
        *_interval(boot_log_d, conf),
        float(np.exp(np.mean(np.log(y) - np.log(x)))),
    )


def _cell_tests(analysis: Analysis, data: DataSet) -> list[CellTest]:
    base_cells, set_cells = analysis.cells[analysis.baseline.name], analysis.cells[data.name]
    test = analysis.options.test
    results = []
    for cell in analysis.common_cells(data.name):
        b, s = base_cells[cell], set_cells[cell]
        results.append(
            CellTest(
                data.name,
                cell,
                b.size,
                s.size,
                float(b.mean()),
                float(s.mean()),
                cell_test(b, s, test),
                smallest_p=smallest_p(b.size, s.size, test),
            )
        )
    qvalues = benjamini_hochberg(np.array([r.p for r in results]))
    for result, q in zip(results, qvalues, strict=True):
        result.q = float(q)
    return results


def analyse(sets: list[DataSet], options: Options) -> Analysis:
    if len(sets) < 2:
        raise ValueError("a comparison needs at least two sets")
    cells = {data.name: group_cells(data) for data in sets}
    mismatches = _find_mismatches(sets, cells)
    units = _units(sets, mismatches)
    rng = np.random.default_rng(options.seed)
    boot = {data.name: _bootstrap_means(cells[data.name], options.bootstrap, rng) for data in sets}
    operations = sorted({op for data in sets for op in data.operations() if op in units}, key=operation_order)
    analysis = Analysis(sets, options, cells, operations, units, boot, mismatches=mismatches)
    for data in analysis.others:
        per_op: dict[str, list[CellKey]] = {}
        for op in operations:
            common = analysis.common_cells(data.name, op)
            if not common:
                continue
            per_op[op] = common
            analysis.primaries.append(_primary(analysis, data, op, [common]))
            if (slope := _slope(analysis, data, op, common)) is not None:
                analysis.slopes.append(slope)
        if not per_op:
            analysis.mismatches.append(f"{data.name}: no cell in common with {analysis.baseline.name}")
        throughput_ops = {op: cs for op, cs in per_op.items() if units.get(op) == "MB/s"}
        if throughput_ops:
            analysis.primaries.append(_primary(analysis, data, ALL, list(throughput_ops.values())))
        all_cells = [c for cs in throughput_ops.values() for c in cs]
        if (slope := _slope(analysis, data, ALL, all_cells)) is not None:
            analysis.slopes.append(slope)
        _adjust([p for p in analysis.primaries if p.set_name == data.name], options)
        analysis.cell_tests.extend(_cell_tests(analysis, data))
    return analysis


def ratio_interval(analysis: Analysis, set_name: str, cells: list[CellKey]) -> tuple[float, float, float]:
    """Geometric mean of per-cell mean ratios over `cells`, with its bootstrap interval."""
    if not cells:
        return math.nan, math.nan, math.nan
    log_b, boot_b = _group_logs(analysis, analysis.baseline.name, [cells])
    log_s, boot_s = _group_logs(analysis, set_name, [cells])
    return (float(np.exp(log_s - log_b)), *_interval(np.exp(boot_s - boot_b), analysis.options.confidence))


def center_interval(analysis: Analysis, set_name: str, cells: list[CellKey]) -> tuple[float, float, float]:
    """Geometric mean of per-cell means over `cells` (the set's typical speed), with its interval."""
    if not cells:
        return math.nan, math.nan, math.nan
    point, draws = _group_logs(analysis, set_name, [cells])
    return (float(np.exp(point)), *_interval(np.exp(draws), analysis.options.confidence))


def median_ratio_interval(
    numerator: np.ndarray | list[float],
    denominator: np.ndarray | list[float],
    options: Options | None = None,
) -> tuple[float, float, float]:
    """median(numerator) / median(denominator) with a percentile-bootstrap interval (`zbdlab bench`).

    When both sides have one value per round (equal lengths), rounds are resampled in pairs, so load
    that slowed both sides of one round stays paired; otherwise each side is resampled on its own."""
    options = options or Options()
    num, den = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if num.size == 0 or den.size == 0 or np.median(den) <= 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(options.seed)
    idx_n = rng.integers(0, num.size, size=(options.bootstrap, num.size))
    idx_d = idx_n if num.size == den.size else rng.integers(0, den.size, size=(options.bootstrap, den.size))
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = np.median(num[idx_n], axis=1) / np.median(den[idx_d], axis=1)
    draws[~np.isfinite(draws)] = np.nan
    return (float(np.median(num) / np.median(den)), *_interval(draws, options.confidence))
