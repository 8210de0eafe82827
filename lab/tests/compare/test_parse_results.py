"""zbdlab results directories: discarded rows excluded, metrics derived, targets split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zbdlab.parsers import InputError, load_set
from zbdlab.parsers.results import load_results_dir, results_to_set

from .conftest import write_results_dir


def test_parse_results_dir_targets_in_study_order_and_discarded_excluded(tmp_path: Path) -> None:
    write_results_dir(tmp_path / "r", {"ext4": 1.0, "ext4-on-zbd": 0.9}, runs=3)
    results = load_results_dir(tmp_path / "r")
    assert results.targets == ["ext4", "ext4-on-zbd"]
    assert results.study_name == "study"
    data = results_to_set(results, "zbd", "ext4-on-zbd")
    rows = [json.loads(line) for line in (tmp_path / "r" / "runs.jsonl").read_text().splitlines()]
    kept = [r for r in rows if r["target"] == "ext4-on-zbd" and not r["discarded"]]
    assert len(data.samples) == len(kept)
    assert sorted(s.value for s in data.samples) == pytest.approx(
        sorted(r["throughput_bytes_per_s"] / 1048576 for r in kept)
    )
    assert any("discarded" in w for w in data.warnings)
    sample = data.samples[0]
    assert sample.metrics["write_amplification"] == pytest.approx(0.5)
    assert sample.metrics["compression_ratio"] == 2.0
    assert sample.metrics["dedup_ratio"] == 1.5
    moved = kept[0]["logical_bytes_written"]
    assert sample.metrics["cpu_s_per_gb"] == pytest.approx(0.04 / (moved / 1e9))


def test_parse_results_dir_whole_dir_as_set(tmp_path: Path) -> None:
    write_results_dir(tmp_path / "r", {"xfs": 1.0}, runs=2)
    data = load_set("xfs", tmp_path / "r")
    assert data.kind == "zbdlab"
    assert data.runs == ["rep1", "rep2"]
    assert np.all(np.array([s.value for s in data.samples]) > 0)


def test_parse_results_dir_without_rows_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "runs.jsonl").write_text("")
    with pytest.raises(InputError, match="no run records"):
        load_results_dir(tmp_path)
