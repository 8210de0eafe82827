"""What a reproduction's `measure` gets: a directory of its own, the size (quick or full), and ways to
run the project's own tools, each recorded, so the page can say exactly what produced every number.

Studies run as `zbdlab run` in a child process (optionally pinned to N CPUs with taskset, which its
children inherit: zbd serve, nbdkit, PostMark, fio), with `--resume` when an earlier, interrupted
reproduction left a results directory behind.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from zbdlab.app import HostError, zbd_binary
from zbdlab.config import parse_study
from zbdlab.parsers.results import ResultsDir, load_results_dir
from zbdlab.reproduce.model import Part
from zbdlab.results.schema import RunRecord
from zbdlab.runner.execute import OVERHEAD_ENV
from zbdlab.stats.describe import Summary, describe


class StepFailed(RuntimeError):
    """A tool a reproduction ran failed; the message names it and the log to read."""


# how often a running study's progress is looked at (runs.jsonl) and, when it moved, reported
PROGRESS_INTERVAL_S = 20.0
# a study told to stop (SIGTERM) tears its targets down first: give it that long before SIGKILL
CHILD_CLEANUP_S = 300.0


def study_units(toml: str) -> int:
    """How many units `zbdlab run` will make of this study text (its planner, no devices touched)."""
    from zbdlab.runner import factory, plan

    study = parse_study(toml)
    cells = {w.name: list(factory.build(study.source, w).cells()) for w in study.workloads}
    return len(plan.units_of(study, cells))


def study_part(label: str, toml: str, s_per_unit: float, fixed_s: float = 0.0) -> Part:
    """A figure's planned work for one study: its unit count from the planner, at a declared cost."""
    return Part(label, study_units(toml), s_per_unit, fixed_s)


def finished_units(results: Path) -> int:
    """Units a (running) study has recorded: distinct unit ids in its runs.jsonl."""
    try:
        text = (results / "runs.jsonl").read_text(errors="replace")
    except OSError:
        return 0
    units: set[str] = set()
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if isinstance(row, dict) and row.get("unit_id"):
            units.add(str(row["unit_id"]))
    return len(units)


def wait_child(proc: subprocess.Popen[Any], poll: Callable[[], None], interval_s: float) -> int:
    """Wait for a child, calling `poll` every `interval_s`; if we are interrupted (SIGINT, SIGTERM
    raised as an exception, a failing `poll`), SIGTERM the child and wait for it to tear down its
    loop devices, mounts and servers before passing the interruption on: a child left running
    would hold them after we are gone."""
    try:
        while True:
            try:
                return proc.wait(timeout=interval_s)
            except subprocess.TimeoutExpired:
                poll()
    except BaseException:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=CHILD_CLEANUP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise


class Context:
    def __init__(
        self,
        directory: Path,
        quick: bool,
        say: Callable[[str], None] = print,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.dir = directory
        self.quick = quick
        self.say = say
        self.commands: list[str] = []
        self.dir.mkdir(parents=True, exist_ok=True)
        # units finished by this figure so far (all its studies), reported to `progress` as they grow
        self.units_done = 0
        self.progress = progress or (lambda _done: None)

    def pick(self, quick: Any, full: Any) -> Any:
        return quick if self.quick else full

    @property
    def zbd(self) -> str:
        binary = zbd_binary()
        if binary is None:
            raise HostError("zbd binary not found (set ZBD_BIN or run `cargo build --release`)")
        return binary

    def tool(self, argv: list[str], label: str, timeout_s: float = 1800) -> str:
        """Run a tool, keep its output in <label>.out, return its stdout."""
        self.commands.append(shlex.join(argv))
        log = self.dir / f"{label}.out"
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except FileNotFoundError:
            raise HostError(f"{argv[0]} not found") from None
        except subprocess.TimeoutExpired:
            raise StepFailed(f"{shlex.join(argv[:3])} ... timed out after {timeout_s:.0f}s") from None
        log.write_text(proc.stdout + ("\n--- stderr ---\n" + proc.stderr if proc.stderr else ""))
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise StepFailed(
                f"{shlex.join(argv[:3])} ... failed (exit {proc.returncode}): {tail} (see {log})"
            )
        return proc.stdout

    def study(self, name: str, toml: str, cpus: int | None = None) -> ResultsDir:
        """Run a study (resuming an interrupted one) and load its results."""
        study_file = self.dir / f"{name}.toml"
        results = self.dir / name
        # the scratch directory stays zbdlab run's default (/var/tmp/zbdlab-*, recorded in plan.json):
        # PostMark overflows on longer paths than that
        if study_file.exists() and study_file.read_text() != toml and results.exists():
            raise StepFailed(
                f"{study_file} changed since the interrupted run; remove {results} to start over"
            )
        # images, mounts and servers under DIR too, so a reader (and --resume's recovery) finds them there
        study_file.write_text(toml)
        args = ["run", str(study_file), "-o", str(results), "--no-report"]
        if (results / "plan.json").exists():
            args.append("--resume")
        pin: list[str] = []
        if cpus is not None:
            available = sorted(os.sched_getaffinity(0))
            if len(available) < cpus:
                raise HostError(f"{name}: needs {cpus} CPUs, this machine lets us use {len(available)}")
            pin = ["taskset", "-c", ",".join(str(c) for c in available[:cpus])]
        self.commands.append(shlex.join([*pin, "zbdlab", *args]))
        argv = [*pin, sys.executable, "-c", "from zbdlab.cli import main; main()", *args]
        # the throttle's overhead probe once per reproduction directory, not once per study
        env = {**os.environ, OVERHEAD_ENV: str(self.dir.parent / "throttle-overhead.json")}
        log = self.dir / f"{name}.log"
        self.say(f"  running study {name} ({'quick' if self.quick else 'full'}), log {log}")
        before = self.units_done
        last = -1

        def poll() -> None:
            nonlocal last
            done = finished_units(results)
            if done != last:
                last = done
                self.units_done = before + done
                self.progress(self.units_done)

        with open(log, "a", encoding="utf-8") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
            returncode = wait_child(proc, poll, PROGRESS_INTERVAL_S)
        poll()
        if returncode != 0:
            tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:] or ["?"]
            raise StepFailed(f"zbdlab run {study_file.name} failed (exit {returncode}): {tail[0]}")
        return load_results_dir(results)

    def environment(self, name: str) -> dict[str, Any]:
        path = self.dir / name / "environment.json"
        return json.loads(path.read_text()) if path.exists() else {}


