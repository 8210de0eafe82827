"""Sparse image files and the loop devices over them, plus mkfs/mount/umount of kernel filesystems."""

from __future__ import annotations

from pathlib import Path

from zbdlab.config import TargetSpec
from zbdlab.targets.cleanup import CleanupStack
from zbdlab.targets.commands import CommandError, Commands, wait_for


def create_loop(cmds: Commands, stack: CleanupStack, image: Path, size_bytes: int) -> str:
    """A sparse image of `size_bytes` and a loop device over it; both undone on the stack."""
    # Each undo step is pushed before its action and checks what exists, so an interrupt at any
    # instant (even between the action and its bookkeeping) still leaves nothing behind.
    stack.push(f"remove {image}", lambda: image.unlink(missing_ok=True))
    cmds.run(["truncate", "-s", str(size_bytes), str(image)])
    stack.push(f"detach loop devices over {image}", lambda: detach_loops(cmds, image))
    device = cmds.run(["losetup", "--find", "--show", str(image)]).stdout.strip()
    if not device.startswith("/dev/loop"):
        raise CommandError(["losetup", "--find", "--show", str(image)], 0, f"unexpected output {device!r}")
    return device


def detach_loops(cmds: Commands, image: Path) -> None:
    """Detach the loop devices over our own image file (never anyone else's)."""
    listed = cmds.run(["losetup", "-j", str(image)], check=False).stdout
    for line in listed.splitlines():
        device = line.split(":", 1)[0]
        if device.startswith("/dev/loop"):
            cmds.run(["losetup", "-d", device])


def loop_name(device: str) -> str:
    """/dev/loop3 -> loop3, the /sys/class/block entry (symlinks such as /dev/disk/by-id resolved)."""
    return Path(device).resolve().name


def mkfs_argv(spec: TargetSpec, devices: list[str]) -> list[str]:
    opts = list(spec.mkfs_options)
    if spec.fs == "ext4":
        # Initialise inode tables and journal now, so ext4lazyinit does not write during measurements.
        lazy = [] if "-E" in opts else ["-E", "lazy_itable_init=0,lazy_journal_init=0"]
        return ["mkfs.ext4", "-F", "-q", *lazy, *opts, devices[0]]
    if spec.fs == "xfs":
        return ["mkfs.xfs", "-f", "-q", *opts, devices[0]]
    if spec.fs == "btrfs":
        profiles: list[str] = []
        if spec.raid:
            profiles += ["-d", spec.raid, "-m", spec.metadata_raid or spec.raid]
        elif spec.metadata_raid:
            profiles += ["-m", spec.metadata_raid]
        return ["mkfs.btrfs", "-f", "-q", *profiles, *opts, *devices]
    raise ValueError(f"no mkfs for {spec.fs}")


def mount_options(spec: TargetSpec, devices: list[str]) -> list[str]:
    opts = list(spec.mount_options)
    if spec.fs == "btrfs":
        if spec.compress:
            opts.append(f"{'compress-force' if spec.compress_force else 'compress'}={spec.compress}")
        opts += [f"device={d}" for d in devices[1:]]
    return opts


def mount(runner: Commands, spec: TargetSpec, devices: list[str], mnt: Path) -> list[str]:
    opts = mount_options(spec, devices)
    argv = ["mount", "-t", spec.fs]
    if opts:
        argv += ["-o", ",".join(opts)]
    argv += [devices[0], str(mnt)]
    runner.run(argv)
    return argv


def is_mounted(mnt: Path) -> bool:
    target = str(mnt.resolve())
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        return any(line.split()[1] == target for line in mounts if len(line.split()) > 1)


def umount(cmds: Commands, mnt: Path, timeout_s: float = 20) -> None:
    """Unmount what we mounted, retrying while a just-killed tool still holds files open."""
    if not is_mounted(mnt):
        return
    cmds.run(["sync", "-f", str(mnt)], check=False)

    def attempt() -> bool:
        return cmds.run(["umount", str(mnt)], check=False).returncode == 0 or not is_mounted(mnt)

    try:
        wait_for(attempt, timeout_s, f"umount {mnt}", interval_s=0.25)
    except TimeoutError:
        # Last resort: detach the mount lazily so the loop device can still be released.
        cmds.run(["umount", "-l", str(mnt)])
