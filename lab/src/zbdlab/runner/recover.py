"""Clean up after a run that was killed outright (SIGKILL, power cut): its cleanup stack never ran.

`--resume` calls this for every scratch directory the interrupted run recorded in plan.json. Only
things that provably belong to that directory are touched: mounts under it, loop devices whose
backing file lies under it, ZFS pools named after it, zbd and nbdkit servers whose command
line names a pidfile under it. Never `losetup -D`, never anyone else's daemon.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

from zbdlab.targets.commands import Commands, wait_for
from zbdlab.targets.devices import umount
from zbdlab.targets.zfs import ZFS_FUSE_SOCKET, kernel_zfs_present


def _mounts_under(root: Path) -> list[tuple[str, str]]:
    """(mountpoint, fstype) under root, deepest first."""
    prefix = str(root)
    out = []
    with open("/proc/self/mounts", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and (parts[1] == prefix or parts[1].startswith(prefix + "/")):
                out.append((parts[1], parts[2]))
    return sorted(out, key=lambda m: len(m[0]), reverse=True)


def _loops_under(root: Path) -> list[tuple[str, str]]:
    """(/dev/loopN, backing file) for loop devices whose backing file lies under root."""
    out = []
    for entry in Path("/sys/block").glob("loop*"):
        try:
            backing = (entry / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        if backing.startswith(str(root) + "/"):
            out.append((f"/dev/{entry.name}", backing.removesuffix(" (deleted)")))
    return out


def _stop_servers(root: Path, cmds: Commands) -> None:
    """zbd servers, and the nbdkit servers of throttled devices (zbdlab.throttle)."""
    for pidfile in [*root.glob("*/zbd/zbd.pid"), *root.glob("*/thr-*/nbdkit.pid")]:
        try:
            pid = int(pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        if str(pidfile) not in cmdline:
            continue  # the PID was reused by something that is not our server
        cmds.record(["kill", "-TERM", str(pid)], 0, f"recover: {pidfile.name} of an interrupted run")
        os.kill(pid, signal.SIGTERM)
        try:
            wait_for(lambda p=pid: not Path(f"/proc/{p}").exists(), 20, f"pid {pid} to exit")
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)


def _destroy_pools(root: Path, cmds: Commands) -> None:
    if not kernel_zfs_present() and not ZFS_FUSE_SOCKET.is_socket():
        return
    prefix = f"zbdlab_{root.name[-8:]}_".replace("-", "_")
    listed = cmds.run(["zpool", "list", "-H", "-o", "name"], check=False).stdout.split()
    for pool in listed:
        if pool.startswith(prefix):
            cmds.run(["zpool", "destroy", "-f", pool], check=False)


def recover(root: Path, cmds: Commands) -> bool:
    """Undo what an interrupted run left under scratch directory `root`; True if anything was there."""
    if not root.is_dir():
        return False
    cmds.context = f"recover {root}"
    for mnt, fstype in _mounts_under(root):
        if not fstype.startswith("fuse"):
            umount(cmds, Path(mnt))
    _destroy_pools(root, cmds)
    for device, backing in _loops_under(root):
        if not backing.endswith(".img"):  # a zbd volume's nbdfuse-backed device
            cmds.run(["losetup", "-d", device], check=False)
    for mnt, _fstype in _mounts_under(root):
        umount(cmds, Path(mnt))
    _stop_servers(root, cmds)
    for device, _backing in _loops_under(root):
        cmds.run(["btrfs", "device", "scan", "--forget", device], check=False)
        cmds.run(["losetup", "-d", device], check=False)
    shutil.rmtree(root, ignore_errors=True)
    return True
