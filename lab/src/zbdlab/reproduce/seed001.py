# ruff: noqa: E501 -- the entries are mostly cited prose and study text, kept on one line each
"""Seed 001, BSc thesis (Brno 2011): ext2/3/4 and XFS under PostMark, and Ext4 vs XFS through the
IOzone comparison tool of its section 5.2 (here `zbdlab compare`)."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from zbdlab.reproduce.context import Context, by_target, medians, spread_note, spreads, study_part
from zbdlab.reproduce.model import (
    DIFFERENT,
    SAME,
    SAME_DIRECTION,
    Cite,
    Measured,
    Reproduction,
    Table,
    Verdict,
    change_verdict,
    worst,
)
from zbdlab.reproduce.studies import study_head, target
from zbdlab.results.schema import RunRecord

DOC = "001 (BSc thesis, Brno 2011)"
FILESYSTEMS = (  # row, fs, mkfs options: mkfs.ext4 -t ext2/ext3 makes the older formats
    ("Ext4", "ext4", ""),
    ("Ext3", "ext4", 'mkfs_options = ["-t", "ext3"]'),
    ("XFS", "xfs", ""),
    ("Ext2", "ext4", 'mkfs_options = ["-t", "ext2"]'),
)


def postmark_study(quick: bool) -> str:
    size = "1G" if quick else "4G"
    targets = "\n".join(target(row.lower(), fs, size, lines=f"{extra}\n") for row, fs, extra in FILESYSTEMS)
    # thesis: files of 8..16 KiB, 131,072 files, 4 transactions per file, read:append 10:1 (bias_read 9,
    # the nearest in PostMark's tenths), create:delete 5:1 (bias_create 8)
    # full: a quarter of the thesis' 131,072 files would take 2 min a run; 8,192 is 4x the quick run
    number = 2048 if quick else 8192
    head = study_head(
        "001-postmark: the thesis' PostMark configuration, scaled",
        "repro-001-postmark",
        repetitions=4,
        cache="warm",
        format="once",
        seed=2011,
    )
    return f"""{head}{targets}
[workloads.postmark]
kind = "postmark"
number = {number}
transactions = {number * 4}
size_low = "8K"
size_high = "16K"
bias_read = 9
bias_create = 8
"""


PM_COLUMNS = ["file system", "read (MiB/s)", "write (MiB/s)"]


def postmark_measure(ctx: Context) -> Measured:
    results = ctx.study("study", postmark_study(ctx.quick))

    def per_s(key: str) -> Callable[[RunRecord], float | None]:
        # PostMark's own rates divide by whole seconds: too coarse for runs of a few seconds
        def rate(r: RunRecord) -> float | None:
            moved = r.extra.get("postmark", {}).get(key)
            return moved / r.elapsed_s if moved is not None and r.elapsed_s else None

        return rate

    read = medians(results.records, by_target, per_s("bytes_read"))
    write = medians(results.records, by_target, per_s("bytes_written"))
    read_mib = per_s("bytes_read")
    rows = [
        [
            row,
            round(read.get((row.lower(),), math.nan) / 2**20, 2),
            round(write.get((row.lower(),), math.nan) / 2**20, 2),
        ]
        for row, _fs, _extra in FILESYSTEMS
    ]
    notes = [
        "bytes PostMark read and wrote (its report) per second of its whole run (wall clock), median of repetitions",
        spread_note(
            "read MiB/s",
            spreads(results.records, by_target, lambda r: (read_mib(r) or 0) / 2**20),
        ),
        "Ext2 and Ext3 are made by mkfs.ext4 -t ext2/ext3 and run by the kernel's ext4 driver (as on any current kernel)",
    ]
    return Measured(Table(PM_COLUMNS, rows, "MiB/s"), notes=notes)


def _order(table: Table, column: str) -> list[str]:
    return [r[0] for r in sorted(table.rows, key=lambda r: -r[table.columns.index(column)])]


def postmark_compare(seed: Table, ours: Measured) -> Verdict:
    verdicts = []
    for column in ("read (MiB/s)", "write (MiB/s)"):
        s, o = _order(seed, column), _order(ours.table, column)
        scale = sum(ours.table.column(column)) / sum(seed.column(column))
        text = f"{column.split()[0]} ranking: seed {' > '.join(s)}, ours {' > '.join(o)} (ours {scale:.0f}x the seed's rates)"
        if s == o:
            kind = SAME if 0.5 <= scale <= 2 else SAME_DIRECTION
        elif s[0] == o[0]:
            kind = SAME_DIRECTION
        else:
            kind = DIFFERENT
        verdicts.append(Verdict(kind, text))
    merged = worst(verdicts)
    if merged.kind != SAME:
        merged.reason += (
            "; the thesis' partition was a 2011 SATA disk, ours sits on this machine's disk and page cache"
        )
    return merged


POSTMARK = Reproduction(
    name="001-postmark",
    title="PostMark on Ext2, Ext3, Ext4 and XFS",
    cite=Cite(DOC, "section 5.4 (PostMark)", "38", 957),
    seed=Table(
        PM_COLUMNS,
        [["Ext4", 18.5, 13.87], ["Ext3", 14.8, 11.1], ["XFS", 8.82, 6.62], ["Ext2", 5.89, 4.42]],
        "MiB/s (medians)",
    ),
    seed_setup="PostMark, 20 GiB partition of one SATA disk, files 8-16 KiB, 131,072 files, 4 transactions each, "
    "read:append 10:1, create:delete 5:1; medians over several Beaker jobs of 5 runs",
    scaling=lambda quick: (
        (
            "2,048 files and 8,192 transactions, 4 repetitions (warm: PostMark makes its own data set; the "
            "first discarded) on file systems made once"
            if quick
            else "8,192 files and 32,768 transactions, 4 repetitions (warm, the first discarded) on file systems "
            "made once"
        )
        + " (the thesis: 131,072 and 524,288); loop device on this machine's disk, no throttle (the thesis "
        "compares file systems, not compression)"
    ),
    measure=postmark_measure,
    compare=postmark_compare,
    plot="bar",
    plan=lambda quick: [study_part("PostMark run", postmark_study(quick), 0.9 if quick else 0.9 * 4)],
)


# --- Ext4 vs XFS through the comparison tool ------------------------------------------------------------


def iozone_study(quick: bool) -> str:
    head = study_head(
        "001-compare: IOzone on Ext4 and XFS (buffered), for zbdlab compare",
        "repro-001-iozone",
        repetitions=3,
        cache="cold",
        format="once",
        seed=2011,
        compress_percentage=0,
    )
    targets = "\n".join(target(fs, fs, "1G") for fs in ("xfs", "ext4"))
    return f"""{head}{targets}
