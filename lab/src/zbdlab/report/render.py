"""Writing a comparison out: CSV, TSV and JSON of every table, the HTML page, detail pages."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import jinja2

from zbdlab.parsers.model import CellKey, canonical_operation
from zbdlab.plots import figures
from zbdlab.report.lead import Lead, build_lead, compression_ratio, significance_note
from zbdlab.report.tables import Table, all_tables, lead_table
from zbdlab.report.terminal import lead_cells, operation_lines, render_terminal
from zbdlab.stats.compare import ALL, Analysis
from zbdlab.stats.describe import STAT_LABELS, STAT_NAMES, describe
from zbdlab.stats.tests import TEST_LABELS

_TEMPLATES = Path(__file__).parent / "templates"


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _plain(value.item())
    return value


def fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) >= 0.01 or value == 0 else f"{value:.2g}"
    return str(value)


def pct(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:+.2f} %"


def write_tables(tables: list[Table], out_dir: Path, meta: dict[str, Any]) -> None:
    table_dir = out_dir / "tables"
    table_dir.mkdir(parents=True, exist_ok=True)
    for table in tables:
        for suffix, delimiter in ((".csv", ","), (".tsv", "\t")):
            with open(table_dir / f"{table.name}{suffix}", "w", newline="") as handle:
                writer = csv.writer(handle, delimiter=delimiter, lineterminator="\n")
                writer.writerow(table.columns)
                writer.writerows(
                    [["" if _plain(v) is None else _plain(v) for v in row] for row in table.rows]
                )
    document = {
        "meta": meta,
        "tables": {
            t.name: {
                "title": t.title,
                "note": t.note,
                "columns": t.columns,
                "rows": [[_plain(v) for v in row] for row in t.rows],
            }
            for t in tables
        },
    }
    (out_dir / "comparison.json").write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")


def _meta(analysis: Analysis) -> dict[str, Any]:
    o = analysis.options
    return {
        "baseline": analysis.baseline.name,
        "sets": [
            {"name": d.name, "source": d.source, "kind": d.kind, "runs": d.runs, "samples": len(d.samples)}
            for d in analysis.sets
        ],
        "unit": "MB/s = IOzone KB/s / 1024 = bytes/s / 2^20",
        "options": {
            "margin": o.margin,
            "confidence": o.confidence,
            "alpha": o.alpha,
            "test": o.test,
            "bootstrap": o.bootstrap,
            "seed": o.seed,
        },
    }


def summary_sentences(analysis: Analysis) -> list[str]:
    """In words, per target: space saved and speed together, then which operations differ (the
    verdicts of the primary comparison; how they are reached is said once, by significance_note)."""
    o = analysis.options
    out = []
    for data in analysis.others:
        primaries = [p for p in analysis.primaries if p.set_name == data.name and p.operation != ALL]
        faster = [p for p in primaries if p.verdict == "faster"]
        slower = [p for p in primaries if p.verdict == "slower"]
        same = [p for p in primaries if not p.significant]

        def describe_list(items: list) -> str:
            return ", ".join(
                f"{p.operation} ({(p.ratio - 1) * 100:+.1f} %, CI {(p.ci_low - 1) * 100:+.1f} to "
                f"{(p.ci_high - 1) * 100:+.1f} %)"
                for p in items
            )

        overall = analysis.primary(data.name, ALL)
        lead = []
        ratio = compression_ratio(data)
        if math.isfinite(ratio):
            lead.append(f"saves {round((1 - 1 / ratio) * 100) + 0} % of space (ratio {ratio:.2f}:1)")
        if overall is not None:
            lead.append(
                f"at {overall.ratio * 100:.0f} % of the speed over all operations "
                f"(CI {overall.ci_low * 100:.0f} to {overall.ci_high * 100:.0f} %, {overall.verdict})"
            )
        parts = [f"{data.name} against {analysis.baseline.name}:"]
        if lead:
            parts.append(" ".join(lead) + ";")
        if faster:
            parts.append(f"faster in {describe_list(faster)}.")
        if slower:
            parts.append(f"slower in {describe_list(slower)}.")
        if same:
            parts.append(
                f"No verdict (within ±{o.margin * 100:g} % or not shown by the data) in "
                + ", ".join(
                    f"{p.operation}{' [inconclusive]' if p.qualifier == 'inconclusive' else ''}" for p in same
                )
                + "."
            )
        out.append(" ".join(parts))
    return out


def _interval_text(point: float, low: float, high: float) -> str:
    return f"{point:.3f} [{low:.3f}, {high:.3f}]"


def _wide(analysis: Analysis, tables: dict[str, Table], op: str, attr: str) -> dict[str, Any]:
    """The original's layout: sizes as columns, one block of statistic rows per set, then comparison rows."""
    stats_table = tables["by_file_size" if attr == "file_size_kb" else "by_record_size"]
    comparison = tables["file_size_vs_base" if attr == "file_size_kb" else "record_size_vs_base"]
    records = [r for r in stats_table.records() if r["operation"] == op]
    sizes = sorted({r[attr] for r in records}, key=lambda v: -1 if v is None else v)
    blocks = []
    for data in analysis.sets:
        by_size = {r[attr]: r for r in records if r["set"] == data.name}
        rows = [
            [STAT_LABELS[name] + (f" {round(analysis.options.confidence * 100)} %" if "ci" in name else "")]
            + [fmt(by_size[s][name]) if s in by_size else "–" for s in sizes]
            for name in STAT_NAMES
        ]
        blocks.append({"name": data.name, "rows": rows, "comparison": False})
    for data in analysis.others:
        by_size = {r[attr]: r for r in comparison.records() if r["operation"] == op and r["set"] == data.name}
        rows = [
            ["median difference (original)"]
            + [pct(by_size[s]["median_change_pct"]) if s in by_size else "–" for s in sizes],
            ["cell ratio geomean [CI]"]
            + [
                _interval_text(
                    by_size[s]["ratio_geomean"], by_size[s]["ratio_ci_low"], by_size[s]["ratio_ci_high"]
                )
                if s in by_size
                else "–"
                for s in sizes
            ],
            ["cells faster / slower (BH)"]
            + [
                f"{by_size[s]['cells_faster']} / {by_size[s]['cells_slower']}" if s in by_size else "–"
                for s in sizes
            ],
        ]
        blocks.append({"name": f"{data.name} vs {analysis.baseline.name}", "rows": rows, "comparison": True})
    return {"sizes": [figures.size_label(s) for s in sizes], "blocks": blocks}


