"""One `zbdlab bench`: the groups asked for, in order, then the results directory (and its raw one)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from zbdlab.bench import engine, fs, nbd
from zbdlab.bench.core import Figure
from zbdlab.bench.report import machine, raw_dir, results_dir, short_commit, write_results
from zbdlab.bench.scripts import FIGURE_FILES, SCRIPT_RUNNERS
from zbdlab.bench.settings import ALL_GROUPS, Settings
from zbdlab.stats.compare import Options


def run_bench(
    zbd: str,
    settings: Settings,
    groups: Sequence[str],
    repo: Path,
    out: Path | None = None,
    say: Callable[[str], None] = print,
) -> tuple[Path, list[str]]:
    """Runs `groups`; returns the summary's path and the groups that failed (their notes say why).
    The results directory gets summary.md, figures.json and environment.json; the tools' output goes
    to its raw directory (`raw_dir`: bench/raw/<name>/, ignored by git)."""
    when = datetime.now(UTC)
    out = out or results_dir(repo / "bench" / "results", short_commit(repo), when, groups)
    raw = raw_dir(repo, out)
    raw.mkdir(parents=True, exist_ok=True)
    say(f"results: {out} (raw tool output: {raw})")
    env = machine(zbd, repo)  # sets $ZBD_BIN: the lab's targets (group fs) serve with the same binary
    figures: list[Figure] = []
    notes: list[str] = []
    failed: list[str] = []
    tables: dict[str, list[str]] = {}
    data: dict[str, Any] = {}
    settings.progress = settings.progress or (lambda message: say(f"  {message}"))
    for group in ALL_GROUPS:
        if group not in groups:
            continue
        say(f"== {group}")
        graw = raw / group
        graw.mkdir(exist_ok=True)
        try:
            if group in SCRIPT_RUNNERS:
                tables[group], data[group] = SCRIPT_RUNNERS[group](zbd, repo, settings, graw)
                continue
            got, table = run_group(group, zbd, settings, graw, notes)
        except Exception as exc:  # one group failing (and cleaned up) leaves the others' figures
            notes.append(f"{group}: FAILED: {type(exc).__name__}: {exc}")
            say(f"  {group} failed: {exc}")
            failed.append(group)
            continue
        figures += got
        if table:
            tables[group] = table
    options = Options(confidence=settings.confidence)
    for f in figures:
        f.compute(options)
    described = {**settings.describe(), "groups": list(groups), "zbd": zbd}
    summary = write_results(out, figures, env, described, notes, tables, data)
    for group, names in FIGURE_FILES.items():  # the figures a script group drew, beside summary.md
        for name in names:
            if group in data and (raw / group / name).exists():
                shutil.copyfile(raw / group / name, out / name)
    return summary, failed


def run_group(
    group: str, zbd: str, settings: Settings, graw: Path, notes: list[str]
) -> tuple[list[Figure], list[str]]:
    """One group's figures, and a Markdown table of its own (fs) or none."""
    if group == "engine":
        return engine.run(zbd, settings, graw, notes), []
    if group == "nbd-fast":
        with tempfile.TemporaryDirectory(prefix="zbd-bench-", dir=settings.work_dir) as disk:
            return nbd.run(group, zbd, settings, graw, Path(disk), notes, settings.progress), []
    if group == "nbd-slow":
        with nbd.slow_disk(settings, graw) as disk:
            notes.append(
                f"nbd-slow: ext4 on a throttled device, {nbd.SLOW_RATE}iB/s and {nbd.SLOW_LATENCY} "
                "per request"
            )
            return nbd.run(group, zbd, settings, graw, disk, notes, settings.progress), []
    if group == "fs":
        return fs.run(settings, graw, settings.progress)
    raise ValueError(f"unknown group {group}")
