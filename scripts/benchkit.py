"""What the bench scripts share: running commands, waiting, stopping what they started, and
undoing their setup newest first (loops, mounts, servers), even when interrupted."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

WAIT_S = 60  # for a daemon's socket, a server's start, a pool to let go


def say(line: str) -> None:
    print(line, flush=True)


def run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    return proc


def missing_tools(tools: list[str]) -> list[str]:
    """The tools not found on PATH."""
    return [t for t in tools if shutil.which(t) is None]


def work_dir(undo: Undo, prefix: str) -> Path:
    """A scratch directory of our own under DEDUP_DIR (/var/tmp), removed by `undo`; from now on
    SIGTERM (zbdlab bench interrupted) unwinds like Ctrl-C, so every undo step runs."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("DEDUP_DIR", "/var/tmp")))
    undo.push(f"remove {work}", lambda: run(["rm", "-rf", "--one-file-system", str(work)]))
    return work


def wait_for(ready: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to a process this script started, then SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Undo:
    """Undo steps, newest first. Each step is pushed before its action and checks what exists, so an
    interrupt at any instant leaves nothing behind."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, Callable[[], None]]] = []

    def push(self, name: str, step: Callable[[], None]) -> tuple[str, Callable[[], None]]:
        self.steps.append((name, step))
        return self.steps[-1]

    def release(self, entry: tuple[str, Callable[[], None]]) -> None:
        """Runs one step now (it must succeed) and forgets it."""
        self.steps.remove(entry)
        entry[1]()

    def run_all(self) -> None:
        while self.steps:
            name, step = self.steps.pop()
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - keep undoing the rest
                print(f"cleanup: {name}: {exc}", file=sys.stderr, flush=True)