def _summary_wide(analysis: Analysis, tables: dict[str, Table]) -> dict[str, Any]:
    ops = [ALL, *analysis.operations]
    records = tables["by_operation"].records()
    blocks = []
    for data in analysis.sets:
        by_op = {r["operation"]: r for r in records if r["set"] == data.name}
        rows = [
            [STAT_LABELS[name]] + [fmt(by_op[o][name]) if o in by_op else "–" for o in ops]
            for name in STAT_NAMES
        ]
        blocks.append({"name": data.name, "rows": rows, "comparison": False})
    comparison = tables["operation_vs_base"].records()
    for data in analysis.others:
        cmp = {r["operation"]: r for r in comparison if r["set"] == data.name}
        slopes = {s.operation: s for s in analysis.slopes if s.set_name == data.name}
        prim = {p.operation: p for p in analysis.primaries if p.set_name == data.name}
        rows = [
            ["median difference (original)"]
            + [pct(cmp[o]["median_change_pct"]) if o in cmp else "–" for o in ops],
            ["slope a of y = ax [CI]"]
            + [
                f"{slopes[o].slope:.3f} [{slopes[o].ci_low:.3f}, {slopes[o].ci_high:.3f}]"
                if o in slopes
                else "–"
                for o in ops
            ],
            ["geomean cell ratio [CI]"]
            + [
                f"{prim[o].ratio:.3f} [{prim[o].ci_low:.3f}, {prim[o].ci_high:.3f}]" if o in prim else "–"
                for o in ops
            ],
            ["q (adjusted p)"] + [fmt(prim[o].q, 4) if o in prim else "–" for o in ops],
            ["verdict"] + [prim[o].verdict if o in prim else "–" for o in ops],
        ]
        blocks.append({"name": f"{data.name} vs {analysis.baseline.name}", "rows": rows, "comparison": True})
    return {"sizes": ops, "blocks": blocks}


def _environment(analysis: Analysis) -> list[str]:
    lines = [
        f"{d.name}: {d.kind} input from {d.source}, {len(d.runs)} run(s), {len(d.samples)} values"
        for d in analysis.sets
    ]
    return lines + list(dict.fromkeys(n for d in analysis.sets for n in d.notes))


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    env.filters["fmt"] = fmt
    env.filters["pct"] = pct
    return env


def _floor_text(analysis: Analysis, set_name: str, operation: str) -> str:
    """The smallest p the per-cell tests of this operation can reach, e.g. "0.0079 with 5+5 runs"."""
    floors = sorted({(t.n_baseline, t.n_set, t.smallest_p) for t in analysis.tests_for(set_name, operation)})
    if not floors:
        return "no cell has 2 runs on both sides"
    return "; ".join(f"{p:.2g} with {nb}+{ns} runs" for nb, ns, p in floors[:3])


