"""Validity warnings: conditions under which a figure does not mean what it seems to.

Per-run warnings go into the row; study-level ones (variation across repetitions) into warnings.json.
All are printed at the end.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from zbdlab.config import Study, TargetSpec

CV_MAX = 0.10
REPETITIONS_MIN = 5
COMPRESSIBILITY_TOLERANCE = 0.25
DEDUP_TOLERANCE = 0.25


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= (1 << 30) else f"{n / (1 << 20):.1f} MiB"


def cache_fit(working_set: int | None, mem_available: int, study: Study) -> str | None:
    if study.measures != "disk" or not working_set or working_set > mem_available:
        return None
    how = (
        "reads inside an operation may come from memory"
        if study.cache == "cold"
        else "warm-cache reads come from memory, not the disk"
    )
    return (
        f"working set {_gib(working_set)} fits in the page cache available "
        f"({'memory_limit' if study.memory_limit else 'MemAvailable'} {_gib(mem_available)}): "
        f"{how}"
    )


def compressibility(
    target: TargetSpec, achieved: float | None, declared: float | None, realistic: float
) -> str | None:
    if not target.compression_under_test or achieved is None:
        return None
    reference, what = (declared, "declared") if declared else (realistic, "realistic-mix")
    return _far_off("compression", achieved, reference, what, COMPRESSIBILITY_TOLERANCE)


def dedup(target: TargetSpec, achieved: float | None, declared: float | None) -> str | None:
    """The pool's dedup ratio against the data's declared one, on a ZFS target with dedup on. ZFS
    deduplicates whole records: fio blocks smaller than the recordsize rarely make a whole record
    repeat, and that is exactly the case this warning is meant to catch."""
    if target.fs != "zfs" or target.dedup == "off" or achieved is None or not declared:
        return None
    return _far_off("dedup", achieved, declared, "declared", DEDUP_TOLERANCE)


def _far_off(ratio: str, achieved: float, reference: float, what: str, tolerance: float) -> str | None:
    off = achieved / reference - 1
    if abs(off) <= tolerance:
        return None
    return (
        f"achieved {ratio} ratio {achieved:.2f} is {abs(off) * 100:.0f} % "
        f"{'above' if off > 0 else 'below'} the {what} {reference:.2f}"
    )


def static_warnings(study: Study, target: TargetSpec, fuse_bound: bool) -> list[str]:
    out: list[str] = []
    kept = study.repetitions - (1 if study.cache == "warm" and study.repetitions > 1 else 0)
    if kept < REPETITIONS_MIN:
        out.append(f"only {kept} repetition(s) kept (fewer than {REPETITIONS_MIN}): statistics are weak")
    if target.is_raid and not target.real_devices:
        out.append(
            "RAID over loop files on one disk: shows layout and CPU effects only, no spindle parallelism"
        )
    if fuse_bound:
        out.append("ZFS through zfs-fuse: speed is FUSE-bound, not comparable with kernel filesystems")
    return out


def variation(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Coefficient of variation of throughput across repetitions, per target/workload/cell/operation."""
    groups: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    for r in rows:
        value = r.get("throughput_bytes_per_s")
        if r.get("discarded") or value is None:
            continue
        cell = (r.get("extra") or {}).get("cell_key", "")
        groups[(r["target"], r["workload"], cell, r["operation"])].append(float(value))
    out = []
    for (target, workload, cell, op), values in sorted(groups.items()):
        if len(values) < 2:
            continue
        mean = statistics.fmean(values)
        if mean <= 0:
            continue
        cv = statistics.stdev(values) / mean
        if cv > CV_MAX:
            out.append(
                {
                    "target": target,
                    "workload": workload,
                    "cell": cell,
                    "operation": op,
                    "cv": round(cv, 4),
                    "n": len(values),
                    "warning": f"{target} {workload} {cell} {op}: coefficient of variation {cv * 100:.0f} % "
                    f"> {CV_MAX * 100:.0f} % over {len(values)} runs",
                }
            )
    return out
