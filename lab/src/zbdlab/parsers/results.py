"""zbdlab results directories (runs.jsonl of RunRecord rows, environment.json, study.toml).

Rows with `discarded: true` are kept by the runner but never enter statistics. A row's cell is
(operation, file size, record size); runs with threads > 1 become operation `<op>@<n>t`, and when a
directory holds several workloads the operation is prefixed `<workload>:` so unlike cells never mix.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zbdlab.parsers.model import BYTES_PER_MB, CellKey, DataSet, InputError, Sample
from zbdlab.results.schema import SCHEMA_VERSION, RunRecord


@dataclass
class ResultsDir:
    path: Path
    study_name: str
    targets: list[str]  # in study order (first = baseline in `zbdlab report`)
    records: list[RunRecord] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def is_results_dir(path: Path) -> bool:
    return path.is_dir() and (path / "runs.jsonl").is_file()


def _study_info(path: Path) -> tuple[str | None, list[str]]:
    study_file = path / "study.toml"
    if not study_file.is_file():
        return None, []
    try:
        study = tomllib.loads(study_file.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None, []
    header = study.get("study") if isinstance(study.get("study"), dict) else study
    name = header.get("name") if isinstance(header.get("name"), str) else None
    targets = study.get("targets") or study.get("target") or []
    if isinstance(targets, dict):
        order = list(targets)
    else:
        order = [t["name"] for t in targets if isinstance(t, dict) and isinstance(t.get("name"), str)]
    return name, order


def load_results_dir(path: Path) -> ResultsDir:
    runs_file = path / "runs.jsonl"
    if not runs_file.is_file():
        raise InputError(f"{path}: not a zbdlab results directory (no runs.jsonl)")
    study_name, study_targets = _study_info(path)
    result = ResultsDir(path=path, study_name=study_name or path.name, targets=[])
    env_file = path / "environment.json"
    if env_file.is_file():
        try:
            result.environment = json.loads(env_file.read_text())
        except json.JSONDecodeError:
            result.warnings.append(f"{env_file}: not valid JSON, ignored")
    for number, line in enumerate(runs_file.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            result.warnings.append(f"{runs_file}:{number}: not valid JSON (truncated?), skipped")
            continue
        if int(row.get("schema_version", 1)) > SCHEMA_VERSION:
            result.warnings.append(f"{runs_file}:{number}: newer schema_version {row['schema_version']}")
        try:
            record = RunRecord.from_row(row)
        except TypeError as exc:
            result.warnings.append(f"{runs_file}:{number}: missing field ({exc}), skipped")
            continue
        result.records.append(record)
    if not result.records:
        raise InputError(f"{runs_file}: no run records")
    seen = list(dict.fromkeys(r.target for r in result.records))
    result.targets = [t for t in study_targets if t in seen] + [t for t in seen if t not in study_targets]
    return result


def _operation(record: RunRecord, many_workloads: bool) -> str:
    op = record.operation
    if record.threads and record.threads > 1:
        op = f"{op}@{record.threads}t"
    return f"{record.workload}:{op}" if many_workloads else op


def _metrics(r: RunRecord) -> dict[str, float]:
    m: dict[str, float] = {}
    moved = (r.logical_bytes_written or 0) + (r.logical_bytes_read or 0)
    if r.cpu_user_s is not None and r.cpu_system_s is not None and moved > 0:
        m["cpu_s_per_gb"] = (r.cpu_user_s + r.cpu_system_s) / (moved / 1e9)
    if r.backing_bytes_written is not None and r.logical_bytes_written:
        m["write_amplification"] = r.backing_bytes_written / r.logical_bytes_written
    if r.physical_bytes_used is not None:
        m["physical_mb"] = r.physical_bytes_used / BYTES_PER_MB
    if r.compression_ratio is not None:
        m["compression_ratio"] = float(r.compression_ratio)
    if r.dedup_ratio is not None:
        m["dedup_ratio"] = float(r.dedup_ratio)
    for name in ("latency_p50_us", "latency_p95_us", "latency_p99_us", "latency_p999_us"):
        value = getattr(r, name)
        if value is not None:
            m[name] = float(value)
    return m


def results_to_set(results: ResultsDir, name: str, target: str | None = None) -> DataSet:
    """One set from a results dir: all its rows, or only one target's rows."""
    data = DataSet(name=name, source=str(results.path), kind="zbdlab", warnings=list(results.warnings))
    kept = [r for r in results.records if target is None or r.target == target]
    discarded = sum(1 for r in kept if r.discarded)
    if discarded:
        data.warnings.append(f"{discarded} discarded run(s) excluded from statistics")
    many_workloads = len({r.workload for r in results.records}) > 1
    for r in kept:
        if r.discarded:
            continue
        cell = CellKey(
            _operation(r, many_workloads),
            None if r.file_size_bytes is None else r.file_size_bytes // 1024,
            None if r.record_size_bytes is None else r.record_size_bytes // 1024,
        )
        if r.throughput_bytes_per_s:
            value, unit = r.throughput_bytes_per_s / BYTES_PER_MB, "MB/s"
        elif r.iops:
            value, unit = float(r.iops), "ops/s"
        else:
            data.warnings.append(f"{name}: run {r.run_id} has neither throughput nor iops; skipped")
            continue
        data.samples.append(
            Sample(cell=cell, run=f"rep{r.repetition}", value=value, unit=unit, metrics=_metrics(r))
        )
    data.runs = sorted({s.run for s in data.samples})
    data.notes = throttle_notes(results.environment, [target] if target else results.targets)
    measured = target or (results.targets[0] if len(results.targets) == 1 else None)
    options = (results.environment.get("targets") or {}).get(measured) if measured else None
    data.target = dict(options) if isinstance(options, dict) else {}
    if not data.samples:
        raise InputError(f"{results.path}: no usable (non-discarded) runs for set {name!r}")
    return data


def throttle_notes(environment: dict[str, Any], targets: list[str]) -> list[str]:
    """One line per throttled target, and the measured overhead of the throttling chain."""
    notes = []
    options = environment.get("targets") or {}
    for name in targets:
        throttle = (options.get(name) or {}).get("throttle")
        if throttle:
            notes.append(f"{name}: on a throttled disk ({throttle.get('label')})")
    overhead = environment.get("throttle_overhead")
    if notes and overhead:
        pct = overhead.get("overhead_pct") or {}
        parts = ", ".join(f"{k} {v:+.0f} %" for k, v in pct.items())
        notes.append(f"throttle chain overhead when unthrottled, vs a plain loop device: {parts}")
    return notes
