"""The contract between the study runner (`zbdlab run`) and the workloads.

The runner provisions a target, mounts it, and for each measured *cell* of a workload calls
`Workload.execute(cell, ctx)`. A cell is one point of the workload's design (for the IOzone matrix:
file size x record size x threads); executing it yields one `Measurement` per operation (write,
rewrite, read, ...). Between operations the workload calls `ctx.between_operations()`, which the runner
implements according to the cache policy (cold: sync, unmount/remount, restart user-space parts, drop
caches; warm: nothing). The runner adds what the workload cannot know: CPU of the whole machine, bytes
moved on the backing devices, physical space and the compression ratio achieved.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from zbdlab.results.schema import OperationRecord


@dataclass(frozen=True)
class DataSpec:
    """What the workload writes. `kind` is "synthetic" (fio buffers with a declared compressibility),
    "corpus" (files copied from a built corpus directory) or "tool" (the tool's own data, e.g.
    postmark's random text, about 1.2:1)."""

    kind: str = "synthetic"
    compress_percentage: int = 50  # synthetic: fio buffer_compress_percentage
    corpus_dir: Path | None = None  # corpus: directory of real files to copy / draw from
    # synthetic: fio dedupe_percentage, the share of written blocks (fio's bs) that repeat an earlier one
    dedupe_percentage: int = 0

    @property
    def label(self) -> str:
        if self.kind == "synthetic":
            dedup = f":dedup{self.dedupe_percentage}" if self.dedupe_percentage else ""
            return f"synthetic:{self.compress_percentage}{dedup}"
        if self.kind == "corpus":
            return f"corpus:{self.corpus_dir.name if self.corpus_dir else '?'}"
        return self.kind

    @property
    def declared_ratio(self) -> float | None:
        """The compression ratio the data was declared to have, when it is synthetic."""
        if self.kind == "synthetic":
            return 100.0 / max(1, 100 - self.compress_percentage)
        return None

    @property
    def declared_dedup_ratio(self) -> float | None:
        """The dedup ratio the data was declared to have, when it is synthetic: 100 / (100 - p).
        It holds at the granularity of fio's block size; a target deduplicating larger blocks
        (a ZFS record of several fio blocks) finds fewer duplicates."""
        if self.kind == "synthetic":
            return 100.0 / max(1, 100 - self.dedupe_percentage)
        return None


@dataclass(frozen=True)
class Cell:
    """One point of a workload's design. Unused fields stay None."""

    file_size_bytes: int | None = None
    record_size_bytes: int | None = None
    threads: int = 1
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        parts = [f"fs{self.file_size_bytes}", f"rs{self.record_size_bytes}", f"t{self.threads}"]
        parts += [f"{k}{v}" for k, v in sorted(self.params.items())]
        return "-".join(parts)


@dataclass(kw_only=True)
class Measurement(OperationRecord):
    """What one operation of a cell measured: the run record's measured fields (`OperationRecord`,
    units in the names), plus how the workload got them, which goes under raw/ rather than into the
    row."""

    commands: list[list[str]] = field(default_factory=list)  # exact argv of every tool run
    raw_files: list[Path] = field(default_factory=list)  # raw outputs saved under ctx.raw_dir
    # What the operation really wrote, when the workload knows better than ctx.data (postmark writes
    # its own text whatever the study declares). None: ctx.data.label applies.
    data_label: str | None = None


@dataclass
class RunContext:
    mountpoint: Path  # directory on the mounted target where the workload creates its files
    raw_dir: Path  # where raw outputs and job files are saved (exists, empty)
    data: DataSpec
    between_operations: Callable[[], None] = lambda: None
    # Called just before and after each measured operation so the runner can sample CPU and
    # device counters around exactly that operation.
    before_operation: Callable[[str], None] = lambda op: None
    after_operation: Callable[[str], None] = lambda op: None
    # The study's memory_limit: each tool runs in a cgroup of this size (zbdlab.memlimit), and what
    # each group used is appended to memory_usage for the runner to record.
    memory_limit_bytes: int | None = None
    memory_usage: list[dict[str, int]] = field(default_factory=list)


class Workload(Protocol):
    name: str  # the workload's name in the study file

    def cells(self) -> Sequence[Cell]:
        """Every cell of the design, in a stable order."""
        ...

    def execute(self, cell: Cell, ctx: RunContext) -> list[Measurement]:
        """Run every operation of `cell` on ctx.mountpoint; raise WorkloadError on tool failure."""
        ...


class WorkloadError(RuntimeError):
    """A tool failed or its output could not be parsed; the message names the tool and the problem."""


class WorkloadConfigError(ValueError):
    """A workload's study-file table has a bad value. `key` is the table key (dotted for nested
    keys); the runner prefixes the study path and the workload name."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem
