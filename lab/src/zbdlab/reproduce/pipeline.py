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

from zbdlab import signals
from zbdlab.app import UserError, repo_root
from zbdlab.reproduce import seed000, seed001, seed002, seed003, seed004
from zbdlab.reproduce.context import Context
from zbdlab.reproduce.model import NOT_RUN, Outcome, Reproduction, planned_seconds, table_dict
from zbdlab.reproduce.render import plot_outcome, render_html, render_markdown
from zbdlab.runner.execute import Interrupted

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


# What the sets are sized for: their planned total on a quiet 2-core machine, with margin left to
# the goals (15 and 90 minutes) for a machine that is not quiet.
QUICK_BUDGET_S = 12 * 60
# 85 (was 80) since issue 30 added the transport control to 002-fig2 and 002-fig10, lz4 and zstd:1
# rows and ext4 to 002-fig2: 44 more units, about 2.5 min planned over the old budget
FULL_BUDGET_S = 85 * 60


def budget_s(quick: bool) -> float:
    return QUICK_BUDGET_S if quick else FULL_BUDGET_S


def plan_lines(entries: list[Reproduction], quick: bool) -> list[str]:
    """The planned work, figure by figure, and its total against the budget."""
    lines = []
    for e in entries:
        parts = e.plan(quick)
        what = " + ".join(
            f"{p.units} x {p.s_per_unit:.3g} s ({p.label})" + (f" + {p.fixed_s:.3g} s" if p.fixed_s else "")
            for p in parts
        )
        lines.append(f"  {e.name:16} {planned_seconds(parts):6.0f} s  {what or 'no plan declared'}")
    total = sum(planned_seconds(e.plan(quick)) for e in entries)
    size = "quick" if quick else "full"
    lines.append(
        f"planned: {total / 60:.1f} min for {len(entries)} figure(s) at {size} size, at the per-unit costs "
        f"measured here (docs/reproduction.md, Time); the whole {size} set is sized for "
        f"{budget_s(quick) / 60:.0f} min"
    )
    return lines


class Eta:
    """Progress against the plan: the share of planned seconds done, the pace so far (actual over
    planned) and the end time that pace gives."""

    def __init__(
        self,
        planned: dict[str, float],
        units: dict[str, int],
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.planned, self.units, self.say, self.clock = planned, units, say, clock
        self.start = clock()
        self.done_s = 0.0  # planned seconds of the finished figures
        self.current = ""
        self.current_frac = 0.0

    def begin(self, name: str) -> None:
        self.current, self.current_frac = name, 0.0

    def advance(self, done_units: int) -> None:
        total = self.units.get(self.current, 0)
        self.current_frac = min(1.0, done_units / total) if total else 0.0
        self.say(f"  {self.current}: {done_units}/{total or '?'} units; {self.status()}")

    def end(self) -> None:
        self.done_s += self.planned.get(self.current, 0.0)
        self.current, self.current_frac = "", 0.0

    def status(self) -> str:
        total = sum(self.planned.values())
        done = self.done_s + self.planned.get(self.current, 0.0) * self.current_frac
        elapsed = self.clock() - self.start
        pace = elapsed / done if done > 0 else 1.0
        left = max(0.0, total - done) * pace
        end = time.strftime("%H:%M", time.gmtime(time.time() + left))
        return (
            f"{100 * done / total if total else 100:.0f} % of the plan done in {elapsed / 60:.1f} min "
            f"(pace {pace:.2f}x the plan), about {left / 60:.0f} min left, ends about {end} UTC"
        )


def run_one(
    entry: Reproduction,
    directory: Path,
    quick: bool,
    say: Callable[[str], None],
    progress: Callable[[int], None] | None = None,
) -> Outcome:
    ctx = Context(directory / entry.name, quick, say, progress)
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
        plot_columns=list(entry.plot_columns),
    )


def reproduce(
    directory: Path, quick: bool, only: tuple[str, ...], command: str, say: Callable[[str], None] = print
) -> tuple[Path, Path, list[Outcome]]:
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    entries = select(only)
    outcomes: list[Outcome] = []
    kept: dict[str, Outcome] = {}
    for entry in entries:
        stored = directory / entry.name / "outcome.json"
        if stored.exists():
            previous = Outcome.from_dict(json.loads(stored.read_text()))
            if previous.quick == quick and not previous.error:
                kept[entry.name] = previous
    todo = [e for e in entries if e.name not in kept]
    for line in plan_lines(todo, quick):
        say(line)
    eta = Eta(
        {e.name: planned_seconds(e.plan(quick)) for e in todo},
        {e.name: sum(p.units for p in e.plan(quick)) for e in todo},
        say,
    )
    # SIGTERM like Ctrl-C: a running study is told to stop and tears its devices down (Context.study)
    with signals.raising(Interrupted):
        for entry in entries:
            if entry.name in kept:
                say(f"{entry.name}: already reproduced ({kept[entry.name].verdict}), kept")
                outcomes.append(kept[entry.name])
                continue
            say(f"{entry.name}: {entry.title} (planned {eta.planned[entry.name]:.0f} s)")
            eta.begin(entry.name)
            outcome = run_one(entry, directory, quick, say, eta.advance)
            eta.end()
            stored = directory / entry.name / "outcome.json"
            stored.parent.mkdir(parents=True, exist_ok=True)
            stored.write_text(json.dumps(outcome.as_dict(), indent=2, default=str))
            failed = f" - {outcome.error}" if outcome.error else ""
            say(
                f"{entry.name}: {outcome.verdict} ({outcome.elapsed_s:.0f} s, planned "
                f"{eta.planned[entry.name]:.0f} s, load {os.getloadavg()[0]:.1f}){failed}; {eta.status()}"
            )
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