[workloads.iozone]
kind = "iozone"
file_sizes = {'["4M", "16M"]' if quick else '["4M", "16M", "64M"]'}
record_sizes = {'["1M"]' if quick else '["64K", "1M"]'}
operations = ["write", "reread"]
"""


CMP_COLUMNS = ["operation", "med (%)", "reg (%)", "verdict (zbdlab compare)"]


def compare_measure(ctx: Context) -> Measured:
    from zbdlab.parsers import load_set
    from zbdlab.stats.compare import Options, analyse

    results = ctx.study("study", iozone_study(ctx.quick))
    out = ctx.dir / "compare"
    run_compare(ctx, results.path, out)
    sets = [load_set("xfs", results.path, "xfs"), load_set("ext4", results.path, "ext4")]
    analysis = analyse(sets, Options())
    rows = []
    for op in ("write", "reread"):
        primary = analysis.primary("ext4", op)
        slope = next((s for s in analysis.slopes if s.set_name == "ext4" and s.operation == op), None)
        data = analysis.cells
        base = [float(v.mean()) for k, v in data["xfs"].items() if k.operation == op]
        mine = [float(v.mean()) for k, v in data["ext4"].items() if k.operation == op]
        med = (_median(mine) / _median(base) - 1) * 100 if base and mine else math.nan
        reg = (slope.slope - 1) * 100 if slope else math.nan
        rows.append([op, round(med, 1), round(reg, 1), primary.verdict if primary else "-"])
    notes = [
        "med: ratio of the medians of Ext4 and XFS over all cells of the operation; reg: slope a of the regression "
        "line y = a x through (XFS, Ext4) cell pairs, as (a - 1) (the thesis prints |1 - a| with the winner named)",
        f"the full comparison page: {out}/index.html (zbdlab compare, the thesis' section 5.2 tool)",
        "positive: Ext4 faster than XFS",
    ]
    return Measured(Table(CMP_COLUMNS, rows, "% Ext4 vs XFS"), notes=notes)


def run_compare(ctx: Context, results: Path, out: Path) -> None:
    """The thesis' tool, as a reader would run it: `zbdlab compare` writes the page and CSV tables."""
    ctx.tool(
        [
            sys.executable,
            "-c",
            "from zbdlab.cli import main; main()",
            "compare",
            "--set",
            f"xfs={results}@xfs",
            "--set",
            f"ext4={results}@ext4",
            "-o",
            str(out),
        ],
        "compare",
    )
    ctx.commands[-1] = f"zbdlab compare --set xfs={results}@xfs --set ext4={results}@ext4 -o {out}"


def _median(values: list[float]) -> float:
    return statistics.median(values)


def compare_compare(seed: Table, ours: Measured) -> Verdict:
    return worst(
        [
            change_verdict(
                f"{op} med", seed.value(op, "med (%)"), ours.table.value(op, "med (%)"), tolerance_pp=10
            )
            for op in ("write", "reread")
        ]
    )


COMPARE = Reproduction(
    name="001-compare",
    title="Ext4 vs XFS through the IOzone comparison tool (zbdlab compare)",
    cite=Cite(DOC, "section 5.3.2 (Ext4/XFS, with cache)", "25", 574),
    seed=Table(
        CMP_COLUMNS,
        [
            ["write", -16, -11, "XFS faster (files > 1 MiB, records > 4 KiB)"],
            ["reread", 5, 12, "Ext4 faster"],
        ],
        "% Ext4 vs XFS",
    ),
    seed_setup="IOzone automatic mode (files 64 KiB..4 GiB, records 4 KiB..16 MiB) with cache, one SATA disk; "
    "t-test at 10 %",
    scaling=lambda quick: (
        "files "
        + (
            "4 and 16 MiB, record 1M, 3 repetitions on file systems made once"
            if quick
            else "4, 16 and 64 MiB, records 64K and 1M, 3 repetitions on file systems made once"
        )
        + "; buffered like the thesis' cached runs; incompressible data"
    ),
    measure=compare_measure,
    compare=compare_compare,
    plot="bar",
    plan=lambda quick: [study_part("IOzone run (cold)", iozone_study(quick), 2.1 if quick else 2.1 * 3.5)],
)

ENTRIES = [POSTMARK, COMPARE]
