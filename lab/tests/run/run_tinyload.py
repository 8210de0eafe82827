"""A tiny real workload for the runner's tests: fio writes a small file, then reads it back.

Loaded by study files through `kind = "custom"`, `factory = "run_tinyload:make"`. Keys:
  size = "8M", bs = "64K"       the file and record size
  cells = 1                      how many cells (distinct file sizes: size, 2*size, ...)
  fail_on_execution = N          the Nth execute() runs fio with a bad option (exits non-zero)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from zbdlab.config import parse_size
from zbdlab.workloads.base import Cell, Measurement, RunContext, WorkloadError


class TinyFio:
    def __init__(self, name: str, table: dict[str, Any]) -> None:
        self.name = name
        self.size = parse_size(table.get("size", "8M")) or (8 << 20)
        self.bs = parse_size(table.get("bs", "64K")) or (64 << 10)
        self.n_cells = int(table.get("cells", 1))
        self.fail_on = int(table.get("fail_on_execution", 0))
        self.executions = 0

    def cells(self) -> list[Cell]:
        return [
            Cell(file_size_bytes=self.size * (i + 1), record_size_bytes=self.bs) for i in range(self.n_cells)
        ]

    def execute(self, cell: Cell, ctx: RunContext) -> list[Measurement]:
        self.executions += 1
        out = []
        for i, op in enumerate(("write", "read")):
            if i:
                ctx.between_operations()
            out.append(self._fio(op, cell, ctx, bad=self.executions == self.fail_on and op == "read"))
        return out

    def _fio(self, op: str, cell: Cell, ctx: RunContext, bad: bool) -> Measurement:
        raw = ctx.raw_dir / f"{op}.json"
        argv = [
            "fio",
            f"--name={op}",
            f"--filename={ctx.mountpoint / 'tiny.dat'}",
            f"--rw={op}",
            f"--bs={cell.record_size_bytes}",
            f"--size={cell.file_size_bytes}",
            "--ioengine=psync",
            "--end_fsync=1",
            "--refill_buffers",
            f"--buffer_compress_percentage={ctx.data.compress_percentage}",
            "--buffer_compress_chunk=4k",
            "--fallocate=none",
            "--output-format=json",
            f"--output={raw}",
        ]
        if bad:
            argv.append("--no-such-option-injected-failure")
        ctx.before_operation(op)
        proc = subprocess.run(argv, capture_output=True, text=True)
        ctx.after_operation(op)
        if proc.returncode != 0:
            raise WorkloadError(f"fio {op} exited {proc.returncode}: {proc.stderr.strip()[-200:]}")
        job = json.loads(Path(raw).read_text())["jobs"][0][op]
        pct = job["clat_ns"].get("percentile", {})
        return Measurement(
            operation=op,
            throughput_bytes_per_s=float(job["bw_bytes"]),
            iops=float(job["iops"]),
            latency_p50_us=pct.get("50.000000", 0) / 1000,
            latency_p99_us=pct.get("99.000000", 0) / 1000,
            elapsed_s=job["runtime"] / 1000,
            logical_bytes_written=job["io_bytes"] if op == "write" else 0,
            logical_bytes_read=job["io_bytes"] if op == "read" else 0,
            commands=[argv],
            raw_files=[raw],
        )


def make(name: str, table: dict[str, Any]) -> TinyFio:
    return TinyFio(name, table)
