"""Every table of a comparison as plain rows, so CSV, TSV, JSON and HTML all print the same numbers.

Descriptive tables pool the runs of the cells they aggregate (as the original comparator did) and are
descriptive only; every comparison row is built cell by cell (ratios of per-cell means, per-cell tests).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from zbdlab.parsers.model import CellKey
from zbdlab.report.lead import Lead
from zbdlab.stats.compare import ALL, Analysis, ratio_interval
from zbdlab.stats.describe import STAT_NAMES, describe
from zbdlab.stats.tests import TEST_LABELS

METRIC_LABELS = {
    "cpu_s_per_gb": "CPU s per GB moved",
    "write_amplification": "backing bytes written per byte written",
    "physical_mb": "physical space used (MB)",
    "compression_ratio": "compression ratio",
    "dedup_ratio": "dedup ratio (ZFS pool)",
    "latency_p50_us": "latency p50 (us)",
    "latency_p95_us": "latency p95 (us)",
    "latency_p99_us": "latency p99 (us)",
    "latency_p999_us": "latency p99.9 (us)",
}


@dataclass
class Table:
    name: str  # file stem
    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


def _pooled(cells: dict[CellKey, np.ndarray], keep: Callable[[CellKey], bool]) -> np.ndarray:
    parts = [v for c, v in cells.items() if keep(c)]
    return np.concatenate(parts) if parts else np.array([])


def _stat_row(values: np.ndarray, confidence: float) -> list[Any]:
    return list(describe(values, confidence).as_dict().values())


def cell_stats(analysis: Analysis) -> Table:
    rows = []
    for data in analysis.sets:
        for cell, values in analysis.cells[data.name].items():
            if cell.operation in analysis.units:
                rows.append(
                    [data.name, cell.operation, cell.file_size_kb, cell.record_size_kb]
                    + _stat_row(values, analysis.options.confidence)
                )
    columns = ["set", "operation", "file_size_kb", "record_size_kb", *STAT_NAMES]
    return Table("cells", "Per cell: statistics over runs", columns, rows)


def _sizes(analysis: Analysis, op: str, attr: str) -> list[int | None]:
    values = {getattr(c, attr) for cells in analysis.cells.values() for c in cells if c.operation == op}
    return sorted(values, key=lambda v: -1 if v is None else v)


def aggregated_stats(analysis: Analysis, attr: str) -> Table:
    label = "file_size_kb" if attr == "file_size_kb" else "record_size_kb"
    rows = []
    for op in analysis.operations:
        for size in _sizes(analysis, op, attr):
            for data in analysis.sets:
                values = _pooled(
                    analysis.cells[data.name],
                    lambda c, op=op, size=size: c.operation == op and getattr(c, attr) == size,
                )
                if values.size:
                    rows.append([op, size, data.name] + _stat_row(values, analysis.options.confidence))
    name = "by_file_size" if attr == "file_size_kb" else "by_record_size"
    pooled = "record sizes" if attr == "file_size_kb" else "file sizes"
    title = f"Per operation and {label.replace('_kb', '').replace('_', ' ')}: all {pooled} and runs pooled"
    return Table(name, title, ["operation", label, "set", *STAT_NAMES], rows, note="descriptive only")


def operation_stats(analysis: Analysis) -> Table:
    rows = []
    for op in [*analysis.operations, ALL]:
        for data in analysis.sets:
            if op == ALL:
                values = _pooled(
                    analysis.cells[data.name], lambda c: analysis.units.get(c.operation) == "MB/s"
                )
            else:
                values = _pooled(analysis.cells[data.name], lambda c, op=op: c.operation == op)
            if values.size:
                rows.append([op, data.name] + _stat_row(values, analysis.options.confidence))
    return Table(
        "by_operation",
        "Per operation (and ALL operations): all cells and runs pooled",
        ["operation", "set", *STAT_NAMES],
        rows,
        note="descriptive only, as the original's summary; ALL pools every MB/s operation",
    )


def _comparison_row(analysis: Analysis, set_name: str, cells: list[CellKey]) -> list[Any]:
    base = analysis.baseline.name
    pooled_b = np.concatenate([analysis.cells[base][c] for c in cells])
    pooled_s = np.concatenate([analysis.cells[set_name][c] for c in cells])
    median_change = (np.median(pooled_s) / np.median(pooled_b) - 1) * 100
    ratio, low, high = ratio_interval(analysis, set_name, cells)
    wanted = set(cells)
    tests = [t for t in analysis.tests_for(set_name) if t.cell in wanted]
    alpha = analysis.options.alpha
    faster = sum(1 for t in tests if t.significant(alpha) and t.mean_set > t.mean_baseline)
    slower = sum(1 for t in tests if t.significant(alpha) and t.mean_set < t.mean_baseline)
    return [len(cells), float(median_change), ratio, low, high, faster, slower]


COMPARISON_COLUMNS = [
    "cells",
    "median_change_pct",
    "ratio_geomean",
    "ratio_ci_low",
    "ratio_ci_high",
    "cells_faster",
    "cells_slower",
]


def aggregated_comparison(analysis: Analysis, attr: str | None) -> Table:
    """Per aggregation column: the original's % difference of pooled medians next to our cell-wise
    geometric-mean ratio and the count of cells that differ after BH control."""
    rows = []
    for data in analysis.others:
        for op in analysis.operations:
            common = analysis.common_cells(data.name, op)
            if not common:
                continue
            groups = _sizes(analysis, op, attr) if attr else [None]
            for size in groups:
                cells = [c for c in common if attr is None or getattr(c, attr) == size]
                if cells:
                    key = [size] if attr else []
                    rows.append([data.name, op, *key, *_comparison_row(analysis, data.name, cells)])
        if attr is None:
            every = [c for c in analysis.common_cells(data.name) if analysis.units.get(c.operation) == "MB/s"]
            if every:
                rows.append([data.name, ALL, *_comparison_row(analysis, data.name, every)])
    label = {None: None, "file_size_kb": "file_size_kb", "record_size_kb": "record_size_kb"}[attr]
    columns = ["set", "operation", *([label] if label else []), *COMPARISON_COLUMNS]
    name = {None: "operation_vs_base", "file_size_kb": "file_size_vs_base"}.get(attr, "record_size_vs_base")
    title = "Against the baseline" + (f", per {label.replace('_kb', '').replace('_', ' ')}" if label else "")
    return Table(name, title, columns, rows)


def primary_table(analysis: Analysis) -> Table:
    conf = round(analysis.options.confidence * 100)
    rows = [
        [
            p.set_name,
            p.operation,
            p.cells,
            p.runs,
            p.ratio,
            p.ci_low,
            p.ci_high,
            (p.ratio - 1) * 100,
            p.p,
            p.q,
            p.verdict,
            p.qualifier,
        ]
        for p in analysis.primaries
    ]
    columns = [
        "set",
        "operation",
        "cells",
        "runs",
        "ratio",
        "ci_low",
        "ci_high",
        "change_pct",
        "p_bootstrap",
        "q_bh",
        "verdict",
        "qualifier",
    ]
    note = (
        f"Geometric mean over cells of set/baseline ratios of per-cell means; {conf} % percentile-bootstrap "
        f"interval ({analysis.options.bootstrap} replicates, runs resampled within cells, seed "
        f"{analysis.options.seed}); margin ±{analysis.options.margin * 100:g} %; q = bootstrap p adjusted "
        f"(Benjamini-Hochberg) over the set's comparisons; faster or slower only when q < "
        f"{analysis.options.alpha:g}."
    )
    return Table("primary", "Primary comparison per operation", columns, rows, note=note)


def lead_table(lead: Lead) -> Table:
    """The lead of the report: per target space saved, speed vs the baseline and vs its transport
    baseline (primary comparison over all operations), one verdict each."""
    rows = []
    for r in lead.rows:
        b, t = r.vs_base, r.vs_transport
        rows.append(
            [
                r.name,
                r.role,
                r.compression_ratio,
                r.saved_pct,
                r.space,
                b.ratio if b else None,
                b.ci_low if b else None,
                b.ci_high if b else None,
                b.q if b else None,
                r.verdict_base,
                r.transport,
                t.ratio if t else None,
                t.ci_low if t else None,
                t.ci_high if t else None,
                t.q if t else None,
                r.verdict_transport,
            ]
        )
    columns = [
        "set",
        "role",
        "compression_ratio",
        "space_saved_pct",
        "space",
        "speed_vs_base",
        "speed_vs_base_ci_low",
        "speed_vs_base_ci_high",
        "speed_vs_base_q",
        "verdict_vs_base",
        "transport_baseline",
        "speed_vs_transport",
        "speed_vs_transport_ci_low",
        "speed_vs_transport_ci_high",
        "speed_vs_transport_q",
        "verdict_vs_transport",
    ]
    note = (
        f"Baseline {lead.baseline}. Speed: primary comparison over all throughput operations (ratio of "
        "geometric means of per-cell means); space saved = 1 - 1/median compression ratio."
    )
    return Table("lead", "Each target: space saved and speed, one verdict each", columns, rows, note=note)


def cell_tests_table(analysis: Analysis) -> Table:
    alpha = analysis.options.alpha
    rows = [
        [
            t.set_name,
            t.cell.operation,
            t.cell.file_size_kb,
            t.cell.record_size_kb,
            t.n_baseline,
            t.n_set,
            t.mean_baseline,
            t.mean_set,
            t.change_pct,
            t.p,
            t.q,
            t.smallest_p,
            t.significant(alpha),
        ]
        for t in analysis.cell_tests
    ]
    columns = [
        "set",
        "operation",
        "file_size_kb",
        "record_size_kb",
        "n_baseline",
        "n_set",
        "mean_baseline",
        "mean_set",
        "change_pct",
        "p",
        "q_bh",
        "smallest_reachable_p",
        "significant",
    ]
    note = (
        f"{TEST_LABELS[analysis.options.test]} per cell, two-sided; Benjamini-Hochberg q over all cells of "
        f"one set; significant when q < {alpha:g}."
    )
    return Table("cell_tests", "Per-cell tests against the baseline", columns, rows, note=note)


def slope_table(analysis: Analysis) -> Table:
    rows = [
        [
            s.set_name,
            s.operation,
            s.cells,
            s.slope,
            s.ci_low,
            s.ci_high,
            s.log_ratio,
            s.log_slope,
            s.log_ci_low,
            s.log_ci_high,
        ]
        for s in analysis.slopes
    ]
    columns = [
        "set",
        "operation",
        "cells",
        "slope",
        "slope_ci_low",
        "slope_ci_high",
        "log_fit_ratio",
        "log_log_slope",
        "log_log_ci_low",
        "log_log_ci_high",
    ]
    note = (
        "Orthogonal fit y = a*x of per-cell means (x baseline, y set) through the origin; on log scale "
        "log y = log a + log x (a = geometric mean ratio) and the free orthogonal line log y = c + d log x "
        "(d = 1 when the change is the same fraction at every speed). Bootstrap intervals."
    )
    return Table("slopes", "Baseline-vs-set slopes", columns, rows, note=note)


def metrics_table(analysis: Analysis) -> Table:
    """Efficiency metrics (zbdlab results, fio): medians over cells and runs, and vs baseline the
    geometric mean of per-cell ratios of metric means."""
    per_set: dict[str, dict[tuple[str, str], dict[CellKey, list[float]]]] = {}
    for data in analysis.sets:
        table = per_set.setdefault(data.name, {})
        for sample in data.samples:
            for metric, value in sample.metrics.items():
                if math.isfinite(value):
                    table.setdefault((sample.cell.operation, metric), {}).setdefault(sample.cell, []).append(
                        value
                    )
    base = per_set.get(analysis.baseline.name, {})
    rows = []
    keys = sorted(
        {k for t in per_set.values() for k in t},
        key=lambda k: (analysis.operations.index(k[0]) if k[0] in analysis.operations else 999, k),
    )
    for op, metric in keys:
        for data in analysis.sets:
            cells = per_set[data.name].get((op, metric))
            if not cells:
                continue
            values = np.concatenate([np.asarray(v) for v in cells.values()])
            q1, median, q3 = np.percentile(values, [25, 50, 75])
            change = math.nan
            base_cells = base.get((op, metric), {})
            ratios = [
                np.mean(cells[c]) / np.mean(base_cells[c])
                for c in cells
                if c in base_cells and np.mean(base_cells[c]) > 0 and np.mean(cells[c]) > 0
            ]
            if ratios and data.name != analysis.baseline.name:
                change = (float(np.exp(np.mean(np.log(ratios)))) - 1) * 100
            rows.append(
                [op, METRIC_LABELS.get(metric, metric), data.name, values.size, median, q1, q3, change]
            )
    columns = ["operation", "metric", "set", "n", "median", "q1", "q3", "change_vs_base_pct"]
    return Table("metrics", "Efficiency: CPU, write amplification, space, latency", columns, rows)


def mismatch_table(analysis: Analysis) -> Table:
    rows = [[m] for m in analysis.mismatches]
    for data in analysis.sets:
        rows += [[f"{data.name}: {w}"] for w in data.warnings]
    return Table("warnings", "Input mismatches and warnings", ["message"], rows)


def all_tables(analysis: Analysis) -> list[Table]:
    return [
        primary_table(analysis),
        aggregated_comparison(analysis, None),
        slope_table(analysis),
        operation_stats(analysis),
        aggregated_stats(analysis, "file_size_kb"),
        aggregated_comparison(analysis, "file_size_kb"),
        aggregated_stats(analysis, "record_size_kb"),
        aggregated_comparison(analysis, "record_size_kb"),
        cell_stats(analysis),
        cell_tests_table(analysis),
        metrics_table(analysis),
        mismatch_table(analysis),
    ]
