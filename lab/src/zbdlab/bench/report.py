"""The results of one `zbdlab bench`.

The results directory (bench/results/<date>-<commit>-<groups>/, committed) holds only what a reader
uses: summary.md, figures.json and environment.json. What the tools wrote (fio JSON and job files,
logs, the fs study and its runs, the scripts' outputs) goes to a raw directory beside it,
bench/raw/<same name>/, which git ignores.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from zbdlab.bench.core import Figure, Goal, median
from zbdlab.bench.settings import ALL_GROUPS, DEFAULT_GROUPS
from zbdlab.monitors import environment
from zbdlab.stats.compare import Options

GROUP_TITLES = {
    "engine": "Engine in-process (`zbd bench engine`, over the codec alone on the same data)",
    "nbd-fast": "Over NBD, fast disk (fio `ioengine=nbd`)",
    "nbd-slow": "Over NBD, slow disk (100 MB/s, 2 ms per request)",
    "transport": "The transport of this machine (nbdfuse + loop), any NBD server",
    "fs": "Through a filesystem (the lab's study runner)",
    "builtin": "zbd's built-in benchmarks (`zbd bench codec`, `engine`, `cleaner`)",
    "scale": "RAM and open time at scale (scripts/bench-scale.sh)",
    "latency": "Read latency behind checkpoints and the cleaner (scripts/bench-latency.sh)",
    "savings": "Space savings against btrfs and ZFS, read cost per unit size (scripts/bench-savings.sh)",
    "metrics": "Cost of the metrics endpoint under 4 KiB random writes (scripts/bench-metrics.sh)",
    "dedup-index": "Dedup index: duplicates found against its RAM budget (scripts/bench-dedup-index.py)",
    "dedup-space": "Dedup space: bytes stored beside btrfs+duperemove and ZFS (scripts/bench-dedup-space.py)",
    "dedup-write": "Inline dedup: write throughput, dedup on against off (scripts/bench-dedup-write.py)",
    "snapshots": "Snapshots under load, clones' space and reads, RAM and reopen with snapshots kept "
    "(scripts/bench-snapshots.py)",
    "ceph": "zbd on RADOS against RBD (scripts/bench-ceph.sh)",
    "rados-ab": "Two zbd binaries on one RADOS cluster (scripts/bench-rados-ab.sh)",
}
# Sections of summary.md in the order the groups run (nbd-fast's transport figures after it)
SECTION_ORDER = (
    "engine",
    "nbd-fast",
    "transport",
    *(g for g in ALL_GROUPS if g not in ("engine", "nbd-fast")),
)
# The only files a results directory holds (figures the code draws would join them as PNG/SVG)
RESULT_FILES = ("summary.md", "figures.json", "environment.json")


def section_rank(group: str) -> int:
    return SECTION_ORDER.index(group) if group in SECTION_ORDER else len(SECTION_ORDER)


def short_commit(repo: Path) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return proc.stdout.strip() or "unknown"


def results_dir(root: Path, commit: str, when: datetime, groups: Sequence[str] = ()) -> Path:
    """root/<date>-<commit>-<groups>: the groups joined by "+", or "all" for every default group."""
    label = "all" if set(groups) == set(DEFAULT_GROUPS) else "+".join(groups)
    name = f"{when:%Y-%m-%d}-{commit}"
    return root / (f"{name}-{label}" if label else name)


def raw_dir(repo: Path, out: Path) -> Path:
    """Where the tools' own output goes: bench/raw/<name> for a results directory under
    bench/results/ (ignored by git), else <out>/raw (a directory outside the repository's results)."""
    results = (repo / "bench" / "results").resolve()
    if out.resolve().parent == results:
        return repo / "bench" / "raw" / out.name
    return out / "raw"


def machine(zbd: str, repo: Path) -> dict[str, Any]:
    """The lab's environment record (zbd as $ZBD_BIN) plus the commit and the date."""
    os.environ["ZBD_BIN"] = zbd
    env = environment.collect()
    env["repo_commit"] = short_commit(repo)
    # the commit the binary was built from, when it sits in a checkout's target/<profile>/
    built_in = Path(zbd).resolve().parents[2] if len(Path(zbd).resolve().parents) > 2 else None
    env["zbd_commit"] = short_commit(built_in) if built_in and (built_in / ".git").exists() else None
    env["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    return env


def _fmt(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.2f}"


def _speed(values: Sequence[float], unit: str) -> str:
    m = median(values)
    if not math.isfinite(m):
        return "-"
    if unit == "B":
        return f"{m / 1e6:.1f}"
    return f"{m / 1000:.1f}k" if unit == "IOPS" else f"{m:.3g}" if m < 100 else f"{m:.0f}"


def figure_table(figures: Sequence[Figure], confidence: float, with_group: bool = False) -> list[str]:
    pct = round(confidence * 100)
    lines = [
        f"| figure | ratio | {pct} % CI | target | verdict | A (median) | B (median) | rounds | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def label(f: Figure) -> str:
        return f"{f.group}: {f.name}" if with_group else f.name

    for f in figures:
        target = f.goal.label if f.goal else ""
        verdict = f"**{f.verdict}**" if f.verdict in ("miss", "unsure") else f.verdict
        scale = f" x{f.scale:g}" if f.scale != 1 else ""
        unit = "MB" if f.unit == "B" else f.unit
        lines.append(
            f"| {label(f)} | {_fmt(f.ratio)} | {_fmt(f.low)}-{_fmt(f.high)} | {target} | {verdict} | "
            f"{_speed(f.numerator, f.unit)} {unit} | {_speed(f.denominator, f.unit)} {unit}{scale} | "
            f"{f.rounds} | {f.note} |"
        )
    return lines


def summary_markdown(
    figures: Sequence[Figure],
    env: dict[str, Any],
    settings: dict[str, Any],
    notes: Sequence[str],
    tables: dict[str, list[str]] | None = None,
) -> str:
    tools = env.get("tools", {})
    load = env.get("at_start", {}).get("loadavg") or []
    mem = env.get("mem_total_bytes")
    lines = [
        f"# zbd bench, {env.get('date', '?')}, commit {env.get('repo_commit', '?')}",
        "",
        f"- machine: {env.get('cpu_model')}, {env.get('cpu_count')} cores, "
        f"{mem / 2**30:.1f} GiB RAM, kernel {env.get('kernel')}"
        if mem
        else f"- machine: {env.get('cpu_model')}, {env.get('cpu_count')} cores, kernel {env.get('kernel')}",
        f"- zbd: {tools.get('zbd')}, commit {env.get('zbd_commit') or '?'} ({tools.get('zbd_path')}); "
        f"fio {tools.get('fio')}; "
        f"{tools.get('nbdkit')}; {tools.get('qemu-nbd')}",
        f"- load average at start: {', '.join(f'{v:.1f}' for v in load)}; at end: "
        f"{', '.join(f'{v:.1f}' for v in settings.get('loadavg_end', []))}",
        f"- settings: {', '.join(f'{k}={v}' for k, v in settings.items() if k != 'loadavg_end')}",
        "",
        "Every figure is median(A) / median(B) over rounds that each ran A and B once, the order "
        "rotating; the interval is a percentile bootstrap over rounds (paired). A verdict is `pass` "
        "when the whole interval clears the target, `miss` when it falls short, `unsure` when it "
        "straddles the target (noise or too few rounds).",
        "",
    ]
    goals = [f for f in figures if f.goal]
    if goals:
        counts = {v: sum(1 for f in goals if f.verdict == v) for v in ("pass", "miss", "unsure", "no data")}
        lines += [
            "## Targets",
            "",
            ", ".join(f"{n} {v}" for v, n in counts.items() if n) + " (each also in its group below)",
            "",
            *figure_table(goals, settings.get("confidence", 0.9), with_group=True),
            "",
        ]
    tables = tables or {}
    present = dict.fromkeys([*(f.group for f in figures), *tables])
    for group in sorted(present, key=section_rank):
        lines += [f"## {GROUP_TITLES.get(group, group)}", ""]
        if group in tables:
            lines += [*tables[group], ""]
        chosen = [f for f in figures if f.group == group]
        if chosen:
            lines += [*figure_table(chosen, settings.get("confidence", 0.9)), ""]
    if notes:
        lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(lines)


def figure_from_dict(d: dict[str, Any]) -> Figure:
    """A figure as figures.json holds it (its ratio and interval are computed again, same seed)."""
    goal = None
    if target := d.get("target"):
        op, value = target.split()
        goal = Goal(at_least=float(value)) if op == ">=" else Goal(at_most=float(value))
    nan = math.nan
    return Figure(
        d["group"],
        d["name"],
        [nan if v is None else float(v) for v in d["numerator"]],
        [nan if v is None else float(v) for v in d["denominator"]],
        scale=d.get("scale", 1.0),
        unit=d.get("unit", "MB/s"),
        goal=goal,
        note=d.get("note", ""),
    )


def rerender(out: Path, confidence: float) -> Path:
    """summary.md again from figures.json and environment.json (after the report's code changed)."""
    doc = json.loads((out / "figures.json").read_text())
    env = json.loads((out / "environment.json").read_text())
    options = Options(confidence=confidence)
    figures = [figure_from_dict(d).compute(options) for d in doc["figures"]]
    summary = out / "summary.md"
    summary.write_text(summary_markdown(figures, env, doc["settings"], doc["notes"], doc.get("tables")))
    return summary


def write_results(
    out: Path,
    figures: Sequence[Figure],
    env: dict[str, Any],
    settings: dict[str, Any],
    notes: Sequence[str],
    tables: dict[str, list[str]] | None = None,
    data: dict[str, Any] | None = None,
) -> Path:
    """summary.md, figures.json (figures with their per-round values, notes, the groups' tables and
    the script groups' numbers under "data") and environment.json, nothing else."""
    out.mkdir(parents=True, exist_ok=True)
    settings = {**settings, "loadavg_end": [round(v, 2) for v in os.getloadavg()]}
    (out / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
    doc = {
        "settings": settings,
        "figures": [f.as_dict() for f in figures],
        "notes": list(notes),
        "tables": tables or {},
        "data": data or {},
    }
    (out / "figures.json").write_text(json.dumps(doc, indent=2, allow_nan=True) + "\n")
    summary = out / "summary.md"
    summary.write_text(summary_markdown(figures, env, settings, notes, tables))
    return summary
