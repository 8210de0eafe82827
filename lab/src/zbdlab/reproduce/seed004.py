# ruff: noqa: E501 -- the entries are mostly cited prose and study text, kept on one line each
"""Seed 004, BSc thesis (Skovde 2015): Filebench fileserver, oltp and webserver on btrfs and ZFS (and
ext4, XFS), single disk, RAID 10 and RAID 5; medians of 19 runs (20, first discarded)."""

from __future__ import annotations

import math

from zbdlab.reproduce.context import Context, mb_s, medians_noted, study_part
from zbdlab.reproduce.model import (
    DIFFERENT,
    SAME,
    SAME_DIRECTION,
    Cite,
    Measured,
    Reproduction,
    Table,
    Verdict,
    worst,
)
from zbdlab.reproduce.studies import study_head, target

DOC = "004 (BSc thesis, Skovde 2015)"
PERSONALITIES = ("fileserver", "oltp", "webserver")
THROTTLE = '{ rate = "100M", latency = "4ms" }'


def study(quick: bool) -> str:
    def one(name: str, fs: str, extra: str = "", devices: int = 1) -> str:
        return target(name, fs, "1G", devices=devices, throttle=THROTTLE, lines=f"{extra}\n")

    targets = [one("btrfs", "btrfs"), one("zfs", "zfs")]
    if not quick:
        targets += [
            one("ext4", "ext4"),
            one("xfs", "xfs"),
            one("btrfs-raid10", "btrfs", 'raid = "raid10"', 4),
            one("zfs-raid10", "zfs", 'layout = "raid10"', 4),
            one("btrfs-raid5", "btrfs", 'raid = "raid5"\nmetadata_raid = "raid1"', 4),
            one("zfs-raidz", "zfs", 'layout = "raidz"', 4),
        ]
    workloads = "\n".join(
        f'[workloads.{p}]\nkind = "{p}"\nscale = {0.03 if quick else 0.04}\nruntime_s = {3 if quick else 5}\n'
        for p in PERSONALITIES
    )
    head = study_head(
        "004: Filebench personalities on btrfs, ZFS, ext4, XFS, throttled disks",
        "repro-004",
        repetitions=4,
        cache="warm",
        format="once",
        seed=2015,
        compress_percentage=0,
    )
    return f"{head}{''.join(targets)}\n{workloads}"


ROWS = (("btrfs", "btrfs"), ("ZFS", "zfs"), ("ext4", "ext4"), ("XFS", "xfs"))
COLUMNS = ["file system", "fileserver (MB/s)", "oltp (MB/s)", "webserver (MB/s)"]


def measure(ctx: Context) -> Measured:
    results = ctx.study("study", study(ctx.quick))
    # warm cache: the runner marks each unit's first run discarded, as the thesis discarded run 1 of 20
    med, spread = medians_noted("MB/s", results.records, lambda r: (r.target, r.workload), mb_s)
    rows = [[label, *(round(med.get((t, p), math.nan), 1) for p in PERSONALITIES)] for label, t in ROWS]
    if not ctx.quick:
        for label, t in (
            ("btrfs RAID 10", "btrfs-raid10"),
            ("ZFS RAID 10", "zfs-raid10"),
            ("btrfs RAID 5", "btrfs-raid5"),
            ("ZFS RAID 5 (raidz)", "zfs-raidz"),
        ):
            rows.append([label, *(round(med.get((t, p), math.nan), 1) for p in PERSONALITIES)])
    notes = [
        "median throughput of the non-discarded runs (the first run of each unit is discarded, as in the thesis)",
        spread,
        "Filebench is replaced by zbdlab's fio-based personalities with Filebench's flows (docs/workloads.md)",
        "ZFS is zfs-fuse: FUSE bounds it; the thesis ran ZFS on Linux in the kernel",
    ]
    return Measured(Table(COLUMNS, rows, "MB/s"), notes=notes)


def compare(seed: Table, ours: Measured) -> Verdict:
    verdicts = []
    for column, claim in (
        ("fileserver (MB/s)", "btrfs fastest, ZFS slowest"),
        ("oltp (MB/s)", "ZFS faster than btrfs"),
    ):
        values = {r[0]: r[ours.table.columns.index(column)] for r in ours.table.rows[:4]}
        values = {k: v for k, v in values.items() if not math.isnan(v)}
        if "btrfs" not in values or "ZFS" not in values:
            verdicts.append(Verdict(DIFFERENT, f"{column}: not all file systems measured"))
            continue
        if column.startswith("fileserver"):
            ok = max(values, key=values.get) == "btrfs" and min(values, key=values.get) == "ZFS"  # type: ignore[arg-type]
            ratio_seed = seed.value("btrfs", column) / seed.value("ZFS", column)
        else:
            ok = values["ZFS"] > values["btrfs"]
            ratio_seed = seed.value("ZFS", column) / seed.value("btrfs", column)
        first, second = ("btrfs", "ZFS") if column.startswith("fileserver") else ("ZFS", "btrfs")
        ratio_ours = values[first] / values[second] if values[second] else math.inf
        size_ok = 0.5 <= ratio_ours / ratio_seed <= 2
        text = f"{column.split()[0]}: seed {claim} ({first}/{second} {ratio_seed:.1f}x), ours {first}/{second} {ratio_ours:.1f}x"
        verdicts.append(Verdict(SAME if ok and size_ok else SAME_DIRECTION if ok else DIFFERENT, text))
    return worst(verdicts)


REPRO = Reproduction(
    name="004-filebench",
    title="Filebench fileserver, oltp and webserver on btrfs, ZFS, ext4 and XFS (single disk)",
    cite=Cite(DOC, "section 5.1.1 (Figures 4-5)", "-", 406),
    seed=Table(
        COLUMNS,
        [["btrfs", 108, 7, 50], ["ZFS", 33, 17, 50], ["ext4", math.nan, 55, 50], ["XFS", math.nan, 55, 50]],
        "MB/s (medians; ext4 and XFS fileserver 'close to btrfs', webserver 'around 50' for all)",
    ),
    seed_setup="Filebench 1.4.9 fileserver, oltp, webserver (60 s); one 2015 SATA disk, RAID 10 and RAID 5 of four; "
    "20 runs, first discarded",
    scaling=lambda quick: (
        "a throttled disk per disk (100 MiB/s, 4 ms per request); data sets at "
        + (
            "3/100, 3 s, 4 runs (first discarded) on file systems made once, btrfs and ZFS on a single disk only"
            if quick
            else "1/25, 5 s, 4 runs (first discarded) on file systems made once, with RAID 10 and RAID 5 rows"
        )
    ),
    measure=measure,
    compare=compare,
    substitute="Filebench itself is not packaged here: zbdlab's fio personalities stand in; ext4/XFS on md RAID are "
    "not built (zbdlab has no md targets)",
    plot="bar",
    plan=lambda quick: [study_part("Filebench personality run", study(quick), 6.7 if quick else 6.7 * 1.4)],
)

ENTRIES = [REPRO]
