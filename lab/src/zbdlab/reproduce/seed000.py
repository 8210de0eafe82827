# ruff: noqa: E501 -- the entries are mostly cited prose and study text, kept on one line each
"""Seed 000, MSc thesis (Oslo 2014): ZFS and btrfs compression against no compression, IOzone.

Headline: Tables 5.1 and 5.2 (single disk) and 5.3 and 5.4 (RAID), the average-throughput increase
that compression brought per IOzone operation. The thesis wrote IOzone's own, highly compressible
buffers to single SATA disks and md/ZFS RAID; here a throttled disk stands in for each disk and the
data are declared 90 % compressible (about 9:1).
"""

from __future__ import annotations

import math

from zbdlab.reproduce.context import Context, mb_s, medians, spread_note, spreads, study_part
from zbdlab.reproduce.model import (
    Cite,
    Measured,
    Reproduction,
    Table,
    Verdict,
    change_verdict,
    pct_change,
    worst,
)
from zbdlab.reproduce.studies import study_head, target

DOC = "000 (MSc thesis, Oslo 2014)"
OPS = ("write", "read", "random_read", "random_write")
OP_LABELS = {
    "write": "Sequential Write",
    "read": "Sequential Read",
    "random_read": "RandomRead",
    "random_write": "RandomWrite",
}
THROTTLE = '{ rate = "100M", latency = "1ms" }'
PAIRS = (  # (row, uncompressed target, compressed target)
    ("ZFS single", "zfs", "zfs-lzjb"),
    ("btrfs single", "btrfs", "btrfs-lzo"),
    ("ZFS raidz1", "zfs-raidz", "zfs-raidz-lzjb"),
    ("btrfs raid5", "btrfs-raid5", "btrfs-raid5-lzo"),
)


def study(quick: bool) -> str:
    size, raid_size = ("1G", "512M") if quick else ("2G", "1G")

    def one(name: str, fs: str, extra: str, devices: int = 1) -> str:
        disk = raid_size if devices > 1 else size
        return target(name, fs, disk, devices=devices, throttle=THROTTLE, lines=f"{extra}\n")

    targets = "".join(
        [
            one("zfs", "zfs", ""),
            one("zfs-lzjb", "zfs", 'compression = "lzjb"'),
            one("btrfs", "btrfs", ""),
            one("btrfs-lzo", "btrfs", 'compress = "lzo"\ncompress_force = true'),
            *(
                []
                if quick
                else [
                    one("zfs-raidz", "zfs", 'layout = "raidz"', 3),
                    one("zfs-raidz-lzjb", "zfs", 'layout = "raidz"\ncompression = "lzjb"', 3),
                    one("btrfs-raid5", "btrfs", 'raid = "raid5"\nmetadata_raid = "raid1"', 3),
                    one(
                        "btrfs-raid5-lzo",
                        "btrfs",
                        'raid = "raid5"\nmetadata_raid = "raid1"\ncompress = "lzo"\ncompress_force = true',
                        3,
                    ),
                ]
            ),
        ]
    )
    # full: one record size (1M) and no thread sweep: the table averages the per-cell gain over cells
    # and the thread runs never entered it; each cell is 4 cold cycles (zfs-fuse restarts) per run
    files = '["64M"]' if quick else '["128M"]'
    records = '["1M"]'
    head = study_head(
        "000: ZFS/btrfs compression on vs off, IOzone, throttled disks",
        "repro-000",
        repetitions=3,
        cache="cold",
        format="once",
        seed=2014,
        compress_percentage=90,
    )
    return f"""{head}{targets}
[workloads.iozone]
kind = "iozone"
file_sizes = {files}
record_sizes = {records}
operations = ["write", "read", "random_read", "random_write"]
"""


def measure(ctx: Context) -> Measured:
    results = ctx.study("study", study(ctx.quick))
    recs = [r for r in results.records if r.workload == "iozone"]
    # per cell (file, record) median over repetitions, then the mean increase over cells, like the
    # thesis' averages of per-size increases
    cell = medians(
        recs, lambda r: (r.target, r.operation, str(r.file_size_bytes), str(r.record_size_bytes)), mb_s
    )
    rows = []
    for label, plain, packed in PAIRS:
        row: list[object] = [label]
        for op in OPS:
            changes = [
                pct_change(v, cell[(plain, op, f, rec)])
                for (t, o, f, rec), v in cell.items()
                if t == packed and o == op and (plain, op, f, rec) in cell
            ]
            row.append(round(sum(changes) / len(changes), 0) if changes else None)
        if any(v is not None for v in row[1:]):
            rows.append(row)
    notes = [
        "average over the (file size, record size) cells of the per-cell increase of the median throughput",
        "ZFS is zfs-fuse (pool v23, lzjb; the thesis used ZFS on Linux with lz4): its speed is bounded by FUSE",
        spread_note("MB/s", spreads(recs, lambda r: (r.target, r.operation), mb_s)),
    ]
    if ctx.quick:
        notes.append("quick: single-disk rows only (the RAID rows run in the full set)")
    return Measured(
        Table(
            ["setup", *(OP_LABELS[o] for o in OPS)], rows, "% average throughput increase from compression"
        ),
        notes=notes,
    )


def compare(seed: Table, ours: Measured) -> Verdict:
    verdicts = []
    for row in ours.table.rows:
        for i, op in enumerate(OPS, start=1):
            s, o = seed.value(row[0], OP_LABELS[op]), row[i]
            if s is not None and o is not None and not math.isnan(o):
                verdicts.append(change_verdict(f"{row[0]} {op}", s, o, tolerance_pp=30))
    return worst(verdicts) if verdicts else Verdict("different", "no operation measured on both sides")


REPRO = Reproduction(
    name="000-compression",
    title="ZFS and btrfs: throughput gained by compression, per IOzone operation",
    cite=Cite(DOC, "Tables 5.1-5.4, sections 5.1-5.8", "66-93", 1325),
    seed=Table(
        ["setup", *(OP_LABELS[o] for o in OPS)],
        [
            ["ZFS single", 900, 600, 100, 900],
            ["btrfs single", 2, 20, 74, -10],
            ["ZFS raidz1", 450, 200, 144, 400],
            ["btrfs raid5", 250, 100, 70, 150],
        ],
        "% average throughput increase from compression",
    ),
    seed_setup="IOzone -i0 -i1 -i2, files 4/8/16 GB, records 128 KB..1 MB, 6 repetitions; single SATA disk and 3-disk "
    "RAID (raidz1, btrfs raid5); ZFS lz4, btrfs lzo; IOzone's own (highly compressible) data",
    scaling=lambda quick: (
        "one throttled disk per disk (100 MiB/s, 1 ms per request); data 90 % compressible; "
        + (
            "files 64 MiB, record 1M, 3 repetitions on file systems made once, single disk only"
            if quick
            else "files 128 MiB, record 1M, 3 repetitions on file systems made once, single disk and RAID"
        )
        + "; the ranges the thesis gives (e.g. random read 100-1200 %) are represented by their lower end"
    ),
    measure=measure,
    compare=compare,
    substitute="kernel ZFS with lz4 is not here: zfs-fuse with lzjb (lz4's predecessor) stands in; ext4 on md RAID "
    "is not built (zbdlab has no md targets)",
    plot="bar",
    plan=lambda quick: [
        # seconds per unit (IOzone's 4 operations, a cold cycle before each): measured quick (load 1.8),
        # full: twice the file size
        study_part("IOzone run, 4 cold cycles", study(quick), 10.8 if quick else 10.8 * 2)
    ],
)

ENTRIES = [REPRO]
