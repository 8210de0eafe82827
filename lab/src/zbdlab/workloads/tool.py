"""Running a tool as one measured operation: the runner's hooks wrap exactly the tool's run."""

from __future__ import annotations

import subprocess
import time
from contextlib import nullcontext
from pathlib import Path

from zbdlab.memlimit import MemoryCgroup
from zbdlab.workloads.base import RunContext


def run_measured(
    argv: list[str], ctx: RunContext, operation: str | None, cwd: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run argv (stdin closed, output captured) and return it with its wall-clock seconds. With an
    `operation`, ctx.before_operation/after_operation bracket the run; None is unmeasured work. With
    ctx.memory_limit_bytes the tool runs in a memory-limited cgroup made (and removed) around it."""
    limit = ctx.memory_limit_bytes
    with MemoryCgroup(limit) if limit else nullcontext() as group:
        if operation is not None:
            ctx.before_operation(operation)
        started = time.monotonic()
        try:
            proc = subprocess.run(
                group.wrap(argv) if group else argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            wall_s = time.monotonic() - started
            if operation is not None:
                ctx.after_operation(operation)
            if group:
                ctx.memory_usage.append(group.usage())
    if group and ctx.memory_usage[-1].get("memory_oom_kills"):
        # the workload's error message quotes stderr: say why the tool died
        proc.stderr += (
            f"\nkilled by the OOM killer: memory_limit ({limit >> 20} MiB) is too small for {argv[0]}"
        )
    return proc, wall_s
