"""Filebench-style personalities (fileserver, varmail, webserver, oltp) as fio job files.

Parameters follow Filebench's own workload files (filebench/filebench workloads/*.f, reproduced in
seed 004 appendix B): file counts, mean sizes, thread counts, I/O sizes, operation mix and fsync
behaviour. fio cannot create, delete or stat files during a run, and draws file sizes uniformly where
Filebench draws a gamma distribution; docs/workloads.md has the mapping table and these deviations.
`scale` multiplies the data set (file count, or file size for oltp's ten fixed files).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbdlab.workloads.base import Cell, Measurement, RunContext, WorkloadConfigError
from zbdlab.workloads.config import Table, format_size, parse_size
from zbdlab.workloads.fio import FIXED_SEED, JobFile, data_options, measurement, run_fio

KIB = 1024
MIB = 1024 * KIB
PERSONALITIES = ("fileserver", "varmail", "webserver", "oltp")


@dataclass(frozen=True)
class Profile:
    """Filebench's defaults for one personality."""

    nfiles: int
    mean_file_size: int
    threads: int
    io_size: int  # Filebench $iosize (whole-file reads/writes use it as the request size)
    append_size: int  # $meanappendsize (oltp: the log write size)


FILEBENCH = {
    "fileserver": Profile(
        nfiles=10000, mean_file_size=128 * KIB, threads=50, io_size=1 * MIB, append_size=16 * KIB
    ),
    "varmail": Profile(
        nfiles=1000, mean_file_size=16 * KIB, threads=16, io_size=1 * MIB, append_size=16 * KIB
    ),
    "webserver": Profile(
        nfiles=1000, mean_file_size=16 * KIB, threads=100, io_size=1 * MIB, append_size=16 * KIB
    ),
    # oltp: 10 data files of 10m, 1 log file of 10m, 200 readers ("shadows") of 2k, 10 writers of 2k.
    "oltp": Profile(nfiles=10, mean_file_size=10 * MIB, threads=200, io_size=2 * KIB, append_size=256 * KIB),
}
OLTP_DB_WRITERS = 10
OLTP_WRITES_PER_1000_READS = 100  # dbwr: semblock 1000 posts, then aiowrite riters=100
OLTP_READS_PER_LOG_WRITE = 3200  # lgwr: semblock value=3200
WEBSERVER_READS_PER_APPEND = 10  # ten openfile/readwholefile/closefile, then one log append


