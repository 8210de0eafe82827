"""fio `--output-format=json` files: one file is one run; each job direction is one cell.

The cell's operation comes from the job's `rw` (read, write, randread -> random_read, ...; mixed
modes give `randrw:read` and `randrw:write`), its record size from `bs` and its file size from `size`.
Jobs of the same name in one file (numjobs without group_reporting) are summed, as they ran together.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from zbdlab.parsers.model import BYTES_PER_MB, CellKey, InputError, Sample

_RW = {
    "read": "read",
    "write": "write",
    "randread": "random_read",
    "randwrite": "random_write",
    "trim": "trim",
    "randtrim": "random_trim",
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*$", re.I)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_PERCENTILES = {"latency_p50_us": "50.0", "latency_p95_us": "95.0", "latency_p99_us": "99.0"}
_PERCENTILES["latency_p999_us"] = "99.9"


def parse_size_bytes(text: str | None) -> int | None:
    """fio size strings ("4k", "1g", "64m", "4096") -> bytes, with fio's default kb_base=1024."""
    if not text:
        return None
    first = str(text).split(",")[0].split("-")[0].split(":")[0]
    match = _SIZE.match(first)
    if not match:
        return None
    return int(float(match.group(1)) * 1024 ** _POWERS[match.group(2).lower()])


def _percentile_us(stats: dict[str, Any], wanted: str) -> float | None:
    for key, value in (stats.get("percentile") or {}).items():
        if abs(float(key) - float(wanted)) < 1e-9:
            return float(value) / 1000.0
    return None


def _direction_metrics(job: dict[str, Any], direction: dict[str, Any]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    latency = direction.get("clat_ns") or direction.get("lat_ns") or {}
    for name, wanted in _PERCENTILES.items():
        value = _percentile_us(latency, wanted)
        if value is not None:
            metrics[name] = value
    runtime_s = float(job.get("job_runtime", 0) or 0) / 1000.0
    cpu_s = (float(job.get("usr_cpu", 0) or 0) + float(job.get("sys_cpu", 0) or 0)) / 100.0 * runtime_s
    io_bytes = float(direction.get("io_bytes", 0) or 0)
    if io_bytes > 0 and runtime_s > 0:
        metrics["cpu_s_per_gb"] = cpu_s / (io_bytes / 1e9)
    return metrics


def fio_samples(path: Path, run_id: str) -> tuple[list[Sample], list[str]]:
    try:
        text = path.read_text(errors="replace")
        document = json.loads(text[text.find("{") :] if "{" in text else text)  # fio may print notes first
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}); truncated fio output?"
        ) from exc
    jobs = document.get("jobs") if isinstance(document, dict) else None
    if not isinstance(jobs, list) or not jobs:
        raise InputError(f"{path}: no 'jobs' list; not fio --output-format=json output")
    global_options = document.get("global options") or {}
    grouped: dict[tuple[str, CellKey], list[tuple[float, dict[str, float]]]] = {}
    warnings: list[str] = []
    for job in jobs:
        options = {**global_options, **(job.get("job options") or {})}
        rw = str(options.get("rw") or options.get("readwrite") or "read").split(":")[0]
        record = parse_size_bytes(options.get("bs") or options.get("blocksize") or "4k")
        size = parse_size_bytes(options.get("size") or options.get("filesize"))
        for direction_name in ("read", "write", "trim"):
            direction = job.get(direction_name) or {}
            if not float(direction.get("io_bytes", 0) or 0):
                continue
            operation = _RW.get(rw, f"{rw}:{direction_name}")
            cell = CellKey(
                operation,
                None if size is None else size // 1024,
                None if record is None else record // 1024,
            )
            value = float(direction.get("bw_bytes", 0) or 0) / BYTES_PER_MB
            key = (str(job.get("jobname", "")), cell)
            grouped.setdefault(key, []).append((value, _direction_metrics(job, direction)))
    names_per_cell: dict[CellKey, set[str]] = {}
    for name, cell in grouped:
        names_per_cell.setdefault(cell, set()).add(name)
    samples = []
    for (name, cell), parts in grouped.items():
        if len(names_per_cell[cell]) > 1:
            cell = CellKey(f"{name}:{cell.operation}", cell.file_size_kb, cell.record_size_kb)
        total = sum(value for value, _ in parts)
        if total <= 0:
            warnings.append(f"{path}: job {name!r} reported no bandwidth for {cell.operation}; ignored")
            continue
        # Latency percentiles of summed jobs: the first job's (a lower bound on the tail), noted in docs.
        samples.append(Sample(cell=cell, run=run_id, value=total, metrics=dict(parts[0][1])))
    if not samples:
        raise InputError(f"{path}: fio jobs moved no data")
    return samples, warnings


def looks_like_fio(path: Path) -> bool:
    try:
        head = path.read_text(errors="replace")[:4000]
    except OSError:
        return False
    return '"fio version"' in head or '"jobs"' in head
