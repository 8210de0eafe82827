"""Machine and tool metadata recorded once per results directory (environment.json)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any

from zbdlab import __version__
from zbdlab.app import zbd_binary
from zbdlab.monitors.counters import meminfo
from zbdlab.targets.zfs import kernel_zfs_present

# (label, argv) whose first output line is the version; absent tools are recorded as null.
_VERSION_COMMANDS: list[tuple[str, list[str]]] = [
    ("fio", ["fio", "--version"]),
    ("mkfs.ext4", ["mke2fs", "-V"]),
    ("mkfs.xfs", ["mkfs.xfs", "-V"]),
    ("btrfs-progs", ["btrfs", "--version"]),
    ("nbdfuse", ["nbdfuse", "--version"]),
    ("nbdkit", ["nbdkit", "--version"]),
    ("qemu-nbd", ["qemu-nbd", "--version"]),
    ("util-linux", ["losetup", "--version"]),
]
_PACKAGES = [
    "fio",
    "postmark",
    "e2fsprogs",
    "xfsprogs",
    "btrfs-progs",
    "btrfs-compsize",
    "zfs-fuse",
    "libnbd-bin",
]


def _first_line(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (proc.stdout or proc.stderr).strip()
    return text.splitlines()[0] if text else None


def _packages() -> dict[str, str | None]:
    if shutil.which("dpkg-query") is None:
        return {}
    out: dict[str, str | None] = {}
    for name in _PACKAGES:
        proc = subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], capture_output=True, text=True)
        out[name] = proc.stdout.strip() if proc.returncode == 0 else None
    return out


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def collect() -> dict[str, Any]:
    mem = meminfo()
    tools = {label: _first_line(argv) for label, argv in _VERSION_COMMANDS}
    zbd = zbd_binary()
    tools["zbd"] = _first_line([zbd, "--version"]) if zbd else None
    tools["zbd_path"] = zbd
    zfs: dict[str, Any] = {"kernel": kernel_zfs_present()}
    if zfs["kernel"]:
        try:
            with open("/sys/module/zfs/version", encoding="ascii") as f:
                zfs["kernel_version"] = f.read().strip()
        except OSError:
            zfs["kernel_version"] = None
    else:
        zfs["implementation"] = "zfs-fuse" if shutil.which("zfs-fuse") else None
        zfs["pool_version"] = 23 if shutil.which("zfs-fuse") else None
    return {
        "zbdlab_version": __version__,
        "python": sys.version.split()[0],
        "kernel": platform.release(),
        "kernel_version": platform.version(),
        "machine": platform.machine(),
        "hostname": platform.node(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "mem_total_bytes": mem.get("MemTotal"),
        # what differs from run to run on the same machine sits in a nested object, so comparisons of
        # environment.json (zbdlab report) do not flag it
        "at_start": {"mem_available_bytes": mem.get("MemAvailable"), "loadavg": list(os.getloadavg())},
        "tools": tools,
        "packages": _packages(),
        "zfs": zfs,
    }
