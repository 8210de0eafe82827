"""Provisioning and teardown of each target kind on real loop devices (as root)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from zbdlab.config import parse_study
from zbdlab.targets.cleanup import CleanupStack
from zbdlab.targets.commands import Commands
from zbdlab.targets.devices import is_mounted
from zbdlab.targets.instance import provision
from zbdlab.targets.zbd import zbd_problem
from zbdlab.targets.zfs import ZfsService

pytestmark = pytest.mark.needs_root

WORKLOAD = '\n[workloads.w]\nkind = "custom"\nfactory = "run_tinyload:make"\n'


def target(toml: str):
    return parse_study(f"version = 1\n[[targets]]\n{toml}\n{WORKLOAD}").targets[0]


def exercise(spec, scratch: Path) -> dict:
    """Provision, write compressible data, remount (cold path), measure space, tear down; report."""
    cmds = Commands(scratch / "commands.jsonl")
    stack = CleanupStack("test")
    zfs = ZfsService(cmds, stack, scratch / "zfsd")
    seen: dict = {}
    try:
        inst = provision(spec, "t0", scratch, cmds, stack, zfs)
        seen["backing"] = list(inst.backing)
        seen["mountpoint"] = inst.mountpoint
        assert is_mounted(inst.mountpoint)
        data = (b"zbdlab compressible line\n" * 3000)[: 1 << 16]
        (inst.workdir / "f").write_bytes(data * 64)  # 4 MiB of text
        seen["remount"] = inst.remount()
        assert is_mounted(inst.mountpoint)
        assert (inst.workdir / "f").read_bytes() == data * 64, "data survives the cold-cache remount"
        seen["space"] = inst.space()
        seen["fuse"] = inst.fuse_bound
        seen["daemon"] = zfs.proc.pid if zfs.proc else None
        inst.teardown()
        assert not is_mounted(inst.mountpoint)
    finally:
        stack.close()
        cmds.close()
    assert not stack.failures, stack.failures
    for dev in seen.get("backing", []):
        listed = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
        assert not any(line.startswith(dev + ":") and str(scratch) in line for line in listed.splitlines())
    assert not list(scratch.rglob("*.img")), "image files removed"
    if seen.get("daemon"):
        with pytest.raises(ProcessLookupError):
            os.kill(seen["daemon"], 0)
    return seen


def test_ext4_provision_remount_teardown(scratch: Path) -> None:
    seen = exercise(target('name = "e"\nfs = "ext4"\nsize = "128M"'), scratch)
    space = seen["space"]
    assert space.data_bytes_stored == 4 << 20
    assert space.physical_bytes_used >= 4 << 20
    assert seen["remount"]["remounted"]


def test_xfs_provision(scratch: Path) -> None:
    seen = exercise(target('name = "x"\nfs = "xfs"\nsize = "320M"'), scratch)
    assert seen["space"].physical_bytes_used >= 4 << 20


def test_btrfs_raid1_zstd_provision(scratch: Path) -> None:
    seen = exercise(
        target('name = "b"\nfs = "btrfs"\nsize = "256M"\ndevices = 2\nraid = "raid1"\ncompress = "zstd:3"'),
        scratch,
    )
    assert len(seen["backing"]) == 2
    space = seen["space"]
    assert space.extra["ratio_source"] == "compsize"
    assert space.compression_ratio > 5, "repeated text compresses far under zstd"


def test_zfs_gzip_provision_through_zfs_fuse(scratch: Path) -> None:
    seen = exercise(
        target('name = "z"\nfs = "zfs"\nsize = "256M"\ncompression = "gzip"\ndedup = true'), scratch
    )
    space = seen["space"]
    assert space.extra["ratio_source"] == "zfs compressratio"
    assert space.compression_ratio > 2
    assert seen["fuse"] == (not Path("/sys/module/zfs").exists())


def test_ext4_on_zbd_provision(scratch: Path) -> None:
    problem = zbd_problem()
    if problem:
        print(f"SKIP reason: {problem}")
        pytest.skip(problem)
    seen = exercise(target('name = "z"\nfs = "ext4"\nsize = "256M"\n[targets.zbd]\ncodec = "lz4"'), scratch)
    assert seen["remount"]["zbd_restarted"]
    assert seen["space"].compression_ratio > 1.5


def test_ext4_on_nbdkit_transport_baseline_provision(scratch: Path) -> None:
    problem = zbd_problem()  # `zbd attach` puts the export on a block device
    if problem:
        print(f"SKIP reason: {problem}")
        pytest.skip(problem)
    seen = exercise(target('name = "n"\nfs = "ext4"\nsize = "256M"\ntransport = "nbdkit"'), scratch)
    assert seen["remount"]["zbd_restarted"]  # the nbdkit server restarted like a zbd one
    space = seen["space"]
    assert space.compression_ratio is None or space.extra.get("ratio_source") == "df"  # nothing compresses
    # the 4 MiB file reached the backing image through nbdkit; fstrim left the rest sparse
    assert 4 << 20 <= space.extra["backing_allocated_bytes"] < 128 << 20


def test_throttled_ext4_provision(scratch: Path) -> None:
    from zbdlab.throttle import throttle_problem

    if throttle_problem():
        pytest.skip(str(throttle_problem()))
    spec = target('name = "t"\nfs = "ext4"\nsize = "128M"\nthrottle = { rate = "64M", latency = "1ms" }')
    seen = exercise(spec, scratch)
    assert seen["remount"]["remounted"]
    # the device was a loop over nbdfuse's file, in the instance's own directory (found by --resume)
    assert seen["backing"][0].startswith("/dev/loop")
    assert not list(scratch.rglob("thr-*")), "the throttled device's directory is removed"
    leftover = subprocess.run(["pgrep", "-f", f"nbdkit .*{scratch}"], capture_output=True, text=True)
    assert leftover.stdout == "", "nbdkit stopped"
