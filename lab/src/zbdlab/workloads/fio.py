"""fio: render a job file, run the real fio, parse its JSON into a `Measurement`.

Data is always set explicitly: fio's default buffers compress about 11:1, and `buffer_pattern` from a
file repeats a short prefix, so every job carries `refill_buffers=1`, `buffer_compress_percentage=<p>`,
`buffer_compress_chunk=4k` and `fallocate=none`, plus `dedupe_percentage=<p>` when the data declares
duplicates (see `data_options`).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zbdlab.workloads.base import DataSpec, Measurement, RunContext, WorkloadError
from zbdlab.workloads.tool import run_measured

FIO = "fio"
DIRECTIONS = ("read", "write")
PERCENTILES = (50.0, 95.0, 99.0, 99.9)
FIXED_SEED = 20240229  # randseed: random offsets are the same in every run and on every machine


def data_options(data: DataSpec) -> dict[str, Any]:
    """The data settings every fio job must carry (fio can only write synthetic data honestly)."""
    if data.kind != "synthetic":
        raise WorkloadError(
            f"fio writes synthetic data only; the study declares {data.label!r} "
            "(use the copy workload for corpus data)"
        )
    if not 0 <= data.compress_percentage <= 100:
        raise WorkloadError(f"buffer_compress_percentage {data.compress_percentage} is not in 0..100")
    options: dict[str, Any] = {
        "refill_buffers": 1,
        "buffer_compress_percentage": data.compress_percentage,
        "buffer_compress_chunk": "4k",
        "fallocate": "none",
    }
    if data.dedupe_percentage:
        if not 0 < data.dedupe_percentage <= 100:
            raise WorkloadError(f"dedupe_percentage {data.dedupe_percentage} is not in 0..100")
        # p % of the buffers (one per fio block, bs) repeat an earlier buffer; `repeat` (fio's default,
        # set explicitly) keeps the unique blocks' contents and compressibility as without dedup.
        options["dedupe_percentage"] = data.dedupe_percentage
        options["dedupe_mode"] = "repeat"
    return options


@dataclass
class JobFile:
    """An fio job file: a [global] section and named job sections, rendered in order."""

    global_options: dict[str, Any]
    jobs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def add(self, name: str, options: dict[str, Any]) -> None:
        self.jobs.append((name, options))

    def render(self) -> str:
        lines = ["; rendered by zbdlab; run with: fio --output-format=json+ <this file>", "[global]"]
        lines += _render_options(self.global_options)
        for name, options in self.jobs:
            lines += ["", f"[{name}]"]
            lines += _render_options(options)
        return "\n".join(lines) + "\n"


def _render_options(options: dict[str, Any]) -> list[str]:
    out = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        out.append(key if value is True else f"{key}={value}")
    return out


def check_data_options(job_text: str) -> None:
    """Refuse a rendered job file whose data is not explicit (a programming error, not user input)."""
    for needed in ("refill_buffers=1", "buffer_compress_percentage=", "buffer_compress_chunk=4k"):
        if needed not in job_text:
            raise AssertionError(f"fio job file lacks {needed}")
    if "buffer_pattern" in job_text:
        raise AssertionError("fio job file uses buffer_pattern")


@dataclass
class FioRun:
    """One fio invocation: its parsed JSON, the argv and the raw files kept."""

    doc: dict[str, Any]
    argv: list[str]
    raw_files: list[Path]
    wall_s: float


def run_fio(job: JobFile, stem: str, ctx: RunContext, operation: str | None) -> FioRun:
    """Render `job` to raw_dir/<stem>.fio, run fio on it, keep JSON and stderr; hooks wrap the run
    when `operation` is given (a measured operation), not for unmeasured preparation."""
    if shutil.which(FIO) is None:
        raise WorkloadError("fio is not installed (scripts/install-deps.sh installs it)")
    text = job.render()
    check_data_options(text)
    job_path = ctx.raw_dir / f"{stem}.fio"
    json_path = ctx.raw_dir / f"{stem}.json"
    err_path = ctx.raw_dir / f"{stem}.stderr"
    job_path.write_text(text)
    argv = [FIO, "--output-format=json+", f"--output={json_path}", str(job_path)]
    proc, wall_s = run_measured(argv, ctx, operation)
    err_path.write_text(proc.stdout + proc.stderr)
    (ctx.raw_dir / f"{stem}.cmd").write_text(" ".join(argv) + "\n")
    raw = [job_path, json_path, err_path]
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise WorkloadError(f"fio failed (exit {proc.returncode}) on {job_path}: {' | '.join(tail)}")
    doc = load_fio_json(json_path)
    return FioRun(doc=doc, argv=argv, raw_files=raw, wall_s=wall_s)


def load_fio_json(path: Path) -> dict[str, Any]:
    """fio may print notes before the JSON object in its output file; parse from the first brace."""
    try:
        text = path.read_text()
    except OSError as e:
        raise WorkloadError(f"fio wrote no JSON output at {path}: {e}") from e
    start = text.find("{")
    if start < 0:
        raise WorkloadError(f"fio output {path} holds no JSON object")
    try:
        doc = json.loads(text[start:])
    except json.JSONDecodeError as e:
        raise WorkloadError(f"fio output {path} is not valid JSON: {e}") from e
    if not isinstance(doc.get("jobs"), list) or not doc["jobs"]:
        raise WorkloadError(f"fio output {path} has no jobs")
    return doc


@dataclass
class DirectionStats:
    """One direction (read or write) summed over the jobs of one fio run."""

    io_bytes: int = 0
    total_ios: int = 0
    bins: dict[int, int] = field(default_factory=dict)  # clat ns -> count (json+)
    fio_percentiles_ns: list[dict[str, float]] = field(default_factory=list)  # fallback (plain json)

    def percentile_us(self, p: float) -> float | None:
        if self.bins:
            return _percentile_from_bins(self.bins, p) / 1000.0
        if len(self.fio_percentiles_ns) == 1:  # only exact when one job reported it
            value = self.fio_percentiles_ns[0].get(f"{p:.6f}")
            return None if value is None else value / 1000.0
        return None


@dataclass
class FioSummary:
    directions: dict[str, DirectionStats]
    elapsed_s: float  # fio's own runtime: groups run one after another, jobs within a group at once

    @property
    def io_bytes(self) -> int:
        return sum(d.io_bytes for d in self.directions.values())

    @property
    def total_ios(self) -> int:
        return sum(d.total_ios for d in self.directions.values())


def summarize(doc: dict[str, Any]) -> FioSummary:
    """Sum an fio JSON document: bytes and I/O counts over all jobs, latency bins merged, elapsed time
    as the sum over stonewalled groups of the longest job in each group."""
    directions = {d: DirectionStats() for d in DIRECTIONS}
    group_runtime_ms: dict[int, float] = {}
    for job in doc["jobs"]:
        try:
            group = int(job.get("groupid", 0))
            if "job_runtime" in job:
                runtime_ms = float(job["job_runtime"])
            else:  # fio before 3.23 has no job_runtime
                runtime_ms = max(float(job[d]["runtime"]) for d in DIRECTIONS)
            for d in DIRECTIONS:
                _add_direction(directions[d], job[d])
        except (KeyError, TypeError, ValueError) as e:
            raise WorkloadError(f"fio JSON job {job.get('jobname', '?')!r} lacks a field: {e}") from e
        group_runtime_ms[group] = max(group_runtime_ms.get(group, 0.0), runtime_ms)
    return FioSummary(directions=directions, elapsed_s=sum(group_runtime_ms.values()) / 1000.0)


def _add_direction(stats: DirectionStats, section: dict[str, Any]) -> None:
    stats.io_bytes += int(section["io_bytes"])
    stats.total_ios += int(section["total_ios"])
    clat = section.get("clat_ns", {})
    for ns, count in clat.get("bins", {}).items():
        stats.bins[int(ns)] = stats.bins.get(int(ns), 0) + int(count)
    if int(section["total_ios"]) and "percentile" in clat:
        stats.fio_percentiles_ns.append({k: float(v) for k, v in clat["percentile"].items()})


def _percentile_from_bins(bins: dict[int, int], p: float) -> float:
    total = sum(bins.values())
    rank = max(1, math.ceil(p / 100.0 * total))
    seen = 0
    for value in sorted(bins):
        seen += bins[value]
        if seen >= rank:
            return float(value)
    return float(max(bins))


def measurement(operation: str, runs: list[FioRun], directions: tuple[str, ...] = DIRECTIONS) -> Measurement:
    """One Measurement from the fio runs of one operation; latency over the given directions."""
    merged = DirectionStats()
    total_bytes = 0
    total_ios = 0
    elapsed_s = 0.0
    written = 0
    read = 0
    per_direction: dict[str, dict[str, float]] = {}
    for run in runs:
        summary = summarize(run.doc)
        elapsed_s += summary.elapsed_s
        written += summary.directions["write"].io_bytes
        read += summary.directions["read"].io_bytes
        for d in directions:
            stats = summary.directions[d]
            total_bytes += stats.io_bytes
            total_ios += stats.total_ios
            for ns, count in stats.bins.items():
                merged.bins[ns] = merged.bins.get(ns, 0) + count
            merged.fio_percentiles_ns += stats.fio_percentiles_ns
            entry = per_direction.setdefault(d, {"io_bytes": 0, "total_ios": 0})
            entry["io_bytes"] += stats.io_bytes
            entry["total_ios"] += stats.total_ios
    m = Measurement(operation=operation)
    m.elapsed_s = elapsed_s
    if elapsed_s > 0:
        m.throughput_bytes_per_s = total_bytes / elapsed_s
        m.iops = total_ios / elapsed_s
    else:
        m.extra["warning"] = "fio reported 0 ms runtime; throughput not computed"
    m.latency_p50_us, m.latency_p95_us, m.latency_p99_us, m.latency_p999_us = (
        merged.percentile_us(p) for p in PERCENTILES
    )
    m.logical_bytes_written = written
    m.logical_bytes_read = read
    m.commands = [run.argv for run in runs]
    m.raw_files = [path for run in runs for path in run.raw_files]
    m.extra["fio_wall_s"] = sum(run.wall_s for run in runs)
    m.extra["directions"] = per_direction
    return m
