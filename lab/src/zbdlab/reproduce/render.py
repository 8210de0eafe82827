"""Outcomes -> DIR/reproduction.md and DIR/reproduction.html.

Pure functions of the outcomes (plus the header facts), so the output is golden-tested; the plots are
drawn separately (`plot_outcome`) and only referenced here by file name.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from zbdlab.reproduce.model import DIFFERENT, NOT_RUN, SAME, SAME_DIRECTION, Outcome

BADGES = {SAME: "same", SAME_DIRECTION: "same direction", DIFFERENT: "different", NOT_RUN: "not run"}


def cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return (
            f"{value:,.2f}" if abs(value) < 10 else f"{value:,.1f}" if abs(value) < 1000 else f"{value:,.0f}"
        )
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _md_table(table: dict[str, Any]) -> list[str]:
    columns = table["columns"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(v).replace("|", "\\|") for v in row) + " |" for row in table["rows"]]
    return lines


def summary_counts(outcomes: list[Outcome]) -> dict[str, int]:
    counts = {kind: 0 for kind in BADGES}
    for o in outcomes:
        counts[o.verdict if o.verdict in counts else NOT_RUN] += 1
    return counts


def time_total(outcomes: list[Outcome]) -> str:
    """The set's wall time, summed over the figures (each ran on its own; they add up)."""
    sizes = sorted({"quick" if o.quick else "full" for o in outcomes})
    total = sum(o.elapsed_s for o in outcomes)
    return f"{total:,.0f} s ({total / 60:.1f} min) over {len(outcomes)} figures, {' and '.join(sizes)} size"


def render_markdown(outcomes: list[Outcome], header: dict[str, str], plots: dict[str, str]) -> str:
    """header: command, commit, date, machine; plots: outcome name -> relative image path."""
    out = [
        "# Reproducing the seeds' headline figures",
        "",
        f"- command: `{header['command']}`",
        f"- commit: `{header['commit']}`",
        f"- date: {header['date']}",
        f"- machine: {header['machine']}",
        "",
        "Each section: the seed's numbers (cited by document, table or figure, page, and the line of the "
        "seed's text in `/work/shared/seeds`), ours in the same units and shape, the scaling we applied, "
        "and a verdict. Timings on this machine are noisy (it is shared).",
        "",
        "| figure | verdict | wall time (s) | reason |",
        "|---|---|---|---|",
    ]
    for o in outcomes:
        reason = o.reason.replace("|", "/")
        out.append(f"| [{o.name}](#{o.name}) {o.title} | {o.verdict} | {o.elapsed_s:,.0f} | {reason} |")
    counts = summary_counts(outcomes)
    out += [
        "",
        "Totals: " + ", ".join(f"{kind}: {n}" for kind, n in counts.items() if n),
        "",
        f"Wall time: {time_total(outcomes)}.",
        "",
    ]
    for o in outcomes:
        out += [f"## {o.name}", "", f"**{o.title}**", "", f"Seed: {o.cite}. Setup there: {o.seed_setup}.", ""]
        out += [f"Seed's numbers ({o.seed['unit']}):" if o.seed.get("unit") else "Seed's numbers:", ""]
        out += _md_table(o.seed)
        out.append("")
        if o.ours is not None:
            out += [f"Ours ({o.ours['unit']}):" if o.ours.get("unit") else "Ours:", ""]
            out += _md_table(o.ours)
            out.append("")
        if o.name in plots:
            out += [f"![{o.name}]({plots[o.name]})", ""]
        out.append(f"- scaling: {o.scaling}")
        if o.substitute:
            out.append(f"- substitute (the seed's setup cannot exist here): {o.substitute}")
        out += [f"- note: {n}" for n in o.notes]
        if o.error:
            out.append(f"- error: {o.error}")
        out += [f"- ran: `{c}`" for c in o.commands]
        out.append(f"- {'quick' if o.quick else 'full'} size, {o.elapsed_s:.0f} s")
        out += ["", f"**Verdict: {o.verdict}** — {o.reason}", ""]
    return "\n".join(out).rstrip() + "\n"


_STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}.same{background:#d4efdf}.same-direction{background:#fcf3cf}
.different{background:#f5b7b1}.not-run{background:#ddd}code{background:#f4f4f4}img{max-width:100%}
.side{display:flex;gap:2em;flex-wrap:wrap}"""


def _html_table(table: dict[str, Any]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table["columns"])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell(v))}</td>" for v in row) + "</tr>" for row in table["rows"]
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _css(verdict: str) -> str:
    return BADGES.get(verdict, "not run").replace(" ", "-")


def render_html(outcomes: list[Outcome], header: dict[str, str], plots: dict[str, str]) -> str:
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>zbdlab reproduce</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>Reproducing the seeds' headline figures</h1>",
        f"<p>command: <code>{e(header['command'])}</code><br>commit: <code>{e(header['commit'])}</code><br>"
        f"date: {e(header['date'])}<br>machine: {e(header['machine'])}</p>",
        "<table><tr><th>figure</th><th>verdict</th><th>wall time (s)</th><th>reason</th></tr>",
    ]
    for o in outcomes:
        parts.append(
            f"<tr><td><a href='#{e(o.name)}'>{e(o.name)}</a> {e(o.title)}</td>"
            f"<td class='{_css(o.verdict)}'>{e(o.verdict)}</td><td>{o.elapsed_s:,.0f}</td>"
            f"<td>{e(o.reason)}</td></tr>"
        )
    parts.append(f"</table><p>Wall time: {e(time_total(outcomes))}.</p>")
    for o in outcomes:
        parts.append(f"<h2 id='{e(o.name)}'>{e(o.name)}: {e(o.title)}</h2>")
        parts.append(f"<p>Seed: {e(o.cite)}. Setup there: {e(o.seed_setup)}.</p><div class='side'>")
        parts.append(f"<div><h3>Seed ({e(o.seed.get('unit', ''))})</h3>{_html_table(o.seed)}</div>")
        if o.ours is not None:
            parts.append(f"<div><h3>Ours ({e(o.ours.get('unit', ''))})</h3>{_html_table(o.ours)}</div>")
        parts.append("</div>")
        if o.name in plots:
            parts.append(f"<p><img src='{e(plots[o.name])}' alt='{e(o.name)}'></p>")
        items = [f"scaling: {o.scaling}"]
        if o.substitute:
            items.append(f"substitute (the seed's setup cannot exist here): {o.substitute}")
        items += [f"note: {n}" for n in o.notes]
        if o.error:
            items.append(f"error: {o.error}")
        parts.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in items))
        parts.append("".join(f"<li>ran: <code>{e(c)}</code></li>" for c in o.commands))
        parts.append(f"<li>{'quick' if o.quick else 'full'} size, {o.elapsed_s:.0f} s</li></ul>")
        parts.append(f"<p class='{_css(o.verdict)}'><b>Verdict: {e(o.verdict)}</b> — {e(o.reason)}</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# --- plots (not golden-tested: matplotlib's bytes vary by version) -----------------------------------


def _numeric_columns(table: dict[str, Any], only: list[str] | None = None) -> list[int]:
    cols = []
    for i in range(1, len(table["columns"])):
        if only and table["columns"][i] not in only:
            continue
        values = [row[i] for row in table["rows"]]
        if values and all(isinstance(v, int | float) or v is None for v in values):
            if any(isinstance(v, int | float) and not math.isnan(v) for v in values):
                cols.append(i)
    return cols


def plot_outcome(outcome: Outcome, path: Path) -> bool:
    """Seed beside ours as grouped bars (or lines for a sweep); False when there is nothing to draw."""
    if outcome.ours is None or outcome.plot == "none":
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("seed", outcome.seed), ("ours", outcome.ours)]
    drawable = [
        (label, t, _numeric_columns(t, outcome.plot_columns if label == "ours" else None))
        for label, t in panels
    ]
    drawable = [(label, t, cols) for label, t, cols in drawable if cols]
    if not drawable:
        return False
    fig, axes = plt.subplots(1, len(drawable), figsize=(6 * len(drawable), 3.4), squeeze=False)
    for ax, (label, table, cols) in zip(axes[0], drawable, strict=True):
        rows = table["rows"]
        labels = [str(r[0]) for r in rows]
        width = 0.8 / len(cols)
        for k, i in enumerate(cols):
            values = [float(r[i]) if isinstance(r[i], int | float) else math.nan for r in rows]
            if outcome.plot == "line":
                ax.plot(labels, values, marker="o", label=table["columns"][i])
            else:
                ax.bar([x + k * width for x in range(len(rows))], values, width, label=table["columns"][i])
        if outcome.plot != "line":
            ax.set_xticks(
                [x + width * (len(cols) - 1) / 2 for x in range(len(rows))], labels, rotation=20, ha="right"
            )
        ax.set_title(f"{label}: {table.get('unit', '')}"[:70], fontsize=9)
        ax.legend(fontsize=7)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"{outcome.name}: {outcome.title}"[:100], fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True
