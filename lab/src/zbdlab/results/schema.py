"""The tidy results table written by `zbdlab run` and read by `zbdlab compare/report`.

A results directory holds:
  study.toml         the study file as run
  environment.json   kernel, CPU, RAM, tool versions (one object)
  runs.jsonl         one JSON object per run, fields below (units in the names)
  runs.csv           the same table as CSV
  raw/<run_id>/      raw tool outputs and the exact commands

Version history of `schema_version`:
  1  first version
  2  adds unit_id, target_kind, compression, cpu_iowait_s, fuse_bound, order_index (all optional;
     a version-1 row reads as version 2 with them unset). Also written: commands.jsonl (every tool
     argv), plan.json (seed and run order) and warnings.json (study-level validity warnings).
     Later additions within version 2 (optional, unset in older rows): declared_dedup_ratio and
     dedup_ratio.

One definition of a row: `RunRecord`, whose measured fields are `OperationRecord`'s (what a workload
fills, the same class its `Measurement` derives from). runs.jsonl rows are written with sorted keys,
so how the fields are grouped in code does not change the file; `RunRecord.from_row` reads a row of
any version. runs.csv's columns are `RunRecord.field_names()`: which run first, then the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 2

# The `operation` vocabulary of IOzone-style rows, in the order IOzone prints its columns. The last
# four are IOzone's stdio variants (fwrite/fread through the C library); raw IOzone outputs carry
# them, `zbdlab run` does not measure them.
IOZONE_OPERATIONS = (
    "write",
    "rewrite",
    "read",
    "reread",
    "random_read",
    "random_write",
    "backward_read",
    "record_rewrite",
    "stride_read",
    "fwrite",
    "frewrite",
    "fread",
    "freread",
)


@dataclass(kw_only=True)
class OperationRecord:
    """What one operation measured, in the units its names say: the part of a run's record that the
    workload fills. `zbdlab.workloads.base.Measurement` is this plus the workload's provenance (tool
    argv, raw files); `RunRecord` is this plus which run it was and what the runner's monitors saw."""

    operation: str  # IOzone-style op name: write, rewrite, read, reread, random_read, random_write,
    # backward_read, record_rewrite, stride_read; or postmark, fileserver, copy, ...
    throughput_bytes_per_s: float | None = None
    iops: float | None = None
    latency_p50_us: float | None = None
    latency_p95_us: float | None = None
    latency_p99_us: float | None = None
    latency_p999_us: float | None = None
    elapsed_s: float | None = None
    logical_bytes_written: int | None = None  # bytes the workload wrote
    logical_bytes_read: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def operation_fields(self) -> dict[str, Any]:
        """This operation's fields by name, and only those (not a subclass's)."""
        return {f.name: getattr(self, f.name) for f in fields(OperationRecord)}


# The first columns of runs.csv: which run a row is. The other columns follow in field order.
LEADING_COLUMNS = (
    "run_id",
    "target",
    "workload",
    "operation",
    "repetition",
    "file_size_bytes",
    "record_size_bytes",
    "threads",
)


@dataclass(kw_only=True)
class RunRecord(OperationRecord):
    """One measured run: one workload operation on one target, one repetition. The measured fields
    are `OperationRecord`'s; these are what the runner adds."""

    run_id: str
    target: str  # target name from the study file, e.g. "ext4", "btrfs-zstd", "ext4-on-zbd-lz4"
    workload: str  # workload name from the study file
    repetition: int
    file_size_bytes: int | None = None
    record_size_bytes: int | None = None
    threads: int = 1
    cpu_user_s: float | None = None
    cpu_system_s: float | None = None
    backing_bytes_written: int | None = None  # bytes written to the backing device(s)
    backing_bytes_read: int | None = None
    physical_bytes_used: int | None = None  # space used on the backing store after the run
    data_bytes_stored: int | None = None  # logical size of the data the target holds
    compression_ratio: float | None = None  # achieved: data_bytes_stored / physical bytes for that data
    declared_compressibility: float | None = None  # ratio the data was declared to have, if synthetic
    data_kind: str | None = None  # "synthetic:<pct>", "corpus:<name>", "postmark-text", ...
    cache_policy: str | None = None  # "cold" | "warm"
    discarded: bool = False  # warm-cache first run, kept but excluded from statistics
    warnings: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    # version 2
    unit_id: str | None = None  # the cell execution this run belongs to (target/rep/workload/cell)
    target_kind: str | None = None  # "ext4", "btrfs", "zfs", "ext4-on-zbd", ...
    compression: str | None = None  # what compresses: "btrfs:zstd:3", "zfs:gzip", "zbd:lz4", "off"
    cpu_iowait_s: float | None = None
    fuse_bound: bool = False  # measured through FUSE (zfs-fuse): speed bounded by FUSE, not the fs
    order_index: int | None = None  # position of the unit in the executed order
    # added within version 2
    declared_dedup_ratio: float | None = None  # dedup ratio the data was declared to have, if synthetic
    dedup_ratio: float | None = None  # achieved: ZFS pool dedupratio (None where not measured)

    @classmethod
    def of(cls, measured: OperationRecord, **runner: Any) -> RunRecord:
        """The record of one measured operation: its `OperationRecord` fields as the workload gave
        them, and what the runner adds (`runner`). A measured field named in `runner` is the
        runner's: its wall time where the workload has none, its extra merged with the workload's."""
        return cls(**{**measured.operation_fields(), **runner})

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RunRecord:
        """A row of runs.jsonl, of any schema version up to this one. Version 1 rows lack the fields
        of version 2, which keep their defaults; fields this version does not know (a newer
        version's) are left out. A row without a required field raises TypeError."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in known})

    @classmethod
    def field_names(cls) -> list[str]:
        """Every field, in the column order of runs.csv: LEADING_COLUMNS, then the rest in field order."""
        names = [f.name for f in fields(cls)]
        return [*LEADING_COLUMNS, *(n for n in names if n not in LEADING_COLUMNS)]
