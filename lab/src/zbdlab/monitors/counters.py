"""Whole-machine CPU time (/proc/stat) and block-device I/O (/sys/class/block/<dev>/stat), as deltas.

CPU is the whole machine on purpose: it includes the kernel (filesystem compression, loop, FUSE) and
user-space servers (zbd, nbdfuse, zfs-fuse), which a per-process figure would miss.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

SECTOR_BYTES = 512  # /sys/block/*/stat counts 512-byte sectors whatever the device's block size
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSample:
    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int


def read_cpu() -> CpuSample:
    with open("/proc/stat", encoding="ascii") as f:
        fields = f.readline().split()
    assert fields[0] == "cpu", "first /proc/stat line is the machine total"
    values = [int(v) for v in fields[1:9]]
    return CpuSample(*values)


def cpu_delta_s(before: CpuSample, after: CpuSample) -> dict[str, float]:
    def d(name: str) -> float:
        return (getattr(after, name) - getattr(before, name)) / _TICKS_PER_S

    return {
        "cpu_user_s": d("user") + d("nice"),
        "cpu_system_s": d("system") + d("irq") + d("softirq"),
        "cpu_iowait_s": d("iowait"),
        "cpu_idle_s": d("idle"),
    }


@dataclass(frozen=True)
class IoSample:
    sectors_read: int
    sectors_written: int
    ios_read: int
    ios_written: int
    ios_flushed: int | None = None  # flush requests (kernel 5.5+: the stat file's 16th field)


def parse_stat(text: str) -> IoSample:
    """One /sys/block/<dev>/stat line: requests and sectors each way, and flush requests where the
    kernel counts them (Documentation/block/stat.rst: field 16 is "flush I/Os", since 5.5)."""
    fields = [int(v) for v in text.split()]
    return IoSample(
        sectors_read=fields[2],
        sectors_written=fields[6],
        ios_read=fields[0],
        ios_written=fields[4],
        ios_flushed=fields[15] if len(fields) >= 17 else None,
    )


def read_io(device: str) -> IoSample:
    """device is a /sys/class/block name such as loop3 or sdb1."""
    # /sys/class/block has partitions too (a real device such as sdb1), /sys/block only disks
    with open(f"/sys/class/block/{device}/stat", encoding="ascii") as f:
        return parse_stat(f.read())


def read_io_all(devices: list[str]) -> dict[str, IoSample]:
    return {d: read_io(d) for d in devices}


def io_delta_bytes(before: dict[str, IoSample], after: dict[str, IoSample]) -> tuple[int, int]:
    """(bytes read, bytes written) summed over the devices present in both samples."""
    read = written = 0
    for device, b in before.items():
        a = after.get(device)
        if a is None:
            continue
        read += (a.sectors_read - b.sectors_read) * SECTOR_BYTES
        written += (a.sectors_written - b.sectors_written) * SECTOR_BYTES
    return read, written


def io_delta_requests(before: dict[str, IoSample], after: dict[str, IoSample]) -> dict[str, int | None]:
    """Requests completed between two samples, summed over the devices present in both: read and
    write requests, and flushes (None when a device's kernel does not count them)."""
    reads = writes = 0
    flushes: int | None = 0
    for device, b in before.items():
        a = after.get(device)
        if a is None:
            continue
        reads += a.ios_read - b.ios_read
        writes += a.ios_written - b.ios_written
        if flushes is not None and a.ios_flushed is not None and b.ios_flushed is not None:
            flushes += a.ios_flushed - b.ios_flushed
        else:
            flushes = None
    return {"read_requests": reads, "write_requests": writes, "flushes": flushes}


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out
