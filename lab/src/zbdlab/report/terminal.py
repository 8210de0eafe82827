"""The terminal report: first the lead table (each target's space saved and speed against the
baseline and its transport baseline, one verdict each), then the note on how verdicts are reached,
then the compact per-operation table in the spirit of benchstat: per operation and set the typical
speed ± its interval and against the baseline the % change with its adjusted p (q), `~` when there is
no verdict, a geomean row, footnotes. Every line fits `width` columns (120): the per-operation table
is cut into groups of sets, each repeating the operation and baseline columns."""

from __future__ import annotations

import math
import textwrap

import numpy as np

from zbdlab.report.lead import Lead, LeadRow, build_lead, significance_note
from zbdlab.stats.compare import ALL, Analysis, Primary, center_interval

WIDTH = 120
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


def render_terminal(analysis: Analysis, lead: Lead | None = None, width: int = WIDTH) -> str:
    lead = lead if lead is not None else build_lead(analysis)
    lines = lead_lines(analysis, lead, width)
    for paragraph in significance_note(analysis):
        lines += textwrap.wrap(paragraph, width)
    lines += ["", *operation_lines(analysis, width)]
    return "\n".join(lines) + "\n"


def _speed(p: Primary | None) -> str:
    if p is None:
        return "-"
    digits = 1 if (p.ci_high - p.ci_low) * 100 < 2 else 0  # a narrow interval keeps one decimal
    return f"{p.ratio * 100:.{digits}f} % [{p.ci_low * 100:.{digits}f}-{p.ci_high * 100:.{digits}f}]"


def lead_cells(row: LeadRow, with_transport: bool, with_space: bool = True) -> list[str]:
    ratio = row.compression_ratio
    space = f"{round(row.saved_pct) + 0} % ({ratio:.2f}:1)" if math.isfinite(ratio) else "-"
    cells = [row.name, space] if with_space else [row.name]
    if row.role == "baseline":
        cells += ["100 %", "(baseline)"]
    else:
        cells += [_speed(row.vs_base), row.verdict_base]
    if with_transport:
        if row.role == "transport baseline":
            cells += ["100 %", "(transport baseline)"]
        elif row.transport:
            cells += [_speed(row.vs_transport), row.verdict_transport]
        else:
            cells += ["", ""]
    return cells


def lead_lines(analysis: Analysis, lead: Lead, width: int = WIDTH) -> list[str]:
    with_transport = any(r.transport for r in lead.rows)
    with_space = any(math.isfinite(r.compression_ratio) for r in lead.rows)
    conf = round(analysis.options.confidence * 100)
    intro = f"Each target against {lead.baseline}" + (
        " and against its transport baseline (the same filesystem on nbdkit file through zbd's NBD attach"
        " path)."
        if with_transport
        else "."
    )
    intro += " Space saved = 1 - 1/compression ratio (median over runs)." if with_space else ""
    intro += f" Speed = all operations together, in % of the reference's speed [{conf} % CI]."
    header = ["target", "space saved", f"speed vs {lead.baseline}", "verdict"]
    if not with_space:
        header.remove("space saved")
    if with_transport:
        header += ["vs transport", "verdict"]
    rows = [header] + [lead_cells(r, with_transport, with_space) for r in lead.rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    right = {1, 2, 4} if with_space else {1, 3}
    table = []
    for index, r in enumerate(rows):
        cells = [
            c.rjust(w) if i in right and index else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        table.append("  ".join(cells).rstrip())
        if index == 0:
            table.append("  ".join("-" * w for w in widths))
    return [*textwrap.wrap(intro, width), *table, ""]


def operation_lines(analysis: Analysis, width: int = WIDTH) -> list[str]:
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
            header_units.append(_runs_label(analysis, data.name))
    conf = round(opts.confidence * 100)
    intro = (
        f"Per operation: speed = geomean over cells of per-cell means (IOzone KB/s / 1024 = MB/s) ± {conf}% "
        f"bootstrap CI; vs {analysis.baseline.name} = change of the geomean of per-cell ratios, "
        "q = adjusted p, "
        f"`~` = no verdict; n = runs {analysis.baseline.name}+set per cell."
    )
    lines = textwrap.wrap(intro, width)
    for group in _groups([header_names, header_units, *rows], len(sets), width):
        lines += _layout([header_names, header_units, *rows], group)
    lines += [f"{_MARKS[i]} {text}" for i, text in enumerate(notes.texts)]
    return lines


def _runs_label(analysis: Analysis, set_name: str) -> str:
    runs = sorted({p.runs for p in analysis.primaries if p.set_name == set_name and p.runs})
    return f"vs base n={runs[0]}" if len(runs) == 1 else "vs base n=" + "/".join(runs)


def _versus(analysis: Analysis, set_name: str, op: str, notes: _Footnotes) -> str:
    primary = analysis.primary(set_name, op)
    if primary is None:
        return ""
    stats = f"(q={primary.q:.3f})"
    margin = f"±{analysis.options.margin * 100:g}%"
    if primary.significant:
        return f"{(primary.ratio - 1) * 100:+.2f}% {stats}"
    text = f"~ {stats}"
    if primary.qualifier == "below margin":
        text += " " + notes.mark(f"the interval excludes 0% but the change is inside the {margin} margin")
    elif primary.qualifier == "inconclusive":
        text += " " + notes.mark(
            f"no verdict: the change may exceed {margin} but q or the interval does not show it"
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


def _widths(rows: list[list[str]]) -> list[int]:
    return [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]


def _groups(rows: list[list[str]], set_count: int, width: int) -> list[list[int]]:
    """The other sets (indexes 0..set_count-2) cut into groups so each table line fits `width`."""
    widths = _widths(rows)
    fixed = widths[0] + 3 + widths[1] + 2  # "name │ baseline │"
    groups: list[list[int]] = [[]]
    used = fixed
    for k in range(set_count - 1):
        need = 1 + widths[2 + 2 * k] + 2 + widths[3 + 2 * k] + 2  # " set  vs │"
        if groups[-1] and used + need > width:
            groups.append([])
            used = fixed
        groups[-1].append(k)
        used += need
    return groups


def _layout(rows: list[list[str]], group: list[int]) -> list[str]:
    # Column groups: name | baseline | (set, vs base) per other set, separated by "│" like benchstat.
    widths = _widths(rows)
    out = [""] if group and group[0] > 0 else []
    for index, r in enumerate(rows):
        header = index < 2
        parts = [r[0].ljust(widths[0])]
        parts.append(r[1].center(widths[1]) if header else r[1].rjust(widths[1]))
        for k in group:
            a, b = 2 + 2 * k, 3 + 2 * k
            if header:
                parts.append(f"{r[a].center(widths[a])}  {r[b].ljust(widths[b])}")
            else:
                parts.append(f"{r[a].rjust(widths[a])}  {r[b].ljust(widths[b])}")
        out.append((" │ ".join(parts) + " │").rstrip())
    return out
