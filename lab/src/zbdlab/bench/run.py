"""One `zbdlab bench`: the groups asked for, in order, then the results directory."""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from zbdlab.bench import engine, fs, nbd
from zbdlab.bench.core import Figure
from zbdlab.bench.report import machine, results_dir, short_commit, write_results
from zbdlab.bench.settings import GROUPS, Settings
from zbdlab.stats.compare import Options


def slow_disk_available() -> bool:
    """The slow disk comes from the repro branch's reusable throttle (zbdlab.throttle)."""
    return importlib.util.find_spec("zbdlab.throttle") is not None


def run_bench(
    zbd: str,
    settings: Settings,
    groups: Sequence[str],
    repo: Path,
    out: Path | None = None,
    say: Callable[[str], None] = print,
) -> Path:
    when = datetime.now(UTC)
    out = out or results_dir(repo / "bench" / "results", short_commit(repo), when)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    env = machine(zbd, repo)
    figures: list[Figure] = []
    notes: list[str] = []
    tables: dict[str, list[str]] = {}
    settings.progress = settings.progress or (lambda message: say(f"  {message}"))
    for group in GROUPS:
        if group not in groups:
            continue
        say(f"== {group}")
        graw = raw / group
        graw.mkdir(exist_ok=True)
        if group == "engine":
            figures += engine.run(zbd, settings, graw)
        elif group == "nbd-fast":
            with tempfile.TemporaryDirectory(prefix="zbd-bench-", dir=settings.work_dir) as disk:
                figures += nbd.run(group, zbd, settings, graw, Path(disk), notes, settings.progress)
        elif group == "nbd-slow":
            if not slow_disk_available():
                notes.append("nbd-slow: not run: the slow disk (zbdlab.throttle) is not in this tree yet")
                say("  skipped: zbdlab.throttle not available")
                continue
            with ExitStack() as stack:
                disk = slow_disk(stack, settings)
                figures += nbd.run(group, zbd, settings, graw, disk, notes, settings.progress)
        elif group == "fs":
            got, table = fs.run(settings, graw, settings.progress)
            figures += got
            tables["fs"] = table
    options = Options(confidence=settings.confidence)
    for f in figures:
        f.compute(options)
    described = {**settings.describe(), "groups": list(groups), "zbd": zbd}
    summary = write_results(out, figures, env, described, notes, tables)
    return summary


def slow_disk(stack: ExitStack, settings: Settings) -> Path:  # pragma: no cover - needs throttle
    raise NotImplementedError("wired once zbdlab.throttle lands")