# --- reading results ------------------------------------------------------------------------------

Key = tuple[str, ...]


def medians(
    records: Iterable[RunRecord], key: Callable[[RunRecord], Key], value: Callable[[RunRecord], float | None]
) -> dict[Key, float]:
    """Median of `value` over the non-discarded runs of each `key` (the seeds report medians or means
    of repetitions; medians are the robust choice on a shared, noisy machine)."""
    return {k: statistics.median(vs) for k, vs in _groups(records, key, value).items()}


def _groups(
    records: Iterable[RunRecord], key: Callable[[RunRecord], Key], value: Callable[[RunRecord], float | None]
) -> dict[Key, list[float]]:
    groups: dict[Key, list[float]] = defaultdict(list)
    for r in records:
        v = value(r)
        if not r.discarded and v is not None:
            groups[key(r)].append(float(v))
    return groups


def spreads(
    records: Iterable[RunRecord], key: Callable[[RunRecord], Key], value: Callable[[RunRecord], float | None]
) -> dict[Key, Summary]:
    """What `medians` summarises, described (n, median, 90 % confidence interval of the mean, range),
    so a page can show how far one run is from the next."""
    return {k: describe(vs) for k, vs in _groups(records, key, value).items()}


def medians_noted(
    what: str,
    records: Iterable[RunRecord],
    key: Callable[[RunRecord], Key],
    value: Callable[[RunRecord], float | None],
) -> tuple[dict[Key, float], str]:
    """`medians` of the groups, and the `spread_note` of the same groups: the table's numbers and the
    note that says how far apart their runs were, from one pass over the records."""
    groups = _groups(records, key, value)
    summaries = {k: describe(vs) for k, vs in groups.items()}
    return {k: statistics.median(vs) for k, vs in groups.items()}, spread_note(what, summaries)


def by_target(r: RunRecord) -> Key:
    """The group key of a figure whose rows are targets."""
    return (r.target,)


def spread_note(what: str, summaries: dict[Key, Summary]) -> str:
    """One line: per key, median, 90 % CI of the mean and n (n = 1: the single value, no interval)."""

    def one(s: Summary) -> str:
        if s.n < 2:
            return f"{s.median:.4g} (1 run, no interval)"
        return f"{s.median:.4g} (90 % CI of the mean {s.ci_low:.4g}..{s.ci_high:.4g}, n={s.n})"

    parts = [f"{' '.join(k)} {one(s)}" for k, s in sorted(summaries.items())]
    return f"{what}, median per repetition set: " + "; ".join(parts)


def memory_note(records: Iterable[RunRecord]) -> str:
    """How hard the memory cgroup (study memory_limit) bit: its peak and how often it hit the limit."""
    runs = [r.extra for r in records if r.extra.get("memory_limit_bytes")]
    if not runs:
        return "no memory limit: the page cache could hold the data set"
    hits = sorted(int(e.get("memory_limit_hits", 0)) for e in runs)
    peak = max(int(e.get("memory_peak_bytes", 0)) for e in runs)
    return (
        f"memory cgroup of {runs[0]['memory_limit_bytes'] / 2**20:.0f} MiB: peak {peak / 2**20:.0f} MiB, "
        f"limit hit {hits[0]}..{hits[-1]} times per run "
        f"({sum(h > 0 for h in hits)} of {len(hits)} runs reclaimed)"
    )


def mb_s(r: RunRecord) -> float | None:
    """Throughput in MB/s as the seeds print it (2^20 bytes, like IOzone's KB/1024)."""
    return r.throughput_bytes_per_s / (1 << 20) if r.throughput_bytes_per_s else None
