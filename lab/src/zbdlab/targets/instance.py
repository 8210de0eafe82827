"""One provisioned target: devices, optional zbd volume, filesystem or pool, mounted.

Everything is pushed on the instance's own cleanup scope as it is created, so teardown (normal, failed
or interrupted) undoes exactly that, newest first.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zbdlab import throttle as thr
from zbdlab.config import TargetSpec
from zbdlab.targets import devices as dev
from zbdlab.targets.cleanup import CleanupStack, Step
from zbdlab.targets.commands import Commands
from zbdlab.targets.zbd import NbdkitExport, ZbdVolume, stat_numbers
from zbdlab.targets.zfs import ZfsService, create_pool, pool_space, ratio, zfs_size


@dataclass
class Space:
    """Space on the target after a run, in bytes; ratio = logical data / physical bytes for it."""

    physical_bytes_used: int | None = None
    data_bytes_stored: int | None = None
    compression_ratio: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, str] = field(default_factory=dict)  # file name -> tool output


class TargetInstance:
    def __init__(
        self,
        spec: TargetSpec,
        ident: str,
        scratch: Path,
        cmds: Commands,
        parent: CleanupStack,
        zfs: ZfsService,
    ) -> None:
        self.spec, self.ident, self.cmds, self.zfs = spec, ident, cmds, zfs
        self.dir = scratch / ident
        self.mountpoint = self.dir / "mnt"
        self.stack = parent.scope(f"target {ident}")
        self.parent = parent
        self.backing: list[str] = []  # devices whose I/O counts as "really read/written"
        self.fs_devices: list[str] = []  # devices the filesystem sits on
        self.zbd: ZbdVolume | None = None
        # pool names are machine-wide: make ours unique to this scratch directory
        self.pool = f"zbdlab_{scratch.name[-8:]}_{ident}".replace("-", "_").replace(".", "_")[:60]
        self._mount_step: Step | None = None
        self.mkfs_argv: list[str] = []
        self.mount_argv: list[str] = []
        self.baseline_used_bytes: int | None = None

    @property
    def fuse_bound(self) -> bool:
        return self.spec.fs == "zfs" and self.zfs.fuse

    @property
    def workdir(self) -> Path:
        """Where workloads create their files (a fresh directory on the target)."""
        return self.mountpoint / "zbdlab"

    # --- life cycle -------------------------------------------------------------------------------

    def provision(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(exist_ok=True)
        spec = self.spec
        if spec.real_devices:
            self.backing = list(spec.real_devices)
        elif spec.throttle:
            size = backing_bytes(spec)
            self.backing = [
                thr.ThrottledDevice(
                    self.dir / f"disk{i}.img", size, throttle=spec.throttle, workdir=self.dir, cmds=self.cmds
                ).start(self.stack)
                for i in range(spec.devices)
            ]
        else:
            size = backing_bytes(spec)
            self.backing = [
                dev.create_loop(self.cmds, self.stack, self.dir / f"disk{i}.img", size)
                for i in range(spec.devices)
            ]
        if spec.zbd or spec.transport:
            if spec.zbd:
                self.zbd = ZbdVolume(
                    spec.zbd, self.backing[0], spec.size_bytes, self.dir / "zbd", self.cmds, spec.server_cache
                )
            else:
                self.zbd = NbdkitExport(
                    self.backing[0], spec.size_bytes, self.dir / "nbd", self.cmds, spec.server_cache
                )
            self.stack.push("remove the zbd socket directory", self.zbd.remove_sockdir)
            self.zbd.create()
            self.fs_devices = [self.zbd.start(self.stack)]
        else:
            self.fs_devices = list(self.backing)
        if spec.fs == "zfs":
            create_pool(
                self.zfs, self.stack, spec, self.pool, self.fs_devices, self.mountpoint, self.dir / "vdevs"
            )
        else:
            self.mkfs_argv = dev.mkfs_argv(spec, self.fs_devices)
            self.cmds.run(self.mkfs_argv)
            if spec.fs == "btrfs":
                devices = list(self.fs_devices)
                self.stack.push("btrfs device scan --forget", lambda: self._btrfs_forget(devices))
            self._mount()
        self.workdir.mkdir(exist_ok=True)
        self.cmds.run(["sync"])
        self.baseline_used_bytes = self._statvfs_used()

    def _btrfs_forget(self, devices: list[str]) -> None:
        for d in devices:
            self.cmds.run(["btrfs", "device", "scan", "--forget", d], check=False)

    def _mount(self) -> None:
        mnt = self.mountpoint
        self._mount_step = self.stack.push(f"umount {mnt}", lambda: dev.umount(self.cmds, mnt))
        self.mount_argv = dev.mount(self.cmds, self.spec, self.fs_devices, self.mountpoint)

    def remount(self) -> dict[str, Any]:
        """Unmount, restart the user-space parts (zbd server + attach, zfs-fuse), mount again."""
        done: dict[str, Any] = {}
        self.cmds.run(["sync"])
        if self.spec.fs == "zfs":
            done["zfs_fuse_restarted"] = self.zfs.restart()
            done["pool_reimported"] = True
            return done
        if self._mount_step:
            self.stack.release(self._mount_step)
            self._mount_step = None
        if self.zbd:
            self.zbd.stop(self.stack)
            self.fs_devices = [self.zbd.start(self.stack)]
            done["zbd_restarted"] = True
        self._mount()
        done["remounted"] = True
        return done

    def teardown(self) -> None:
        self.stack.close_scope(self.parent)

    # --- measurements -----------------------------------------------------------------------------

    def counted_devices(self) -> list[str]:
        return [dev.loop_name(d) for d in self.backing]

    def frontend_devices(self) -> list[str]:
        return [dev.loop_name(d) for d in self.fs_devices if d not in self.backing]

    def _statvfs_used(self) -> int | None:
        try:
            st = os.statvfs(self.mountpoint)
        except OSError:
            return None
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def space(self) -> Space:
        """Physical space used and the compression ratio achieved, from the tool that knows best; and
        what the backing images really hold after fstrim (freed blocks handed back down the stack)."""
        self.cmds.run(["sync"])  # first: btrfs frees extents only when its transaction commits
        if self.spec.fs != "zfs":
            self.cmds.run(["fstrim", str(self.mountpoint)], check=False)
            self.cmds.run(["sync"])
        space = Space(data_bytes_stored=apparent_bytes(self.workdir))
        used = self._statvfs_used()
        df = self.cmds.run(["df", "-B1", str(self.mountpoint)], check=False).stdout
        space.raw["df.txt"] = df
        space.extra["df_used_bytes"] = used
        space.physical_bytes_used = used
        if used is not None and self.baseline_used_bytes is not None:
            space.extra["df_used_since_mkfs_bytes"] = used - self.baseline_used_bytes
        if self.spec.fs == "btrfs":
            self._btrfs_space(space)
        elif self.spec.fs == "zfs":
            self._zfs_space(space)
        if self.zbd and self.zbd.has_stats:
            self._zbd_space(space)
        if not self.spec.real_devices:
            images = [self.dir / f"disk{i}.img" for i in range(self.spec.devices)]
            space.extra["backing_allocated_bytes"] = sum(allocated_bytes(p) for p in images)
        if space.compression_ratio is None and space.data_bytes_stored and used is not None:
            grown = used - (self.baseline_used_bytes or 0)
            if grown > 0:
                space.compression_ratio = space.data_bytes_stored / grown
                space.extra["ratio_source"] = "df"
        return space

    def _btrfs_space(self, space: Space) -> None:
        proc = self.cmds.run(["compsize", "-b", str(self.workdir)], check=False)
        space.raw["compsize.txt"] = proc.stdout + proc.stderr
        for line in proc.stdout.splitlines():
            cols = line.split()
            if cols and cols[0] == "TOTAL" and len(cols) >= 5:
                disk, uncompressed = int(cols[2]), int(cols[3])
                space.extra["compsize_disk_bytes"] = disk
                space.extra["compsize_uncompressed_bytes"] = uncompressed
                if disk > 0:
                    space.compression_ratio = uncompressed / disk
                    space.extra["ratio_source"] = "compsize"
        fi = self.cmds.run(["btrfs", "filesystem", "usage", "-b", str(self.mountpoint)], check=False)
        space.raw["btrfs-usage.txt"] = fi.stdout + fi.stderr

    def _zfs_space(self, space: Space) -> None:
        values, text = pool_space(self.cmds, self.pool)
        space.raw["zfs-space.txt"] = text
        space.physical_bytes_used = zfs_size(values.get("allocated"))
        space.compression_ratio = ratio(values.get("compressratio"))
        space.extra["ratio_source"] = "zfs compressratio"
        space.extra["zfs_used_bytes"] = int(values["used"]) if values.get("used", "").isdigit() else None
        space.extra["dedup_ratio"] = ratio(values.get("dedupratio"))

    def _zbd_space(self, space: Space) -> None:
        assert self.zbd is not None
        stat, text = self.zbd.stat()
        space.raw["zbd-stat.json"] = text
        logical, physical, zratio = stat_numbers(stat)
        space.extra["zbd_logical_bytes_in_use"] = logical
        for key in ("physical_bytes_live", "savings_pct", "write_amplification", "dead_bytes"):
            if isinstance(stat.get(key), int | float):
                space.extra[f"zbd_{key}"] = stat[key]
        space.extra["fs_used_bytes"] = space.physical_bytes_used
        if physical is not None:
            space.physical_bytes_used = physical
        if zratio is not None:
            space.compression_ratio = zratio
            space.extra["ratio_source"] = "zbd stat"

    def describe(self) -> dict[str, Any]:
        return {
            "target": self.spec.name,
            "instance": self.ident,
            "kind": self.spec.kind,
            "backing_devices": self.backing,
            "fs_devices": self.fs_devices,
            "mkfs_argv": self.mkfs_argv,
            "mount_argv": self.mount_argv,
            "zfs_pool": self.pool if self.spec.fs == "zfs" else None,
            "fuse_bound": self.fuse_bound,
            "throttle": self.spec.throttle.as_dict() if self.spec.throttle else None,
        }


def backing_bytes(spec: TargetSpec) -> int:
    """Size of each backing image. A zbd volume of logical size L needs room for L incompressible
    plus its metadata (zbd create: about 1.21 L for 256M), so its (sparse) image gets 1.5 L + 64M;
    everything else gets `size`."""
    if spec.zbd is None:
        return spec.size_bytes
    logical = spec.zbd.logical_size_bytes or spec.size_bytes
    return max(spec.size_bytes, (logical * 3 // 2 + (64 << 20)) // 4096 * 4096)


def allocated_bytes(path: Path) -> int:
    """Bytes a (sparse) file really occupies on its filesystem."""
    try:
        return os.stat(path).st_blocks * 512
    except OSError:
        return 0


def apparent_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def provision(
    spec: TargetSpec, ident: str, scratch: Path, cmds: Commands, parent: CleanupStack, zfs: ZfsService
) -> TargetInstance:
    inst = TargetInstance(spec, ident, scratch, cmds, parent, zfs)
    cmds.context = f"provision {ident}"
    inst.provision()
    return inst


def describe_json(inst: TargetInstance) -> str:
    return json.dumps(inst.describe(), indent=2)
