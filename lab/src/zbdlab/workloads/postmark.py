"""PostMark (the Debian `postmark` binary, v1.51) driven by a generated command file.

PostMark writes its own data (random printable characters, 32 + a number below 95: about 1.2:1 with
zlib, nothing with lz4 or lzo), whatever the study declares, so its measurements carry that label, and
it has no option to write anything else. With `write_data = "<file>"` its bytes are replaced: a small
LD_PRELOAD shim (postmark_data.c, built with cc into zbdlab's cache) interposes its fwrite/write calls
to regular files and fills them from that file, read as one stream, so PostMark's operations stay
exactly its own and only the bytes differ (the ZBD paper modified PostMark to write real mail). Its
report counts whole seconds only; the elapsed time we report is the wall clock around the process,
and PostMark's own figures go in `extra`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbdlab.workloads.base import Cell, Measurement, RunContext, WorkloadConfigError, WorkloadError
from zbdlab.workloads.config import Table
from zbdlab.workloads.tool import run_measured

POSTMARK = "postmark"
DATA_LABEL = "postmark random text, about 1.2:1"
SHIM_SOURCE = Path(__file__).with_name("postmark_data.c")
DATA_ENV = "ZBDLAB_POSTMARK_DATA"
_REPLACED = re.compile(r"zbdlab postmark data: (\d+) bytes replaced")


def shim_path(cache: Path | None = None) -> Path:
    """The data shim as a shared library, built with cc on first use into zbdlab's cache (the file
    name carries the source's hash, so an edited source is rebuilt)."""
    source = SHIM_SOURCE.read_bytes()
    root = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zbdlab"
    lib = root / f"postmark_data-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if lib.exists():
        return lib
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise WorkloadError("postmark write_data needs a C compiler (cc) to build its LD_PRELOAD shim")
    root.mkdir(parents=True, exist_ok=True)
    partial = lib.with_suffix(f".{os.getpid()}.tmp")
    proc = subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "-o", str(partial), str(SHIM_SOURCE), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        partial.unlink(missing_ok=True)
        raise WorkloadError(f"building the postmark data shim failed: {proc.stderr.strip()[-300:]}")
    partial.replace(lib)
    return lib


def data_argv(argv: list[str], data: Path, shim: Path) -> list[str]:
    """argv with the shim preloaded for the tool alone: through `env`, so a wrapper in front of it (the
    memory cgroup's shell, which writes its PID into a cgroup file) runs without it."""
    return ["env", f"LD_PRELOAD={shim}", f"{DATA_ENV}={data}", *argv]


def replaced_bytes(stderr: str) -> int | None:
    """What the shim says it replaced (its last line on stderr), None when it did not run."""
    found = _REPLACED.findall(stderr)
    return int(found[-1]) if found else None


_UNITS = {"bytes": 1, "kilobytes": 1 << 10, "megabytes": 1 << 20, "gigabytes": 1 << 30}


@dataclass
class PostmarkConfig:
    number: int = 500  # base number of files
    size_low: int = 500
    size_high: int = 10000
    transactions: int = 500
    read_block: int = 512
    write_block: int = 512
    subdirectories: int = 0
    buffering: bool = True
    bias_read: int = 5
    bias_create: int = 5
    seed: int = 42
    data: Path | None = None  # a file whose bytes PostMark's writes carry (through the shim)

    def render(self, location: str) -> str:
        """The command file PostMark reads (`postmark <file>`)."""
        return "\n".join(
            [
                f"set location {location}",
                f"set number {self.number}",
                f"set size {self.size_low} {self.size_high}",
                f"set transactions {self.transactions}",
                f"set read {self.read_block}",
                f"set write {self.write_block}",
                f"set subdirectories {self.subdirectories}",
                f"set buffering {'true' if self.buffering else 'false'}",
                f"set bias read {self.bias_read}",
                f"set bias create {self.bias_create}",
                f"set seed {self.seed}",
                "set report verbose",
                "show",
                "run",
                "quit",
                "",
            ]
        )


@dataclass
class PostmarkReport:
    total_s: int
    transaction_s: int
    transactions_per_s: float
    files_created: int
    files_read: int
    files_appended: int
    files_deleted: int
    bytes_read: int  # PostMark prints these rounded to 2 decimals of its unit
    bytes_written: int
    read_bytes_per_s: float
    write_bytes_per_s: float


def _amount(value: str, unit: str) -> int:
    return round(float(value) * _UNITS[unit])


