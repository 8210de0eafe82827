"""The IOzone matrix and IOzone's throughput mode, run with fio.

IOzone's operations map onto fio job semantics (docs/workloads.md has the table and IOzone's own
definitions). Operations of one cell run in IOzone's order on the same file(s), with
`ctx.between_operations()` between them, so the runner's cache policy decides what a re-read sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zbdlab.results.schema import IOZONE_OPERATIONS as ALL_IOZONE_OPERATIONS
from zbdlab.workloads.base import Cell, Measurement, RunContext, WorkloadConfigError
from zbdlab.workloads.config import Table, format_size
from zbdlab.workloads.fio import FIXED_SEED, FioRun, JobFile, data_options, measurement, run_fio

# IOzone's order (-i 0 write/rewrite, 1 read/reread, 2 random read/write, 3 backward read,
# 4 record rewrite, 5 stride read).
# The stdio variants (fwrite, ...) measure the C library, not the filesystem, and are not run.
IOZONE_OPERATIONS = ALL_IOZONE_OPERATIONS[: ALL_IOZONE_OPERATIONS.index("stride_read") + 1]
WRITES = {"write", "rewrite", "random_write", "record_rewrite"}
IOZONE_STRIDE_RECORDS = 17  # IOzone's default stride (-j): 17 x record size


@dataclass
class FioFileMatrix:
    """Shared engine: IOzone operations on one file per thread under <mountpoint>/<name>/."""

    name: str
    operations: list[str]
    direct: bool = False
    stride_records: int = IOZONE_STRIDE_RECORDS
    ioengine: str = "psync"
    keep_files: bool = False
    data_kinds: tuple[str, ...] = ("synthetic",)

    def execute(self, cell: Cell, ctx: RunContext) -> list[Measurement]:
        assert cell.file_size_bytes is not None and cell.record_size_bytes is not None
        workdir = ctx.mountpoint / self.name
        workdir.mkdir(parents=True, exist_ok=True)
        ops = [op for op in IOZONE_OPERATIONS if op in self.operations]
        results: list[Measurement] = []
        prepared = ops[0] == "write"
        if not prepared:  # every other operation needs the file to exist: write it, unmeasured
            _remove_files(workdir, cell.threads)
            run_fio(self._job("write", cell, ctx, workdir), f"{cell.key}-prepare", ctx, None)
            ctx.between_operations()
        for i, op in enumerate(ops):
            if i:
                ctx.between_operations()
            if op == "write":  # IOzone's write test writes a new file
                _remove_files(workdir, cell.threads)
            runs = self._run_operation(op, cell, ctx, workdir)
            m = measurement(op, runs, ("write",) if op in WRITES else ("read",))
            m.extra.update({"direct": self.direct, "ioengine": self.ioengine})
            results.append(m)
        if not self.keep_files:
            _remove_files(workdir, cell.threads)
        return results

    def _run_operation(self, op: str, cell: Cell, ctx: RunContext, workdir: Path) -> list[FioRun]:
        return [run_fio(self._job(op, cell, ctx, workdir), f"{cell.key}-{op}", ctx, op)]

    def _job(self, op: str, cell: Cell, ctx: RunContext, workdir: Path) -> JobFile:
        file_size = int(cell.file_size_bytes or 0)
        record = int(cell.record_size_bytes or 0)
        common: dict[str, Any] = {
            "directory": str(workdir),
            "filename_format": "iozone.$jobnum",
            "ioengine": self.ioengine,
            "direct": int(self.direct),
            "invalidate": 0,  # the runner's cache policy decides what is cached, not fio
            "thread": True,
            "numjobs": cell.threads,
            "group_reporting": True,
            "bs": format_size(record),
            "randrepeat": 1,
            "randseed": FIXED_SEED,
            **data_options(ctx.data),
        }
        job = JobFile(common)
        size = format_size(file_size)
        if op in ("write", "rewrite"):
            job.add(op, {"rw": "write", "size": size, "end_fsync": 1})
        elif op in ("read", "reread"):
            job.add(op, {"rw": "read", "size": size})
        elif op == "random_read":
            job.add(op, {"rw": "randread", "size": size})
        elif op == "random_write":
            job.add(op, {"rw": "randwrite", "size": size, "end_fsync": 1})
        elif op == "record_rewrite":
            # The same record (offset 0) rewritten file_size / record_size times.
            job.add(
                op, {"rw": "write", "offset": 0, "size": format_size(record), "io_size": size, "end_fsync": 1}
            )
        elif op in ("backward_read", "stride_read"):
            # fio 3.33 crashes (SIGSEGV) replaying a log under `directory=`; the log has full paths.
            del job.global_options["directory"], job.global_options["filename_format"]
            records = file_size // record
            order = (
                backward_order(records)
                if op == "backward_read"
                else stride_order(records, self.stride_records)
            )
            files = [workdir / f"iozone.{n}" for n in range(cell.threads)]
            _replay_jobs(job, op, order, record, files, ctx.raw_dir / f"{cell.key}-{op}")
        else:  # pragma: no cover - operations are validated when the workload is built
            raise AssertionError(op)
        return job


def backward_order(records: int) -> list[int]:
    """IOzone's backward read: every record once, last to first."""
    return list(range(records - 1, -1, -1))


def stride_order(records: int, stride: int) -> list[int]:
    """IOzone's strided read, step for step (read_stride_perf_test in iozone.c): `records` reads; after
    reading record p, the next is p + stride, unless that passes (records - 2) - then a new pass starts
    at record w % records, where w counts the passes. Like IOzone it reads some records twice and may
    skip the last ones; the bytes read equal the file size."""
    order = []
    position = wraps = 0
    for _ in range(records):
        order.append(position)
        if position + 1 + stride >= records - 1:
            wraps += 1
            position = 0 if records <= stride else wraps % records
        else:
            position += stride
    return order


def _replay_jobs(
    job: JobFile, op: str, order: list[int], record: int, files: list[Path], log_stem: Path
) -> None:
    """One job per file replaying an fio I/O log of the records in `order` (all in one group, so they
    run at once and report together). fio's own backward and skip modes wrap around differently from
    IOzone, so the exact offsets are written out instead; the logs stay in raw_dir as evidence."""
    for n, path in enumerate(files):
        log = log_stem.with_name(f"{log_stem.name}.{n}.iolog")
        lines = ["fio version 2 iolog", f"{path} add", f"{path} open"]
        lines += [f"{path} read {r * record} {record}" for r in order]
        lines.append(f"{path} close")
        log.write_text("\n".join(lines) + "\n")
        job.add(
            f"{op}.{n}", {"filename": str(path), "numjobs": 1, "read_iolog": str(log), "replay_no_stall": 1}
        )


def _remove_files(workdir: Path, threads: int) -> None:
    for n in range(threads):
        (workdir / f"iozone.{n}").unlink(missing_ok=True)


@dataclass
class IozoneWorkload(FioFileMatrix):
    """IOzone's automatic matrix: every operation over file sizes x record sizes (x threads)."""

    file_sizes: list[int] = field(default_factory=list)
    record_sizes: list[int] = field(default_factory=list)
    threads: list[int] = field(default_factory=lambda: [1])

    def cells(self) -> list[Cell]:
        return [
            Cell(file_size_bytes=fs, record_size_bytes=rs, threads=t)
            for t in self.threads
            for fs in self.file_sizes
            for rs in self.record_sizes
            if rs <= fs
        ]


@dataclass
class ThroughputWorkload(FioFileMatrix):
    """IOzone's throughput mode (-l 1 -u N): 1..N concurrent jobs, each on its own file."""

    file_size: int = 0
    record_size: int = 0
    threads: list[int] = field(default_factory=lambda: [1])

    def cells(self) -> list[Cell]:
        return [
            Cell(file_size_bytes=self.file_size, record_size_bytes=self.record_size, threads=t)
            for t in self.threads
        ]


def _common(t: Table, default_ops: list[str]) -> dict[str, Any]:
    return {
        "operations": t.choices("operations", default_ops, IOZONE_OPERATIONS),
        "direct": t.boolean("direct", False),
        "stride_records": t.integer("stride_records", IOZONE_STRIDE_RECORDS, low=1, high=4096),
        "ioengine": t.choice("ioengine", "psync", ("psync", "sync", "libaio", "io_uring")),
        "keep_files": t.boolean("keep_files", False),
    }


def iozone_from_config(name: str, table: dict[str, Any]) -> IozoneWorkload:
    t = Table(table)
    common = _common(t, list(IOZONE_OPERATIONS))
    file_sizes = t.sizes("file_sizes", ["64M", "256M"])
    record_sizes = t.sizes("record_sizes", ["4K", "64K", "1M"])
    threads = t.integers("threads", [1], high=256)
    t.done()
    if not any(rs <= fs for fs in file_sizes for rs in record_sizes):
        raise WorkloadConfigError("record_sizes", "every record size is larger than every file size")
    for i, fs in enumerate(file_sizes):
        if any(fs % rs for rs in record_sizes if rs <= fs):
            raise WorkloadConfigError(f"file_sizes[{i}]", "must be a multiple of every record size")
    return IozoneWorkload(
        name=name, file_sizes=file_sizes, record_sizes=record_sizes, threads=threads, **common
    )


def throughput_from_config(name: str, table: dict[str, Any]) -> ThroughputWorkload:
    t = Table(table)
    common = _common(t, ["write", "read", "random_read", "random_write"])
    file_size = t.size("file_size", "64M")
    record_size = t.size("record_size", "64K")
    if t.has("threads"):
        threads = t.integers("threads", [1], high=256)
    else:  # IOzone's -l / -u
        low = t.integer("min_threads", 1, high=256)
        high = t.integer("max_threads", 5, high=256)
        if high < low:
            raise WorkloadConfigError("max_threads", f"must be >= min_threads ({low}), got {high}")
        threads = list(range(low, high + 1))
    t.done()
    if record_size > file_size or file_size % record_size:
        raise WorkloadConfigError("file_size", "must be a multiple of record_size")
    return ThroughputWorkload(
        name=name, file_size=file_size, record_size=record_size, threads=threads, **common
    )