def _align(value: int, unit: int = 4 * KIB) -> int:
    return max(unit, value // unit * unit)


@dataclass
class Personality:
    name: str
    personality: str
    scale: float = 1.0
    threads: int | None = None
    runtime_s: int | None = None
    io_per_thread: int | None = None
    direct: bool = False
    keep_files: bool = False
    data_kinds: tuple[str, ...] = ("synthetic",)

    def cells(self) -> list[Cell]:
        return [Cell(threads=self._threads(), params={"personality": self.personality, "scale": self.scale})]

    def _threads(self) -> int:
        profile = FILEBENCH[self.personality]
        threads = self.threads or profile.threads
        if self.personality != "oltp":  # every thread needs a file of its own
            threads = min(threads, self._nfiles())
        return threads

    def _nfiles(self) -> int:
        profile = FILEBENCH[self.personality]
        if self.personality == "oltp":
            return profile.nfiles
        return max(1, round(profile.nfiles * self.scale))

    def execute(self, cell: Cell, ctx: RunContext) -> list[Measurement]:
        workdir = ctx.mountpoint / self.name
        workdir.mkdir(parents=True, exist_ok=True)
        job = self.render(cell, ctx, workdir)
        run = run_fio(job, f"{cell.key}-{self.personality}", ctx, self.personality)
        m = measurement(self.personality, [run])
        m.extra.update({"personality": self.personality, "scale": self.scale, "threads": cell.threads})
        if not self.keep_files:
            for path in workdir.iterdir():
                path.unlink()
        return [m]

    def render(self, cell: Cell, ctx: RunContext, workdir: Path) -> JobFile:
        common: dict[str, Any] = {
            "directory": str(workdir),
            "ioengine": "psync",
            "direct": int(self.direct),
            "invalidate": 0,
            "thread": True,
            "group_reporting": True,
            "randrepeat": 1,
            "randseed": FIXED_SEED,
            **data_options(ctx.data),
        }
        if self.runtime_s:
            common.update({"time_based": True, "runtime": self.runtime_s})
        job = JobFile(common)
        render = {"fileserver": self._fileserver, "varmail": self._varmail, "webserver": self._webserver}
        if self.personality == "oltp":
            self._oltp(job, cell.threads)
        else:
            render[self.personality](job, cell.threads)
        return job

    def _fileset(self, threads: int) -> tuple[dict[str, Any], int]:
        """Each thread owns nfiles/threads files, sizes uniform in mean/2..3*mean/2 (mean preserved)."""
        mean = FILEBENCH[self.personality].mean_file_size
        nrfiles = max(1, self._nfiles() // threads)
        low, high = _align(mean // 2), _align(mean * 3 // 2)
        io = self.io_per_thread or nrfiles * mean
        return {
            "numjobs": threads,
            "nrfiles": nrfiles,
            "filesize": f"{format_size(low)}-{format_size(high)}",
            "file_service_type": "random",
            "openfiles": min(nrfiles, 16),
            "io_size": format_size(_align(io)),
        }, low

    def _fileserver(self, job: JobFile, threads: int) -> None:
        # Per loop: create + write whole file, append 16k, read whole file, delete, stat.
        # By request count: 1 read per 2 writes; writes split between whole-file and 16k appends.
        fileset, low = self._fileset(threads)
        request = format_size(min(_align(FILEBENCH["fileserver"].io_size), low))
        append = format_size(min(FILEBENCH["fileserver"].append_size, low))
        job.add(
            "fileserver",
            {
                **fileset,
                "rw": "randrw",
                "rwmixread": 33,
                "bssplit": f"{request}/100,{request}/50:{append}/50",
            },
        )

    def _varmail(self, job: JobFile, threads: int) -> None:
        # Per loop: delete, create + append 16k + fsync, read whole + append 16k + fsync, read whole.
        fileset, low = self._fileset(threads)
        request = format_size(min(FILEBENCH["varmail"].append_size, low))
        job.add("varmail", {**fileset, "rw": "randrw", "rwmixread": 50, "bs": request, "fsync": 1})

    def _webserver(self, job: JobFile, threads: int) -> None:
        # Per loop: 10 x (open, read whole file, close), then append 16k to one shared log file.
        fileset, low = self._fileset(threads)
        request = min(FILEBENCH["webserver"].append_size, low)
        job.add("webserver", {**fileset, "rw": "randread", "bs": format_size(request)})
        reads = threads * parse_size(fileset["io_size"], "io_size") // request
        appends = max(1, reads // WEBSERVER_READS_PER_APPEND)
        job.add(
            "webserver_log",
            {
                "filename": "weblog",
                "rw": "write",
                "bs": format_size(FILEBENCH["webserver"].append_size),
                "size": format_size(appends * FILEBENCH["webserver"].append_size),
                "numjobs": 1,
            },
        )

    def _oltp(self, job: JobFile, threads: int) -> None:
        # 10 data files shared by all processes; readers 2k random; db writers 2k random dsync;
        # one log writer 256k dsync; ratios from Filebench's semaphores.
        profile = FILEBENCH["oltp"]
        file_size = _align(int(profile.mean_file_size * self.scale), 256 * KIB)
        datafiles = ":".join(f"oltp.data.{i}" for i in range(profile.nfiles))
        total = profile.nfiles * file_size
        reads_per_thread = max(1, (self.io_per_thread or total // threads) // profile.io_size)
        reads = reads_per_thread * threads
        writer_writes = max(1, reads * OLTP_WRITES_PER_1000_READS // 1000 // OLTP_DB_WRITERS)
        log_writes = max(1, reads // OLTP_READS_PER_LOG_WRITE)
        shared = {
            "filename": datafiles,
            "filesize": format_size(file_size),
            "bs": format_size(profile.io_size),
        }
        job.add(
            "oltp_shadow",
            {
                **shared,
                "rw": "randread",
                "numjobs": threads,
                "io_size": format_size(reads_per_thread * profile.io_size),
            },
        )
        job.add(
            "oltp_dbwr",
            {
                **shared,
                "rw": "randwrite",
                "numjobs": OLTP_DB_WRITERS,
                "sync": "dsync",
                "io_size": format_size(writer_writes * profile.io_size),
            },
        )
        job.add(
            "oltp_lgwr",
            {
                "filename": "oltp.log",
                "filesize": format_size(file_size),
                "rw": "randwrite",
                "bs": format_size(profile.append_size),
                "sync": "dsync",
                "numjobs": 1,
                "io_size": format_size(log_writes * profile.append_size),
            },
        )


def from_config(name: str, table: dict[str, Any]) -> Personality:
    t = Table(table)
    personality = table.get("type", name)
    if personality not in PERSONALITIES:
        raise WorkloadConfigError("type", f"must be one of {', '.join(PERSONALITIES)}; got {personality!r}")
    scale = t.number("scale", 1.0, low=1e-6, high=1e6)
    threads = t.integer("threads", 0, low=0, high=4096) or None
    runtime_s = t.integer("runtime_s", 0, low=0, high=86400) or None
    io_per_thread = t.size("io_per_thread", 1) if t.has("io_per_thread") else None
    direct = t.boolean("direct", False)
    keep_files = t.boolean("keep_files", False)
    t.done()
    if personality == "oltp" and int(FILEBENCH["oltp"].mean_file_size * scale) < 256 * KIB:
        raise WorkloadConfigError(
            "scale", "oltp files would be smaller than 256K (one log write); raise scale"
        )
    return Personality(
        name=name,
        personality=personality,
        scale=scale,
        threads=threads,
        runtime_s=runtime_s,
        io_per_thread=io_per_thread,
        direct=direct,
        keep_files=keep_files,
    )
