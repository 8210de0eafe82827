"""The compact terminal table, in the spirit of benchstat: per operation and set the typical speed
± its interval, and against the baseline the % change with (p=... n=...), `~` when the verdict is no
significant difference, a geomean row, and footnotes for designs that cannot show a difference."""

from __future__ import annotations

import math

import numpy as np

from zbdlab.stats.compare import ALL, Analysis, center_interval
from zbdlab.stats.tests import TEST_LABELS, smallest_p

_MARKS = "¹²³⁴⁵⁶⁷⁸⁹"


def _number(value: float) -> str:
    if not math.isfinite(value):
        return "?"
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.4g}"


def _plus_minus(point: float, low: float, high: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)) or point <= 0 or high - low == 0:
        return "± ∞" if not math.isfinite(low) else "± 0%"
    pct = max(high - point, point - low) / point * 100
    return f"± {pct:.0f}%" if pct >= 9.5 else f"± {pct:.1f}%"


class _Footnotes:
    def __init__(self) -> None:
        self.texts: list[str] = []

    def mark(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return _MARKS[self.texts.index(text) % len(_MARKS)]


def _op_cells(analysis: Analysis, set_name: str, op: str) -> list:
    if set_name == analysis.baseline.name:
        return [c for c, v in analysis.cells[set_name].items() if c.operation == op and v.mean() > 0]
    return analysis.common_cells(set_name, op)


def render_terminal(analysis: Analysis) -> str:
    opts = analysis.options
    notes = _Footnotes()
    sets = analysis.sets
    rows: list[list[str]] = []
    ops = analysis.operations
    for op in ops:
        unit = analysis.units.get(op, "MB/s")
        row = [op if unit == "MB/s" else f"{op} [{unit}]"]
        for data in sets:
            cells = _op_cells(analysis, data.name, op)
            point, low, high = center_interval(analysis, data.name, cells)
            if not cells:
                row.append("-")
                if data is not analysis.baseline:
                    row.append("")
                continue
            runs = min(analysis.cells[data.name][c].size for c in cells)
            center = f"{_number(point)} {_plus_minus(point, low, high)}"
            if runs < 2:
                center = f"{_number(point)} ± ∞ " + notes.mark(
                    "fewer than 2 runs per cell: no interval, no test"
                )
            row.append(center)
            if data is analysis.baseline:
                continue
            row.append(_versus(analysis, data.name, op, notes))
        rows.append(row)
    rows.append(_geomean_row(analysis, notes))
    header_names = [""]
    header_units = [""]
    for data in sets:
        header_names.append(data.name)
        header_units.append("MB/s" if all(analysis.units.get(o) == "MB/s" for o in ops) else "speed")
        if data is not analysis.baseline:
            header_names.append("")
            header_units.append("vs base")
    table = _layout([header_names, header_units, *rows], len(sets))
    conf = round(opts.confidence * 100)
    lines = [
        f"baseline: {analysis.baseline.name}; speed = geomean over cells of per-cell means "
        f"(IOzone KB/s / 1024 = MB/s) ± {conf}% bootstrap CI",
        f"vs base = geomean of per-cell ratios; `~` = no significant difference (margin "
        f"±{opts.margin * 100:g}%); n = runs base+set per cell, c = cells",
        *table,
    ]
    lines += [f"{_MARKS[i]} {text}" for i, text in enumerate(notes.texts)]
    return "\n".join(lines) + "\n"


def _versus(analysis: Analysis, set_name: str, op: str, notes: _Footnotes) -> str:
    primary = analysis.primary(set_name, op)
    if primary is None:
        return ""
    stats = f"(p={primary.p:.3f} n={primary.runs} c={primary.cells})"
    margin = f"±{analysis.options.margin * 100:g}%"
    if primary.significant:
        text = f"{(primary.ratio - 1) * 100:+.2f}% {stats}"
    else:
        text = f"~ {stats}"
        if primary.qualifier == "below margin":
            text += " " + notes.mark(f"the interval excludes 0% but the change is inside the {margin} margin")
        elif primary.qualifier == "inconclusive":
            text += " " + notes.mark(f"inconclusive: the interval reaches beyond {margin}; more runs needed")
    n_base, n_set = (int(x) for x in primary.runs.split("+"))
    floor = smallest_p(n_base, n_set, analysis.options.test)
    if math.isfinite(floor) and floor >= analysis.options.alpha:
        text += " " + notes.mark(
            f"{TEST_LABELS[analysis.options.test]} with {n_base}+{n_set} runs cannot reach p < "
            f"{analysis.options.alpha:g} (smallest p = {floor:.3g}): per-cell tests can never be significant"
        )
    return text


def _geomean_row(analysis: Analysis, notes: _Footnotes) -> list[str]:
    row = ["geomean"]
    throughput = [op for op in analysis.operations if analysis.units.get(op) == "MB/s"]
    for data in analysis.sets:
        centers = [
            center_interval(analysis, data.name, _op_cells(analysis, data.name, op))[0] for op in throughput
        ]
        centers = [c for c in centers if math.isfinite(c) and c > 0]
        row.append(_number(float(np.exp(np.mean(np.log(centers))))) if centers else "-")
        if data is analysis.baseline:
            continue
        overall = analysis.primary(data.name, ALL)
        if overall is None:
            row.append("")
        elif overall.significant:
            row.append(f"{(overall.ratio - 1) * 100:+.2f}%")
        else:
            row.append("~")
    return row


def _layout(rows: list[list[str]], set_count: int) -> list[str]:
    # Column groups: name | baseline | (set, vs base) per other set, separated by "│" like benchstat.
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for index, r in enumerate(rows):
        header = index < 2
        parts = [r[0].ljust(widths[0])]
        parts.append(r[1].center(widths[1]) if header else r[1].rjust(widths[1]))
        for k in range(set_count - 1):
            a, b = 2 + 2 * k, 3 + 2 * k
            if header:
                parts.append(f"{r[a].center(widths[a])}  {r[b].ljust(widths[b])}")
            else:
                parts.append(f"{r[a].rjust(widths[a])}  {r[b].ljust(widths[b])}")
        out.append((" │ ".join(parts) + " │").rstrip())
    return out
