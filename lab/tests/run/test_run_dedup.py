"""Declared dedup end to end: a study whose data declares dedupe_percentage, run on a ZFS pool with
dedup on (zfs-fuse here), records the pool's achieved dedup ratio next to the declared one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_zbdlab

from zbdlab.config import TargetSpec
from zbdlab.runner import validity

STUDY = """
version = 1
name = "dedup"
repetitions = 1
cache = "cold"
seed = 3
scratch_dir = "{scratch}"

[data]
compress_percentage = 0
dedupe_percentage = 50

[[targets]]
name = "zfs-dedup"
fs = "zfs"
size = "256M"
dedup = true

[workloads.dedup2]
kind = "iozone"
file_sizes = ["32M"]
record_sizes = ["128K"]
operations = ["write"]

[workloads.dedup2-4k]
kind = "iozone"
file_sizes = ["8M"]
record_sizes = ["4K"]
operations = ["write"]
"""


def test_dedup_warning_only_on_a_dedup_target_far_from_the_declared_ratio() -> None:
    on = TargetSpec(name="z", fs="zfs", dedup="on")
    assert validity.dedup(on, 1.0, 2.0) == "achieved dedup ratio 1.00 is 50 % below the declared 2.00"
    assert validity.dedup(on, 5.2, 4.0) == "achieved dedup ratio 5.20 is 30 % above the declared 4.00"
    assert validity.dedup(on, 2.4, 2.0) is None, "within 25 %"
    assert validity.dedup(on, None, 2.0) is None, "not measured"
    assert validity.dedup(TargetSpec(name="z", fs="zfs"), 1.0, 2.0) is None, "dedup off"
    assert validity.dedup(TargetSpec(name="e", fs="ext4"), 1.0, 2.0) is None


@pytest.mark.needs_root
def test_zfs_dedup_ratio_recorded_next_to_the_declared_one(tmp_path: Path, scratch: Path) -> None:
    """fio blocks of 128 KiB = ZFS records of 128 KiB: about half of the 256 records repeat an earlier
    one, so the pool's dedupratio is about 2 (binomial spread about 4 %), and no dedup warning; with
    4 KiB fio blocks the same declaration is missed, and warned about."""
    study = tmp_path / "study.toml"
    study.write_text(STUDY.format(scratch=scratch))
    results = tmp_path / "results"
    proc = run_zbdlab("run", str(study), "-o", str(results), "--no-report")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    rows = [json.loads(line) for line in (results / "runs.jsonl").read_text().splitlines() if line.strip()]
    by_workload = {r["workload"]: r for r in rows}
    assert sorted(by_workload) == ["dedup2", "dedup2-4k"] and len(rows) == 2
    write = by_workload["dedup2"]
    assert write["data_kind"] == "synthetic:0:dedup50"
    assert write["declared_dedup_ratio"] == 2.0
    print(f"zpool dedupratio {write['dedup_ratio']} for declared {write['declared_dedup_ratio']}")
    assert write["dedup_ratio"] == pytest.approx(2.0, rel=0.25)
    assert not any("dedup ratio" in w for w in write["warnings"]), write["warnings"]
    assert write["compression_ratio"] == pytest.approx(1.0, abs=0.05), "compression off"
    job = next((results / write["extra"]["raw_dir"]).glob("*.fio")).read_text()
    assert "dedupe_percentage=50" in job
    # 4 KiB fio blocks in 128 KiB records: a record repeats only if all 32 of its blocks do, so ZFS
    # finds almost nothing to dedup and the row says the declared 2:1 was missed
    small = by_workload["dedup2-4k"]
    print(f"4K blocks: zpool dedupratio {small['dedup_ratio']}, warnings {small['warnings']}")
    assert small["declared_dedup_ratio"] == 2.0
    assert small["dedup_ratio"] < 1.2
    assert any(
        w.startswith("achieved dedup ratio") and "below the declared 2.00" in w for w in small["warnings"]
    )
