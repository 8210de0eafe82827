"""A zbd volume: `zbd create` on a loop device of its own, `zbd serve`, `zbd attach` -> /dev/loopN.

The backing store sits on its own loop device so /sys/block/loopX/stat counts zbd's real I/O the same
way as every other target's. The server runs in the foreground in its own session; it is stopped with
SIGTERM to the PID zbdlab started, after the filesystem on it is unmounted and the device detached.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from zbdlab.app import HostError, zbd_binary
from zbdlab.config import ZbdSpec
from zbdlab.targets.cleanup import CleanupStack, Step
from zbdlab.targets.commands import Commands, stop_process, wait_for


def zbd_problem() -> str | None:
    """Why zbd targets cannot run here, or None when the binary has the commands the lab uses."""
    binary = zbd_binary()
    if binary is None:
        return "zbd binary not found (set ZBD_BIN, build target/release/zbd, or put zbd on PATH)"
    try:
        text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary} --help failed: {exc}"
    missing = [c for c in ("create", "serve", "attach", "detach", "stat") if c not in text]
    if missing:
        return f"{binary} lacks the subcommand(s) {', '.join(missing)}"
    return None


def _has_flag(binary: str, command: str, flag: str = "--state-dir") -> bool:
    try:
        text = subprocess.run([binary, command, "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return flag in text


def _size_arg(size: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


class ZbdVolume:
    has_stats = True  # `zbd stat` answers for the volume

    def __init__(
        self,
        spec: ZbdSpec,
        backing: str,
        size_bytes: int,
        workdir: Path,
        cmds: Commands,
        server_cache: str = "host",
    ) -> None:
        problem = zbd_problem()
        if problem:
            raise HostError(problem)
        self.binary = zbd_binary() or "zbd"
        self.spec, self.backing, self.workdir, self.cmds = spec, backing, workdir, cmds
        self.server_cache = server_cache  # "none": the server keeps its device out of the page cache
        self.size_bytes = spec.logical_size_bytes or size_bytes
        self.pidfile = workdir / "zbd.pid"
        # Unix socket paths must stay under 108 bytes: keep ours in a short directory of its own.
        self.sockdir = Path(
            tempfile.mkdtemp(prefix="zbdlab-", dir="/run" if os.access("/run", os.W_OK) else None)
        )
        self.socket = self.sockdir / "nbd.sock"
        # attach/detach records and nbdfuse mounts in our own directory, when zbd lets us say so
        self.state_args = ["--state-dir", str(workdir / "attach")] if _has_flag(self.binary, "attach") else []
        self.proc: subprocess.Popen[bytes] | None = None
        self.device: str | None = None
        self._steps: list[Step] = []

    def create(self) -> None:
        self.cmds.run(
            [
                self.binary,
                "create",
                self.backing,
                "--size",
                _size_arg(self.size_bytes),
                "--codec",
                self.spec.codec,
                "--extent-size",
                _size_arg(self.spec.extent_size_bytes),
                "--force",
            ]
        )

    def start(self, stack: CleanupStack) -> str:
        """Serve and attach; returns the block device the filesystem goes on."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        for stale in (self.socket, self.pidfile):
            stale.unlink(missing_ok=True)
        argv = self.server_argv()
        # undo steps go on the stack before their action (see devices.create_loop)
        self._steps.append(stack.push("stop zbd serve", self._stop_server))
        proc = self.cmds.spawn(argv, self.workdir / "zbd-serve.log", self._adopt)

        def ready() -> bool:
            return proc.poll() is not None or (self.socket.exists() and self._pidfile_ok())

        wait_for(ready, 30, f"zbd serve socket {self.socket}")
        if proc.poll() is not None:
            log = (self.workdir / "zbd-serve.log").read_text(errors="replace").strip()[-300:]
            raise HostError(f"{argv[0]} {argv[1]} exited at start (exit {proc.returncode}): {log}")
        self._steps.append(stack.push("zbd detach", self._detach))
        out = self.cmds.run([self.binary, "attach", "--socket", str(self.socket), *self.state_args]).stdout
        devices = [w for w in out.split() if w.startswith("/dev/")]
        if not devices:
            raise HostError(f"zbd attach printed no device: {out.strip()!r}")
        self.device = devices[-1]
        return self.device

    def server_argv(self) -> list[str]:
        sock, pid = str(self.socket), str(self.pidfile)
        direct = ["--direct"] if self.server_cache == "none" else []
        return [self.binary, "serve", self.backing, "--socket", sock, "--pidfile", pid, *direct]

    def _pidfile_ok(self) -> bool:
        try:
            return self.pidfile.read_text().strip().isdigit()
        except OSError:
            return False

    def remove_sockdir(self) -> None:
        shutil.rmtree(self.sockdir, ignore_errors=True)

    def _adopt(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def _detach(self) -> None:
        if self.device is None:
            # interrupted between attach and reading its output: find a loop device over a file in
            # our volume's directory (where nbdfuse's mount would be), else nothing was attached
            listed = self.cmds.run(["losetup", "-a"], check=False).stdout
            found = [ln.split(":", 1)[0] for ln in listed.splitlines() if str(self.workdir) in ln]
            self.device = found[0] if found else None
        if self.device is not None:
            self.cmds.run([self.binary, "detach", self.device, *self.state_args])
            self.device = None

    def _stop_server(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def stop(self, stack: CleanupStack) -> None:
        """Detach and stop the server now (cold-cache restart), newest first."""
        while self._steps:
            stack.release(self._steps.pop())

    def stat(self) -> tuple[dict[str, Any], str]:
        text = self.cmds.run([self.binary, "stat", self.backing, "--json"]).stdout
        try:
            return json.loads(text), text
        except json.JSONDecodeError:
            return {}, text


def stat_numbers(stat: dict[str, Any]) -> tuple[int | None, int | None, float | None]:
    """(logical bytes, physical bytes, ratio) from `zbd stat --json`, tolerant of nesting and naming."""
    flat: dict[str, Any] = {}

    def walk(obj: Any, prefix: str = "") -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{prefix}{k}.")
        else:
            flat[prefix.rstrip(".")] = obj

    walk(stat)

    def pick(*names: str) -> Any:
        """The first of `names` (in that order of preference) present as a number."""
        for name in names:
            for key, value in flat.items():
                if (
                    key.rsplit(".", 1)[-1] == name
                    and isinstance(value, int | float)
                    and not isinstance(value, bool)
                ):
                    return value
        return None

    # zbd-core Stats: logical_bytes is the volume size; what is in use is logical_bytes_in_use, and
    # the space taken on the backing store is physical_bytes_allocated (extents in use).
    logical = pick("logical_bytes_in_use", "logical_bytes_used")
    physical = pick("physical_bytes_allocated", "physical_bytes_used", "physical_bytes_live")
    # The ratio of the data stored, like compsize's or ZFS's: zbd's own compression_ratio counts
    # all-zero blocks as logical data, and mkfs zeroes inode tables and journals, which inflates it.
    data_blocks, live = pick("data_blocks"), pick("physical_bytes_live")
    ratio = data_blocks * 4096 / live if data_blocks and live else pick("compression_ratio")
    if ratio is None and logical and physical:
        ratio = logical / physical
    return (
        int(logical) if logical is not None else None,
        int(physical) if physical is not None else None,
        ratio,
    )


class NbdkitExport(ZbdVolume):
    """The transport baseline: `nbdkit file` serving the backing device, attached with `zbd attach`
    exactly like a zbd volume (nbdfuse + loop here), so the two differ only in the server."""

    has_stats = False

    def __init__(
        self, backing: str, size_bytes: int, workdir: Path, cmds: Commands, server_cache: str = "host"
    ) -> None:
        super().__init__(ZbdSpec(codec="none"), backing, size_bytes, workdir, cmds, server_cache)

    def create(self) -> None:
        if shutil.which("nbdkit") is None:
            raise HostError(
                "nbdkit not found (needed for the transport baseline; run scripts/install-deps.sh)"
            )

    def server_argv(self) -> list[str]:
        sock, pid = str(self.socket), str(self.pidfile)
        # cache=none: nbdkit evicts what it read or wrote from the page cache (fadvise DONTNEED, and
        # for writes sync_file_range first), its nearest to zbd serve --direct
        cache = ["cache=none"] if self.server_cache == "none" else []
        return ["nbdkit", "-f", "-U", sock, "-P", pid, "file", f"file={self.backing}", *cache]

    def stat(self) -> tuple[dict[str, Any], str]:
        return {}, ""