def _operation_sections(analysis: Analysis, tables: dict[str, Table], plots: bool) -> list[dict[str, Any]]:
    sections = []
    for op in analysis.operations:
        unit = analysis.units[op]
        section: dict[str, Any] = {
            "op": op,
            "unit": unit,
            "figures": [
                figures.quartile_plot(analysis, op, "file_size_kb", unit),
                figures.quartile_plot(analysis, op, "record_size_kb", unit),
            ]
            if plots
            else [],
            "by_file": _wide(analysis, tables, op, "file_size_kb"),
            "by_record": _wide(analysis, tables, op, "record_size_kb"),
            "pairs": [],
        }
        for data in analysis.others:
            cells = analysis.common_cells(data.name, op)
            if not cells:
                continue
            slope = next((s for s in analysis.slopes if s.set_name == data.name and s.operation == op), None)
            significant = {
                t.cell for t in analysis.tests_for(data.name, op) if t.significant(analysis.options.alpha)
            }
            pair = {
                "name": data.name,
                "primary": analysis.primary(data.name, op),
                "slope": slope,
                "scatter": figures.scatter_plot(analysis, data.name, cells, slope) if plots else None,
                "heatmap": figures.heatmap_plot(analysis, data.name, cells, significant)
                if plots
                and (len({c.file_size_kb for c in cells}) > 1 or len({c.record_size_kb for c in cells}) > 1)
                else None,
                "significant": len(significant),
                "tested": len(analysis.tests_for(data.name, op)),
                # per-cell tests that can reach alpha; when none can, significance_note says so once
                "reachable": any(
                    t.smallest_p < analysis.options.alpha for t in analysis.tests_for(data.name, op)
                ),
                "floor": _floor_text(analysis, data.name, op),
            }
            section["pairs"].append(pair)
        sections.append(section)
    return sections


def _lead_context(lead: Lead) -> dict[str, Any]:
    with_transport = any(r.transport for r in lead.rows)
    with_space = any(math.isfinite(r.compression_ratio) for r in lead.rows)
    header = ["target", *(["space saved"] if with_space else []), f"speed vs {lead.baseline}", "verdict"]
    if with_transport:
        header += ["speed vs transport baseline", "verdict"]
    rows = []
    for r in lead.rows:
        cells = lead_cells(r, with_transport, with_space)
        classes = [
            ("label " + _verdict_class(c)) if header[i] in ("target", "verdict") else ""
            for i, c in enumerate(cells)
        ]
        rows.append({"cells": cells, "role": r.role, "classes": classes})
    return {"baseline": lead.baseline, "with_transport": with_transport, "header": header, "rows": rows}


def _verdict_class(text: str) -> str:
    if text.endswith("slower") or text.startswith("larger"):
        return "slower"
    if text.endswith("faster") or text.endswith("as fast"):
        return "faster"
    return ""


def render_html(
    analysis: Analysis,
    tables: list[Table],
    out_dir: Path,
    detail_pages: list[str],
    plots: bool = True,
    lead: Lead | None = None,
) -> Path:
    by_name = {t.name: t for t in tables}
    lead = lead if lead is not None else build_lead(analysis)
    o = analysis.options
    throughput_ops = [op for op in analysis.operations if analysis.units.get(op) == "MB/s"]
    context = {
        "title": "zbdlab comparison: " + " vs ".join(d.name for d in analysis.sets),
        "analysis": analysis,
        "baseline": analysis.baseline.name,
        "options": o,
        "confidence_pct": round(o.confidence * 100),
        "test_label": TEST_LABELS[o.test],
        "lead": _lead_context(lead),
        "significance": significance_note(analysis),
        "sentences": summary_sentences(analysis),
        "environment": _environment(analysis),
        "warnings": by_name["warnings"].rows,
        "primary": [p for p in analysis.primaries],
        # the lead and the note are on top of the page already: only the per-operation table here
        "terminal": "\n".join(operation_lines(analysis)) + "\n",
        "summary": _summary_wide(analysis, by_name),
        "boxplot": figures.summary_boxplot(analysis, throughput_ops) if plots and throughput_ops else None,
        "sections": _operation_sections(analysis, by_name, plots),
        "metrics": by_name["metrics"],
        "slopes": by_name["slopes"],
        "tables": tables,
        "detail_pages": detail_pages,
    }
    path = out_dir / "index.html"
    path.write_text(_env().get_template("report.html.j2").render(**context))
    return path