def parse_report(text: str) -> PostmarkReport:
    """Parse PostMark's verbose report; a missing line raises WorkloadError naming it."""

    def find(pattern: str, what: str) -> re.Match[str]:
        match = re.search(pattern, text)
        if match is None:
            raise WorkloadError(f"postmark report lacks {what} (pattern {pattern!r})")
        return match

    total = find(r"(\d+) seconds total", "the total time")
    trans = find(r"(\d+) seconds of transactions \((\d+(?:\.\d+)?) per second\)", "the transaction rate")
    created = find(r"(\d+) created \(", "files created")
    read = find(r"(\d+) read \(\d", "files read")
    appended = find(r"(\d+) appended \(", "files appended")
    deleted = find(r"(\d+) deleted \(", "files deleted")
    unit = r"(bytes|kilobytes|megabytes|gigabytes)"
    data_read = find(rf"([\d.]+) {unit} read \(([\d.]+) {unit} per second\)", "data read")
    data_written = find(rf"([\d.]+) {unit} written \(([\d.]+) {unit} per second\)", "data written")
    return PostmarkReport(
        total_s=int(total.group(1)),
        transaction_s=int(trans.group(1)),
        transactions_per_s=float(trans.group(2)),
        files_created=int(created.group(1)),
        files_read=int(read.group(1)),
        files_appended=int(appended.group(1)),
        files_deleted=int(deleted.group(1)),
        bytes_read=_amount(data_read.group(1), data_read.group(2)),
        bytes_written=_amount(data_written.group(1), data_written.group(2)),
        read_bytes_per_s=float(_amount(data_read.group(3), data_read.group(4))),
        write_bytes_per_s=float(_amount(data_written.group(3), data_written.group(4))),
    )


@dataclass
class PostmarkWorkload:
    name: str
    config: PostmarkConfig
    keep_files: bool = False
    data_kinds: tuple[str, ...] = ("tool", "synthetic", "corpus")  # it ignores the declared data

    def cells(self) -> list[Cell]:
        c = self.config
        return [
            Cell(
                file_size_bytes=c.size_high,
                threads=1,
                params={"number": c.number, "transactions": c.transactions},
            )
        ]

    def execute(self, cell: Cell, ctx: RunContext) -> list[Measurement]:
        if shutil.which(POSTMARK) is None:
            raise WorkloadError("postmark is not installed (scripts/install-deps.sh installs it)")
        workdir = ctx.mountpoint / self.name
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = ctx.raw_dir / f"{cell.key}-postmark.cfg"
        output_path = ctx.raw_dir / f"{cell.key}-postmark.out"
        config_path.write_text(self.config.render(str(workdir)))
        argv = [POSTMARK, str(config_path)]
        data = self.config.data
        if data is not None:
            if not data.is_file() or data.stat().st_size == 0:
                raise WorkloadError(f"postmark data file {data} is missing or empty")
            argv = data_argv(argv, data, shim_path())
        proc, wall_s = run_measured(argv, ctx, "postmark", cwd=workdir)
        output_path.write_text(proc.stdout + proc.stderr)
        (ctx.raw_dir / f"{cell.key}-postmark.cmd").write_text(" ".join(argv) + "\n")
        if proc.returncode != 0:
            raise WorkloadError(f"postmark failed (exit {proc.returncode}); output in {output_path}")
        report = parse_report(proc.stdout)
        replaced = replaced_bytes(proc.stderr) if data is not None else None
        if data is not None and not replaced:
            raise WorkloadError(f"the postmark data shim replaced no bytes (output in {output_path})")
        if not self.keep_files:
            shutil.rmtree(workdir, ignore_errors=True)
        moved = report.bytes_read + report.bytes_written
        return [
            Measurement(
                operation="postmark",
                throughput_bytes_per_s=moved / wall_s if wall_s > 0 else None,
                iops=report.transactions_per_s,
                elapsed_s=wall_s,
                logical_bytes_written=report.bytes_written,
                logical_bytes_read=report.bytes_read,
                commands=[argv],
                raw_files=[config_path, output_path],
                data_label=DATA_LABEL if data is None else f"postmark writing {data.name} (data shim)",
                extra={
                    "postmark": report.__dict__,
                    **(
                        {"postmark_data": str(data), "postmark_data_bytes_replaced": replaced} if data else {}
                    ),
                    "note": "iops is PostMark's transactions per second (it counts whole seconds)",
                    **(
                        {"warning": "postmark ran its transactions in under 2 s; its rates are coarse"}
                        if report.transaction_s < 2
                        else {}
                    ),
                },
            )
        ]


def _data_path(value: str | None) -> Path | None:
    if value is None:
        return None
    if not Path(value).is_absolute():
        raise WorkloadConfigError("write_data", f"must be an absolute path to a file, got {value!r}")
    return Path(value)


def from_config(name: str, table: dict[str, Any]) -> PostmarkWorkload:
    t = Table(table)
    d = PostmarkConfig()
    low = t.size("size_low", d.size_low)
    high = t.size("size_high", d.size_high)
    if high < low:
        raise WorkloadConfigError("size_high", f"must be >= size_low ({low}), got {high}")
    config = PostmarkConfig(
        number=t.integer("number", d.number, high=10_000_000),
        size_low=low,
        size_high=high,
        transactions=t.integer("transactions", d.transactions, high=1_000_000_000),
        read_block=t.size("read_block", d.read_block),
        write_block=t.size("write_block", d.write_block),
        subdirectories=t.integer("subdirectories", d.subdirectories, low=0, high=100_000),
        buffering=t.boolean("buffering", d.buffering),
        bias_read=t.integer("bias_read", d.bias_read, low=-1, high=10),
        bias_create=t.integer("bias_create", d.bias_create, low=-1, high=10),
        seed=t.integer("seed", d.seed, low=0, high=2**31 - 1),
        data=_data_path(t.string("write_data", None)),
    )
    keep_files = t.boolean("keep_files", False)
    t.done()
    return PostmarkWorkload(name=name, config=config, keep_files=keep_files)
