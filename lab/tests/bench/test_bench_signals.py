"""`zbdlab bench` stopped by SIGTERM undoes what it made (its groups clean up in `finally`s, which
the default SIGTERM action never runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zbdlab.app import zbd_binary
from zbdlab.throttle import throttle_problem


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (loop devices, mounts)")
@pytest.mark.skipif(throttle_problem() is not None, reason=str(throttle_problem()))
@pytest.mark.skipif(zbd_binary() is None, reason="no zbd binary (cargo build --release or ZBD_BIN)")
def test_sigterm_mid_bench_leaves_no_loop_mount_or_server(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    argv = [sys.executable, "-c", "from zbdlab.cli import main; main()", "bench", "--quick"]
    argv += ["--only", "nbd-slow", "--work-dir", str(work), "-o", str(tmp_path / "out")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def mounted() -> list[str]:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            return [line.split()[1] for line in f]

    def servers() -> list[str]:
        ps = subprocess.run(["pgrep", "-af", "nbdkit|nbdfuse|zbd serve"], capture_output=True, text=True)
        return ps.stdout.splitlines()

    thr = "/nonexistent-throttle-dir"

    def leftovers() -> tuple[list[str], list[str], list[str]]:
        listed = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
        loops = [line for line in listed.splitlines() if thr in line or str(work) in line]
        mounts = [m for m in mounted() if m.startswith((str(work), thr))]
        return loops, mounts, [line for line in servers() if str(work) in line or thr in line]

    try:
        deadline = time.monotonic() + 180
        # ext4 on the slow disk is mounted under the work directory: loop, nbdfuse, nbdkit all up
        while not any(m.startswith(str(work)) for m in mounted()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the bench mounted nothing in 180 s"
            time.sleep(0.05)
        # the throttled device's own directory (nbdkit's socket, the nbdfuse mount), from nbdkit's argv
        nbdkit = next(line for line in servers() if str(work) in line and "nbdkit" in line)
        thr = next(w for w in nbdkit.split() if w.endswith("nbd.sock")).rsplit("/", 1)[0]
        os.kill(proc.pid, signal.SIGTERM)
        _out, err = proc.communicate(timeout=180)
        left = leftovers()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # undo by hand whatever is left (servers first: a qemu-nbd on the slow disk keeps it busy), so
        # one failure does not poison the machine
        loops, mounts, procs = leftovers()
        for line in procs:
            os.kill(int(line.split()[0]), signal.SIGTERM)
        for m in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], check=False)
        for line in loops:
            subprocess.run(["losetup", "-d", line.split(":", 1)[0]], check=False)
    assert proc.returncode == 130, err[-2000:]
    assert left == ([], [], []), f"left behind (loops, mounts, servers): {left}"
