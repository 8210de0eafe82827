"""Running a tool as one measured operation: the runner's hooks wrap exactly the tool's run."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from zbdlab.workloads.base import RunContext


def run_measured(
    argv: list[str], ctx: RunContext, operation: str | None, cwd: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run argv (stdin closed, output captured) and return it with its wall-clock seconds. With an
    `operation`, ctx.before_operation/after_operation bracket the run; None is unmeasured work."""
    if operation is not None:
        ctx.before_operation(operation)
    started = time.monotonic()
    try:
        proc = subprocess.run(
            argv, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
        )
    finally:
        wall_s = time.monotonic() - started
        if operation is not None:
            ctx.after_operation(operation)
    return proc, wall_s
