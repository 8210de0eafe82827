"""ZFS pools: kernel ZFS where present, else Debian's zfs-fuse (user space, pool version 23).

zbdlab starts the zfs-fuse daemon only when none is running, and then stops (and, for a cold cache,
restarts) only that daemon. Speed figures through FUSE are labelled FUSE-bound.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from zbdlab.app import HostError, require_tool
from zbdlab.config import TargetSpec
from zbdlab.targets.cleanup import CleanupStack
from zbdlab.targets.commands import CommandError, Commands, stop_process, wait_for

ZFS_FUSE_SOCKET = Path("/var/run/zfs/zfs_socket")


def kernel_zfs_present() -> bool:
    return Path("/sys/module/zfs").exists() and Path("/dev/zfs").exists()


def _socket_alive(path: Path) -> bool:
    if not path.is_socket():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


class ZfsService:
    """The ZFS control plane for the whole study (one zfs-fuse daemon serves every pool)."""

    def __init__(self, cmds: Commands, stack: CleanupStack, workdir: Path) -> None:
        self.cmds, self.stack, self.workdir = cmds, stack, workdir
        self.kernel = kernel_zfs_present()
        self.proc: subprocess.Popen[bytes] | None = None
        self.pools: dict[str, Path] = {}  # pool -> directory of links to its devices (for import -d)
        self.started = False

    @property
    def fuse(self) -> bool:
        return not self.kernel

    def ensure(self) -> None:
        if self.kernel or self.started:
            return
        require_tool("zpool", "ZFS targets")
        if _socket_alive(ZFS_FUSE_SOCKET):
            self.started = True  # someone else's daemon: use it, never stop it
            return
        require_tool("zfs-fuse", "ZFS targets without kernel ZFS")
        self.stack.push("stop zfs-fuse", self._stop)
        self.started = True
        self._start()

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        proc = self.cmds.spawn(["zfs-fuse", "--no-daemon"], self.workdir / "zfs-fuse.log", self._adopt)
        wait_for(lambda: proc.poll() is not None or _socket_alive(ZFS_FUSE_SOCKET), 30, "the zfs-fuse socket")
        if proc.poll() is not None:
            log = (self.workdir / "zfs-fuse.log").read_text(errors="replace")[-300:]
            raise HostError(f"zfs-fuse exited at start (exit {proc.returncode}): {log.strip()}")

    def _adopt(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def _stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def _export(self, pool: str, attempts: int = 20) -> None:
        """zpool export; zfs-fuse answers "pool is busy" for a moment after the unmount (it lets go of
        the file system asynchronously), which failed whole reproductions: try again for up to ~10 s."""
        for attempt in range(attempts):
            proc = self.cmds.run(["zpool", "export", pool], check=attempt == attempts - 1)
            if proc.returncode == 0:
                return
            if "busy" not in proc.stderr + proc.stdout:
                raise CommandError(["zpool", "export", pool], proc.returncode, proc.stderr + proc.stdout)
            time.sleep(0.5)

    def restart(self) -> bool:
        """Export our pools, restart the daemon we started, import them again (drops the ARC).
        Returns False (and only exports/imports) when the daemon is not ours or ZFS is in the kernel."""
        pools = list(self.pools)
        for pool in pools:
            self._export(pool)
        restarted = False
        if self.proc is not None:
            self._stop()
            self._start()
            restarted = True
        for pool in pools:
            self.cmds.run(["zpool", "import", "-o", "cachefile=none", "-d", str(self.pools[pool]), pool])
        return restarted


def create_pool(
    svc: ZfsService,
    stack: CleanupStack,
    spec: TargetSpec,
    pool: str,
    devices: list[str],
    mnt: Path,
    devdir: Path,
) -> None:
    svc.ensure()
    if spec.compression == "lz4" and svc.fuse:
        raise HostError(
            f"target {spec.name}: compression=lz4 needs kernel ZFS; zfs-fuse (pool v23) has lzjb, gzip, zle"
        )
    devdir.mkdir(parents=True, exist_ok=True)
    for i, dev in enumerate(devices):
        (devdir / f"d{i}").symlink_to(dev)
    props = ["-O", f"compression={spec.compression}", "-O", f"dedup={spec.dedup}"]
    if spec.recordsize_bytes:
        props += ["-O", f"recordsize={spec.recordsize_bytes}"]
    if spec.layout == "raid10":  # a stripe of two-way mirrors, ZFS's RAID 10 (seed 004)
        vdevs = [w for pair in zip(devices[::2], devices[1::2], strict=True) for w in ("mirror", *pair)]
    elif spec.layout == "single":
        vdevs = list(devices)
    else:
        vdevs = [spec.layout, *devices]
    stack.push(f"zpool destroy {pool}", lambda: destroy_pool(svc, pool))
    svc.pools[pool] = devdir
    # cachefile=none: a daemon (re)start never auto-imports our pools, not even after a crash
    argv = ["zpool", "create", "-f", "-o", "cachefile=none", "-m", str(mnt), *props, pool, *vdevs]
    svc.cmds.run(argv)


def destroy_pool(svc: ZfsService, pool: str) -> None:
    cmds = svc.cmds

    def attempt() -> bool:
        if cmds.run(["zpool", "list", "-H", "-o", "name", pool], check=False).returncode != 0:
            return True  # already gone
        return cmds.run(["zpool", "destroy", "-f", pool], check=False).returncode == 0

    try:
        wait_for(attempt, 30, f"zpool destroy {pool}", interval_s=0.5)
    finally:
        svc.pools.pop(pool, None)


def pool_space(cmds: Commands, pool: str) -> tuple[dict[str, str], str]:
    """`zfs get used,compressratio` and `zpool list allocated,dedupratio` as a dict, plus raw text."""
    fs = cmds.run(["zfs", "get", "-H", "-p", "used,referenced,compressratio", pool]).stdout
    zp = cmds.run(["zpool", "list", "-H", "-o", "allocated,dedupratio,size", pool]).stdout
    values: dict[str, str] = {}
    for line in fs.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3:
            values[parts[1]] = parts[2]
    cols = zp.split()
    if len(cols) >= 3:
        values["allocated"], values["dedupratio"], values["size"] = cols[:3]
    return values, fs + zp


def ratio(text: str | None) -> float | None:
    """'2.07x' -> 2.07."""
    if not text:
        return None
    try:
        return float(text.rstrip("x"))
    except ValueError:
        return None


def zfs_size(text: str | None) -> int | None:
    """zpool list prints sizes like 616K or 1.2G (no -p in v23)."""
    from zbdlab.config import parse_size

    if text is None:
        return None
    size = parse_size(text)
    if size is None:
        raise CommandError(["zpool", "list"], 0, f"unexpected size {text!r}")
    return size
