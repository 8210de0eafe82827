"""What `zbdlab run` prints at the end, and the hook where the comparison report will be generated."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from zbdlab.results.store import ResultStore


def summary_table(rows: list[dict[str, Any]]) -> Table:
    """Per target x workload x operation (kept runs): median throughput over all cells and
    repetitions, the worst coefficient of variation of any one cell across repetitions, median CPU
    seconds and compression ratio, and how many distinct warnings the rows carry."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if not r.get("discarded"):
            groups[(r["target"], r["workload"], r["operation"])].append(r)
    table = Table(title="zbdlab run: medians over repetitions (discarded runs excluded)")
    for name, justify in (
        ("target", "left"),
        ("workload", "left"),
        ("operation", "left"),
        ("n", "right"),
        ("MB/s", "right"),
        ("worst-cell CV %", "right"),
        ("CPU s", "right"),
        ("ratio", "right"),
        ("warn", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for (target, workload, op), rs in sorted(groups.items()):
        tput = [r["throughput_bytes_per_s"] for r in rs if r.get("throughput_bytes_per_s") is not None]
        cpu = [
            (r.get("cpu_user_s") or 0) + (r.get("cpu_system_s") or 0)
            for r in rs
            if r.get("cpu_user_s") is not None
        ]
        ratio = [r["compression_ratio"] for r in rs if r.get("compression_ratio") is not None]
        cv = _worst_cell_cv(rs)
        table.add_row(
            target,
            workload,
            op,
            str(len(rs)),
            f"{statistics.median(tput) / 1e6:.1f}" if tput else "-",
            f"{cv:.0f}" if cv is not None else "-",
            f"{statistics.median(cpu):.2f}" if cpu else "-",
            f"{statistics.median(ratio):.2f}" if ratio else "-",
            str(len({w for r in rs for w in r.get("warnings") or []})),
        )
    return table


def _worst_cell_cv(rows: list[dict[str, Any]]) -> float | None:
    cells: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.get("throughput_bytes_per_s") is not None:
            cells[(r.get("extra") or {}).get("cell_key", "")].append(r["throughput_bytes_per_s"])
    cvs = [
        statistics.stdev(v) / statistics.fmean(v) * 100
        for v in cells.values()
        if len(v) > 1 and statistics.fmean(v)
    ]
    return max(cvs) if cvs else None


def generate_report(results_dir: Path, console: Console, compare: bool = True) -> Path | None:
    """The hook `zbdlab run` calls when it finishes: the summary table of the runs, then (with two
    targets or more) `zbdlab report` into RESULTS_DIR/report. Returns the report directory, if any."""
    rows = ResultStore(results_dir).read_rows()
    if not rows:
        return None
    console.print(summary_table(rows))
    targets = {r["target"] for r in rows if not r.get("discarded")}
    if not compare or len(targets) < 2:
        return None
    from zbdlab.cli.report import command as report_command

    out = results_dir / "report"
    try:
        report_command.main(
            [str(results_dir), "-o", str(out)], prog_name="zbdlab report", standalone_mode=False
        )
    except click.ClickException as exc:
        console.print(f"report not generated: {exc.format_message()}", markup=False)
        return None
    return out
