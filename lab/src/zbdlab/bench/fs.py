"""Group `fs`: filesystems on zbd against the transport baseline, plain ext4 and btrfs compression.

Provisioning, cold-cache handling and measuring are the lab's own (`zbdlab run`): this group writes a
study file (kept in raw/ to rerun by hand), runs it, and turns its runs into same-run ratios. The
lab's cold policy runs every target once per repetition in a seeded random order, so repetitions are
the rounds. Per operation it records throughput, CPU seconds of the whole machine, bytes written to
the backing device(s) and what the backing images hold after fstrim (metadata included).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zbdlab.bench.core import Figure, Goal, Rounds, median
from zbdlab.bench.settings import Settings
from zbdlab.config import load_study

TREE_SOURCE = "/usr/lib/python3.11"
OPERATIONS = ("copy_tree", "write", "read", "random_write", "random_read")
OP_LABELS = {
    "copy_tree": "tree copy (through sync)",
    "write": "1 MiB seq write",
    "read": "1 MiB seq read",
    "random_write": "4 KiB rand write",
    "random_read": "4 KiB rand read",
}
ZBD = {"ext4-on-zbd-lz4": "lz4", "ext4-on-zbd-zstd1": "zstd:1"}
TRANSPORT = "ext4-on-nbdkit"
# btrfs counterpart of each zbd codec (lzo is btrfs's fast codec, as lz4 is zbd's)
BTRFS = {
    "ext4-on-zbd-lz4": ("btrfs-lzo", "btrfs-force-lzo"),
    "ext4-on-zbd-zstd1": ("btrfs-zstd1", "btrfs-force-zstd1"),
}
GOAL_TRANSPORT = Goal(at_least=0.8)  # ext4-on-zbd / ext4-on-transport-baseline
GOAL_TRANSPORT_OPS = ("copy_tree", "write", "read")
# issue 10's space targets (bytes the backing image holds after fstrim), checked on the same tree
GOAL_SPACE = {
    ("ext4-on-zbd-zstd1", "btrfs-zstd1"): Goal(at_most=0.85),
    ("ext4-on-zbd-zstd1", "btrfs-force-zstd1"): Goal(at_most=0.9),
    ("ext4-on-zbd-lz4", "btrfs-lzo"): Goal(at_most=0.85),
}


def study_text(settings: Settings, tree_source: str = TREE_SOURCE) -> str:
    size, file = settings.fs_size, settings.fs_file
    targets = [
        ("ext4", 'fs = "ext4"'),
        (TRANSPORT, 'fs = "ext4"\ntransport = "nbdkit"'),
        *((name, f'fs = "ext4"\n[targets.zbd]\ncodec = "{codec}"') for name, codec in ZBD.items()),
        ("btrfs-lzo", 'fs = "btrfs"\ncompress = "lzo"'),
        ("btrfs-force-lzo", 'fs = "btrfs"\ncompress = "lzo"\ncompress_force = true'),
        ("btrfs-zstd1", 'fs = "btrfs"\ncompress = "zstd:1"'),
        ("btrfs-force-zstd1", 'fs = "btrfs"\ncompress = "zstd:1"\ncompress_force = true'),
    ]
    lines = [
        "# Written by `zbdlab bench --only fs`; rerun by hand with `zbdlab run <this file>`.",
        "version = 1",
        'name = "bench-fs"',
        f"repetitions = {settings.rounds}",
        'cache = "cold"',
        # a fresh filesystem per workload: space after the tree copy must not hold what earlier
        # workloads of the same repetition left behind (freed, but not every layer gives it back)
        'format = "run"',
        "seed = 1",
        "",
        "[data]",
        'kind = "synthetic"',
        "compress_percentage = 50",
    ]
    for name, body in targets:
        lines += ["", "[[targets]]", f'name = "{name}"', f'size = "{size}"', body]
    lines += [
        "",
        "[workloads.tree]",
        'kind = "copy"',
        'operations = ["tree"]',
        f'tree_source = "{tree_source}"',
        "",
        "[workloads.seq]",
        'kind = "iozone"',
        f'file_sizes = ["{file}"]',
        'record_sizes = ["1M"]',
        'operations = ["write", "read"]',
        "",
        "[workloads.rand]",
        'kind = "iozone"',
        f'file_sizes = ["{file}"]',
        'record_sizes = ["4K"]',
        'operations = ["random_read", "random_write"]',
        "",
    ]
    return "\n".join(lines)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def rounds_from_runs(rows: list[dict[str, Any]]) -> Rounds:
    """One arm per target, one round per repetition: per operation MB/s, CPU seconds, bytes written
    to the backing device(s), bytes the backing images hold, and the compression ratio."""
    targets = list(dict.fromkeys(r["target"] for r in rows))
    rounds = Rounds(targets)
    for r in sorted(rows, key=lambda r: (r["repetition"], r["target"])):
        if r.get("discarded"):
            continue
        op = r["operation"]
        cpu = _number(r.get("cpu_user_s")) + _number(r.get("cpu_system_s"))
        extra = r.get("extra") or {}
        rounds.add(
            r["repetition"] - 1,
            r["target"],
            {
                f"{op}_mb_s": _number(r.get("throughput_bytes_per_s")) / 1e6,
                f"{op}_cpu_s": cpu,
                f"{op}_written": _number(r.get("backing_bytes_written")),
                f"{op}_allocated": _number(extra.get("backing_allocated_bytes")),
                f"{op}_ratio": _number(r.get("compression_ratio")),
            },
        )
    return rounds


def figures(rounds: Rounds) -> list[Figure]:
    out: list[Figure] = []

    def add(num: str, den: str, op: str, metric: str, what: str, unit: str, goal: Goal | None = None) -> None:
        if num in rounds.arms and den in rounds.arms:
            out.append(
                Figure(
                    "fs",
                    f"{OP_LABELS[op]}, {what}: {num} / {den}",
                    rounds.get(num, f"{op}_{metric}"),
                    rounds.get(den, f"{op}_{metric}"),
                    unit=unit,
                    goal=goal,
                )
            )

    for op in OPERATIONS:
        for zbd in ZBD:
            goal = GOAL_TRANSPORT if op in GOAL_TRANSPORT_OPS else None
            add(zbd, TRANSPORT, op, "mb_s", "speed", "MB/s", goal)
        add(TRANSPORT, "ext4", op, "mb_s", "speed (the transport's cost)", "MB/s")
    # like with like: zbd beside btrfs with the same kind of codec, speed, CPU and space
    for zbd, others in BTRFS.items():
        for other in others:
            for op in ("copy_tree", "write"):
                add(zbd, other, op, "mb_s", "speed", "MB/s")
                add(zbd, other, op, "cpu_s", "CPU seconds", "s")
                add(zbd, other, op, "written", "bytes written to the backing device", "B")
            add(zbd, other, "copy_tree", "allocated", "space after fstrim", "B", GOAL_SPACE.get((zbd, other)))
    return out


def space_table(rounds: Rounds) -> list[str]:
    """Space saved and speed together, per target: the medians behind the figures."""

    columns = [
        "target",
        "tree: space after fstrim (MB)",
        "tree ratio",
        "tree MB/s",
        "seq write MB/s",
        "seq read MB/s",
        "rand write MB/s",
        "rand read MB/s",
        "CPU s (tree)",
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for arm in rounds.arms:

        def m(metric: str, scale: float = 1.0, fmt: str = "{:.0f}", arm: str = arm) -> str:
            value = median(rounds.get(arm, metric))
            return "-" if not math.isfinite(value) else fmt.format(value / scale)

        lines.append(
            f"| {arm} | {m('copy_tree_allocated', 1e6)} | {m('copy_tree_ratio', fmt='{:.2f}')} | "
            f"{m('copy_tree_mb_s')} | "
            f"{m('write_mb_s')} | {m('read_mb_s')} | {m('random_write_mb_s', fmt='{:.1f}')} | "
            f"{m('random_read_mb_s', fmt='{:.1f}')} | {m('copy_tree_cpu_s', fmt='{:.1f}')} |"
        )
    return lines


def run(
    settings: Settings, raw: Path, progress: Callable[[str], None] | None = None
) -> tuple[list[Figure], list[str]]:
    from zbdlab.app import console
    from zbdlab.runner import Runner

    study_path = raw / "fs-study.toml"
    study_path.write_text(study_text(settings))
    results = raw / "fs-study"
    if progress:
        progress(f"fs: zbdlab run {study_path} -o {results}")
    Runner(load_study(study_path), results, console=console).run()
    rows = [json.loads(line) for line in (results / "runs.jsonl").read_text().splitlines() if line.strip()]
    rounds = rounds_from_runs(rows)
    return figures(rounds), space_table(rounds)
