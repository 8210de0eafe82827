"""Run the reproductions (all, or --only some), store each outcome, render the pages.

Resumable like `zbdlab run`: an entry whose DIR/<name>/outcome.json exists (for the same size) is not
run again; an entry interrupted half-way resumes its study (`zbdlab run --resume`). A failing entry is
recorded with its error and verdict "not reproduced", and the others still run.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from zbdlab.app import UserError, repo_root
from zbdlab.reproduce import seed000, seed001, seed002, seed003, seed004
from zbdlab.reproduce.context import Context
from zbdlab.reproduce.model import NOT_RUN, Outcome, Reproduction, table_dict
from zbdlab.reproduce.render import plot_outcome, render_html, render_markdown

ENTRIES: list[Reproduction] = [
    *seed002.ENTRIES,
    *seed000.ENTRIES,
    *seed001.ENTRIES,
    *seed003.ENTRIES,
    *seed004.ENTRIES,
]


def select(only: tuple[str, ...]) -> list[Reproduction]:
    if not only:
        return list(ENTRIES)
    names = {e.name for e in ENTRIES}
    unknown = [n for n in only if n not in names]
    if unknown:
        raise UserError(f"--only: no reproduction named {unknown[0]!r} (have {', '.join(sorted(names))})")
    return [e for e in ENTRIES if e.name in only]


def run_one(entry: Reproduction, directory: Path, quick: bool, say: Callable[[str], None]) -> Outcome:
    ctx = Context(directory / entry.name, quick, say)
    start = time.monotonic()
    ours, verdict, reason, notes, error = None, NOT_RUN, "", [], ""
    try:
        measured = entry.measure(ctx)
        result = entry.compare(entry.seed, measured)
        ours, verdict, reason, notes = table_dict(measured.table), result.kind, result.reason, measured.notes
    except (UserError, RuntimeError, OSError, ValueError, KeyError, ZeroDivisionError, TypeError) as exc:
        # one failing reproduction is reported in its row; the rest of the set still runs
        error = f"{type(exc).__name__}: {exc}"
        reason = f"failed: {exc}"
    return Outcome(
        name=entry.name,
        title=entry.title,
        cite=entry.cite.text,
        seed_setup=entry.seed_setup,
        seed=table_dict(entry.seed),
        ours=ours,
        scaling=entry.scaling(quick),
        substitute=entry.substitute,
        verdict=verdict,
        reason=reason,
        notes=notes,
        commands=list(ctx.commands),
        plot=entry.plot,
        quick=quick,
        elapsed_s=time.monotonic() - start,
        error=error,
    )


def reproduce(
    directory: Path, quick: bool, only: tuple[str, ...], command: str, say: Callable[[str], None] = print
) -> tuple[Path, Path, list[Outcome]]:
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    entries = select(only)
    outcomes: list[Outcome] = []
    for entry in entries:
        stored = directory / entry.name / "outcome.json"
        if stored.exists():
            previous = Outcome.from_dict(json.loads(stored.read_text()))
            if previous.quick == quick and not previous.error:
                say(f"{entry.name}: already reproduced ({previous.verdict}), kept")
                outcomes.append(previous)
                continue
        say(f"{entry.name}: {entry.title}")
        outcome = run_one(entry, directory, quick, say)
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.write_text(json.dumps(outcome.as_dict(), indent=2, default=str))
        failed = f" - {outcome.error}" if outcome.error else ""
        say(f"{entry.name}: {outcome.verdict} ({outcome.elapsed_s:.0f} s){failed}")
        outcomes.append(outcome)
    # the pages cover every outcome in DIR, so --only runs add up to the whole set
    selected = {o.name for o in outcomes}
    for entry in ENTRIES:
        stored = directory / entry.name / "outcome.json"
        if entry.name not in selected and stored.exists():
            outcomes.append(Outcome.from_dict(json.loads(stored.read_text())))
    order = [e.name for e in ENTRIES]
    outcomes.sort(key=lambda o: order.index(o.name))
    plots = {}
    for o in outcomes:
        image = Path("plots") / f"{o.name}.png"
        if plot_outcome(o, directory / image):
            plots[o.name] = str(image)
    header = header_facts(command)
    md = directory / "reproduction.md"
    md.write_text(render_markdown(outcomes, header, plots))
    page = directory / "reproduction.html"
    page.write_text(render_html(outcomes, header, plots))
    return md, page, outcomes


def header_facts(command: str) -> dict[str, str]:
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo_root()), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo_root()), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit, dirty = "", ""
    return {
        "command": command,
        "commit": (commit or "unknown") + (" (with uncommitted changes)" if dirty else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {sys.version.split()[0]}",
    }


def command_line(argv: list[str]) -> str:
    return shlex.join(["zbdlab", *argv])
