# ruff: noqa: E501 -- the entries are mostly cited prose and study text, kept on one line each
"""Seed 003, course report: ZFS compression and dedup ratios on data of declared ratio (vdbench), and
the CPU cost of dedup."""

from __future__ import annotations

import math

from zbdlab.reproduce.context import Context, medians, study_part
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
from zbdlab.results.schema import RunRecord

DOC = "003 (course report, ZFS vs ext4)"
# workload -> (compress_percentage, dedupe_percentage, declared compression, declared dedup)
DATA = {
    "ratio2": (50, 0, 2.0, 1.0),
    "ratio4": (75, 0, 4.0, 1.0),
    "dedup2": (0, 50, 1.0, 2.0),
    "dedup3": (0, 67, 1.0, 3.0),
    "dedup4": (0, 75, 1.0, 4.0),
}


def study(quick: bool) -> str:
    workloads = "\n".join(
        f"""[workloads.{name}]
kind = "iozone"
file_sizes = ["{"32M" if quick else "64M"}"]
record_sizes = ["128K"]
operations = ["write"]
[workloads.{name}.data]
compress_percentage = {c}
{f"dedupe_percentage = {d}" if d else ""}
"""
        for name, (c, d, _rc, _rd) in DATA.items()
    )
    head = study_head(
        "003: achieved vs declared compression and dedup ratios on ZFS",
        "repro-003",
        repetitions=1 if quick else 3,
        cache="cold",
        seed=3,
        compress_percentage=0,
    )
    targets = "\n".join(
        [
            target("zfs", "zfs", "1G"),
            target("zfs-lzjb", "zfs", "1G", lines='compression = "lzjb"\n'),
            target("zfs-dedup", "zfs", "1G", lines="dedup = true\n"),
        ]
    )
    return f"{head}{targets}\n{workloads}"


COLUMNS = ["data", "declared", "achieved", "achieved vs declared (%)", "CPU s per GB written"]


def measure(ctx: Context) -> Measured:
    results = ctx.study("study", study(ctx.quick))
    comp = medians(results.records, lambda r: (r.workload, r.target), lambda r: r.compression_ratio)
    dedup = medians(results.records, lambda r: (r.workload, r.target), lambda r: r.dedup_ratio)

    def cpu(r: RunRecord) -> float | None:
        user, system, written = r.cpu_user_s, r.cpu_system_s, r.logical_bytes_written
        return (
            (user + system) / (written / 1e9) if user is not None and system is not None and written else None
        )

    cost = medians(results.records, lambda r: (r.workload, r.target), cpu)
    rows = []
    for name, (_c, _d, rc, rd) in DATA.items():
        # a data set declared with a dedup ratio is measured on the dedup pool, the others on lzjb
        label, on, declared, achieved = (
            (f"{name}: compression (lzjb)", "zfs-lzjb", rc, comp)
            if rd == 1.0
            else (f"{name}: dedup", "zfs-dedup", rd, dedup)
        )
        got = achieved.get((name, on), math.nan)
        rows.append(
            [
                label,
                declared,
                round(got, 2),
                round(pct_change(got, declared), 1),
                round(cost.get((name, on), math.nan), 2),
            ]
        )
    plain = cost.get(("dedup3", "zfs"), math.nan)
    rows.append(
        [
            "dedup3 on zfs without dedup (CPU reference)",
            1.0,
            round(dedup.get(("dedup3", "zfs"), math.nan), 2),
            math.nan,
            round(plain, 2),
        ]
    )
    notes = [
        "achieved: zfs compressratio of the dataset and zpool dedupratio after the write; fio's data are declared "
        "with buffer_compress_percentage and dedupe_percentage (docs/workloads.md), vdbench's with compratio/dedupratio",
        "CPU: user + system seconds of the whole machine per GB written (zfs-fuse does the work in a user process)",
    ]
    return Measured(Table(COLUMNS, rows, "ratio (x : 1)"), notes=notes)


def compare(seed: Table, ours: Measured) -> Verdict:
    t = ours.table
    seed_over = seed.value("dedup: dedupratio=3", "achieved vs declared (%)")
    ours_over = t.value("dedup3: dedup", "achieved vs declared (%)")
    verdicts = [change_verdict("dedup 3:1, achieved vs declared", seed_over, ours_over, tolerance_pp=10)]
    seed_cmp = seed.value("compression: compratio=10", "achieved vs declared (%)")
    ours_cmp = t.value("ratio4: compression (lzjb)", "achieved vs declared (%)")
    verdicts.append(
        change_verdict(
            "compression (seed 10:1 lz4, ours 4:1 lzjb), achieved vs declared",
            seed_cmp,
            ours_cmp,
            tolerance_pp=10,
        )
    )
    seed_cpu = pct_change(
        seed.value("dedup on: CPU use", "CPU s per GB written"),
        seed.value("dedup off: CPU use", "CPU s per GB written"),
    )
    ours_cpu = pct_change(
        t.value("dedup3: dedup", "CPU s per GB written"),
        t.value("dedup3 on zfs without dedup (CPU reference)", "CPU s per GB written"),
    )
    verdicts.append(change_verdict("CPU with dedup on vs off", seed_cpu, ours_cpu, tolerance_pp=100))
    return worst(verdicts)


REPRO = Reproduction(
    name="003-ratios",
    title="ZFS compression and dedup: achieved vs declared ratio, and the CPU cost of dedup",
    cite=Cite(DOC, "dedup and compression tests (vdbench), CPU usage comparison", "-", 390),
    seed=Table(
        COLUMNS,
        [
            ["dedup: dedupratio=3", 3.0, 3.33, 11.0, math.nan],
            ["compression: compratio=10", 10.0, 10.55, 5.5, math.nan],
            ["dedup on: CPU use", math.nan, math.nan, math.nan, 22.3],
            ["dedup off: CPU use", math.nan, math.nan, math.nan, 2.89],
        ],
        "ratio (x : 1); the seed's CPU figures are % CPU during the run, not s/GB",
    ),
    seed_setup="vdbench on a ZFS pool (ZFS on Linux, lz4) in a VM; 10 files of 20 MB (dedup), 7 of 500 MB (compression)",
    scaling=lambda quick: (
        "fio writes of "
        + ("32 MiB" if quick else "64 MiB")
        + " per data set, 128 KiB records (= ZFS recordsize, so a repeated block is a repeated record)"
    ),
    measure=measure,
    compare=compare,
    substitute="vdbench is not here (fio's declared data stand in); kernel ZFS lz4 is not here (zfs-fuse lzjb); "
    "the seed's CPU numbers are utilisation %, ours CPU seconds per GB: compared as relative increase only",
    plot="bar",
    plan=lambda quick: [study_part("IOzone write on a fresh pool", study(quick), 5.5 if quick else 5.5 * 2)],
)

ENTRIES = [REPRO]
