"""How long and how often `zbdlab bench` measures: full (`make bench`) or `--quick`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Same-run ratio groups (`--quick` runs these alone)
GROUPS = ("engine", "nbd-fast", "nbd-slow", "fs")
# Groups that run zbd's own benchmarks or a script under scripts/ and keep its summary
# (zbdlab.bench.scripts); `rados-ab` runs only when asked for, with --base-zbd.
SCRIPT_GROUPS = (
    "builtin",
    "scale",
    "latency",
    "metrics",
    "savings",
    "dedup-index",
    "dedup-space",
    "dedup-write",
    "snapshots",
    "ceph",
)
ASKED_ONLY = ("rados-ab",)
ALL_GROUPS = (*GROUPS, *SCRIPT_GROUPS, *ASKED_ONLY)
# What a plain `zbdlab bench` (`make bench`) runs
DEFAULT_GROUPS = (*GROUPS, *SCRIPT_GROUPS)
BASE = "@base"  # suffix of the arms served by Settings.base_zbd


@dataclass
class Settings:
    rounds: int = 5
    engine_size: str = "256M"
    nbd_size: str = "1G"  # device size; sequential passes cover all of it
    nbd_runtime_s: int = 10  # per random test
    # device size on the slow disk: a pass takes ~10 s at 100 MiB/s, well past the 2 s of traffic the
    # throttle lets through at full speed after idle time (--quick's 128M fits inside that burst)
    slow_size: str = "1G"
    fs_size: str = "1G"
    fs_file: str = "256M"
    # On disk, not tmpfs, for every target alike (override: --work-dir)
    work_dir: Path = Path("/var/tmp")
    confidence: float = 0.90
    # a second zbd binary (e.g. main's) measured in the same rounds: engine and NBD figures "this / base"
    base_zbd: str | None = None
    short: bool = False  # --quick: the script groups' short runs too (QUICK=1 for scripts/bench-scale.sh)
    progress: Callable[[str], None] | None = field(default=None, repr=False)

    @classmethod
    def quick(cls) -> Settings:
        # Fewer rounds (3: intervals stay wide) on smaller devices: a smoke run while developing.
        return cls(
            rounds=3,
            engine_size="128M",
            nbd_size="256M",
            nbd_runtime_s=3,
            slow_size="128M",
            fs_file="64M",
            short=True,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "engine_size": self.engine_size,
            "nbd_size": self.nbd_size,
            "nbd_runtime_s": self.nbd_runtime_s,
            "slow_size": self.slow_size,
            "fs_size": self.fs_size,
            "fs_file": self.fs_file,
            "work_dir": str(self.work_dir),
            "confidence": self.confidence,
            "base_zbd": self.base_zbd,
            "short": self.short,
        }