def find_operation(analysis: Analysis, name: str) -> str:
    wanted = canonical_operation(name)
    for op in analysis.operations:
        if op == wanted or op == name:
            return op
    known = ", ".join(analysis.operations)
    raise ValueError(f"--detail {name}: no such operation in the compared sets (known: {known})")


def render_detail(analysis: Analysis, operation: str, out_dir: Path, plots: bool = True) -> list[Path]:
    """The original's detail mode: one page per fixed record size, one per fixed file size, each
    section with the raw values of every run, the statistics, the per-cell tests and a mean ± CI plot."""
    paths = []
    tests = {(t.set_name, t.cell): t for t in analysis.cell_tests}
    for fixed_attr, other_attr, stem in (
        ("record_size_kb", "file_size_kb", "record-size"),
        ("file_size_kb", "record_size_kb", "file-size"),
    ):
        cells = {c for cells in analysis.cells.values() for c in cells if c.operation == operation}
        fixed_values = sorted({getattr(c, fixed_attr) for c in cells}, key=lambda v: -1 if v is None else v)
        sections = []
        for fixed in fixed_values:
            others = sorted(
                {getattr(c, other_attr) for c in cells if getattr(c, fixed_attr) == fixed},
                key=lambda v: -1 if v is None else v,
            )
            keys = [
                CellKey(operation, fixed, o) if fixed_attr == "file_size_kb" else CellKey(operation, o, fixed)
                for o in others
            ]
            blocks = []
            for data in analysis.sets:
                values = [analysis.cells[data.name].get(k) for k in keys]
                runs = max((len(v) for v in values if v is not None), default=0)
                raw = [
                    [f"run {i + 1}"] + [fmt(v[i]) if v is not None and i < len(v) else "–" for v in values]
                    for i in range(runs)
                ]
                summaries = [
                    describe(v, analysis.options.confidence) if v is not None else None for v in values
                ]
                rows = raw + [
                    [STAT_LABELS[name]] + [fmt(getattr(s, name)) if s else "–" for s in summaries]
                    for name in STAT_NAMES
                ]
                blocks.append({"name": data.name, "rows": rows, "comparison": False})
            for data in analysis.others:
                ts = [tests.get((data.name, k)) for k in keys]
                rows = [
                    ["change of means"] + [pct(t.change_pct) if t else "–" for t in ts],
                    ["p"] + [fmt(t.p, 4) if t else "–" for t in ts],
                    ["q (BH)"] + [fmt(t.q, 4) if t else "–" for t in ts],
                    ["smallest reachable p"] + [fmt(t.smallest_p, 4) if t else "–" for t in ts],
                    ["differs"]
                    + [("yes" if t.significant(analysis.options.alpha) else "no") if t else "–" for t in ts],
                ]
                blocks.append(
                    {"name": f"{data.name} vs {analysis.baseline.name}", "rows": rows, "comparison": True}
                )
            sections.append(
                {
                    "title": f"{fixed_attr.replace('_kb', '').replace('_', ' ')} {figures.size_label(fixed)}",
                    "figure": figures.detail_plot(
                        analysis, operation, fixed_attr, fixed, analysis.units[operation]
                    )
                    if plots
                    else None,
                    "table": {"sizes": [figures.size_label(o) for o in others], "blocks": blocks},
                }
            )
        path = out_dir / f"detail-{operation}-by-{stem}.html"
        path.write_text(
            _env()
            .get_template("detail.html.j2")
            .render(
                title=f"{operation}: detail per {stem.replace('-', ' ')}",
                operation=operation,
                sections=sections,
                unit=analysis.units[operation],
                test_label=TEST_LABELS[analysis.options.test],
                confidence_pct=round(analysis.options.confidence * 100),
                other=("file size" if other_attr == "file_size_kb" else "record size"),
            )
        )
        paths.append(path)
    return paths


def write_all(
    analysis: Analysis, out_dir: Path, detail: str | None = None, plots: bool = True
) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    lead = build_lead(analysis)
    tables = [lead_table(lead), *all_tables(analysis)]
    write_tables(tables, out_dir, _meta(analysis))
    terminal = render_terminal(analysis, lead)
    (out_dir / "summary.txt").write_text(terminal)
    detail_paths: list[Path] = []
    if detail:
        detail_paths = render_detail(analysis, find_operation(analysis, detail), out_dir, plots)
    html = render_html(analysis, tables, out_dir, [p.name for p in detail_paths], plots, lead)
    return {"html": html, "terminal": terminal, "details": detail_paths, "tables": tables}
