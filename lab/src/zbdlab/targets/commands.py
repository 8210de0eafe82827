"""Run external tools, recording the exact argv of every one (commands.jsonl in the results)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from zbdlab import signals
from zbdlab.app import HostError


class CommandError(RuntimeError):
    def __init__(self, argv: list[str], returncode: int, output: str) -> None:
        tail = [line for line in output.strip().splitlines() if line.strip()][-1:] or ["no output"]
        super().__init__(
            f"{' '.join(argv[:3])}{' ...' if len(argv) > 3 else ''} failed (exit {returncode}): {tail[0]}"
        )
        self.argv, self.returncode, self.output = argv, returncode, output


class Commands:
    """Runs tools and appends {time, argv, rc} to a log; `context` labels what they were for."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.log_path = log_path
        self.context = ""
        self.history: list[list[str]] = []
        self._log: IO[str] | None = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115

    def close(self) -> None:
        if self._log:
            self._log.close()
            self._log = None

    def record(self, argv: list[str], returncode: int | None, note: str = "") -> None:
        self.history.append(list(argv))
        if self._log:
            entry = {"time": time.time(), "context": self.context, "argv": argv, "rc": returncode}
            if note:
                entry["note"] = note
            self._log.write(json.dumps(entry) + "\n")
            self._log.flush()

    def run(
        self, argv: list[str], *, check: bool = True, timeout: float = 600, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a tool to its end. Interrupted (SIGINT/SIGTERM raised as an exception), it is killed
        and waited for before the exception goes on: cleanup must see what a `mount` or `losetup`
        did, not find it done a moment after it looked."""
        proc: subprocess.Popen[str] | None = None
        try:
            with signals.held():
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE if input_text is not None else None,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            stdout, stderr = proc.communicate(input_text, timeout=timeout)
        except FileNotFoundError:
            self.record(argv, None, "not found")
            raise HostError(f"{argv[0]} not found (run scripts/install-deps.sh)") from None
        except subprocess.TimeoutExpired:
            _reap(proc)
            self.record(argv, None, f"timed out after {timeout}s")
            raise CommandError(argv, -1, f"timed out after {timeout}s") from None
        except BaseException:
            _reap(proc)
            raise
        self.record(argv, proc.returncode)
        if check and proc.returncode != 0:
            raise CommandError(argv, proc.returncode, stderr + stdout)
        return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)

    def spawn(
        self, argv: list[str], log_file: Path, adopt: Callable[[subprocess.Popen[bytes]], None]
    ) -> subprocess.Popen[bytes]:
        """Start a daemon in its own session, so a terminal's Ctrl-C reaches zbdlab first and zbdlab
        stops it only after unmounting what depends on it."""
        with open(log_file, "ab") as out, signals.held():  # adopted before a signal can strand it
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except FileNotFoundError:
                self.record(argv, None, "not found")
                raise HostError(f"{argv[0]} not found") from None
            adopt(proc)  # handed over at once, so the undo step pushed before this can stop it
        self.record(argv, None, f"spawned pid {proc.pid}")
        return proc


def _reap(proc: subprocess.Popen[str] | None) -> None:
    if proc is None:
        return
    proc.kill()
    with signals.held():  # reaped before a signal goes on: a killed mount may still be mounting
        proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe:
            pipe.close()


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Bounded polling: returns when `condition()` holds, raises after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 20) -> int:
    """SIGTERM the process we started (by its PID), wait, SIGKILL if it will not go."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
    return proc.returncode
