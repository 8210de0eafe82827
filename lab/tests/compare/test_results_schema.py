"""The results schema: one definition of a run's record, and every version of it still loads.

fixtures/results_v2 holds rows written by `zbdlab run` (ten rows of the bench-fs study of 2026-11-24,
commit f2c8a07); fixtures/results_v1 holds rows in the version-1 shape (the fields version 2 added
absent, schema_version 1), written for this test from the version history in results/schema.py.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from zbdlab.parsers.results import load_results_dir, results_to_set
from zbdlab.results.schema import SCHEMA_VERSION, OperationRecord, RunRecord
from zbdlab.results.store import ResultStore
from zbdlab.workloads.base import Measurement

FIXTURES = Path(__file__).parent / "fixtures"

# The keys of a version-2 row of runs.jsonl. A change here changes the file: bump SCHEMA_VERSION,
# add to the version history and keep a loader for the old rows.
V2_KEYS = {
    "run_id",
    "target",
    "workload",
    "operation",
    "repetition",
    "file_size_bytes",
    "record_size_bytes",
    "threads",
    "throughput_bytes_per_s",
    "iops",
    "latency_p50_us",
    "latency_p95_us",
    "latency_p99_us",
    "latency_p999_us",
    "cpu_user_s",
    "cpu_system_s",
    "elapsed_s",
    "logical_bytes_written",
    "logical_bytes_read",
    "backing_bytes_written",
    "backing_bytes_read",
    "physical_bytes_used",
    "data_bytes_stored",
    "compression_ratio",
    "declared_compressibility",
    "data_kind",
    "cache_policy",
    "discarded",
    "warnings",
    "extra",
    "schema_version",
    "unit_id",
    "target_kind",
    "compression",
    "cpu_iowait_s",
    "fuse_bound",
    "order_index",
    "declared_dedup_ratio",
    "dedup_ratio",
}


def rows(name: str) -> list[dict]:
    text = (FIXTURES / name / "runs.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_schema_version_2_rows_have_the_v2_keys() -> None:
    assert SCHEMA_VERSION == 2
    assert set(RunRecord.field_names()) == V2_KEYS
    assert len(RunRecord.field_names()) == len(V2_KEYS)


def test_schema_v2_rows_read_and_write_back_unchanged() -> None:
    for row in rows("results_v2"):
        assert set(row) == V2_KEYS
        record = RunRecord.from_row(row)
        assert json.dumps(asdict(record), sort_keys=True) == json.dumps(row, sort_keys=True)


def test_schema_v1_results_dir_loads_with_v2_fields_unset() -> None:
    results = load_results_dir(FIXTURES / "results_v1")
    assert results.study_name == "v1-study"
    assert results.targets == ["ext4", "ext4-on-zbd"]
    assert len(results.records) == 6
    assert not results.warnings
    for record in results.records:
        assert record.schema_version == 1
        assert record.unit_id is None and record.order_index is None and record.dedup_ratio is None
        assert record.fuse_bound is False
    data = results_to_set(results, "zbd", "ext4-on-zbd")
    assert sorted(s.value for s in data.samples) == pytest.approx([80e6 / 2**20, 81e6 / 2**20, 82e6 / 2**20])
    assert data.samples[0].metrics["write_amplification"] == pytest.approx(0.5)


def test_schema_v2_results_dir_loads() -> None:
    results = load_results_dir(FIXTURES / "results_v2")
    assert {r.target for r in results.records} == {"btrfs-zstd1", "ext4-on-zbd-zstd1"}
    assert all(r.schema_version == 2 and r.unit_id for r in results.records)
    data = results_to_set(results, "zbd", "ext4-on-zbd-zstd1")
    assert len(data.samples) == 5


def test_schema_from_row_ignores_newer_fields_and_refuses_missing_ones() -> None:
    row = rows("results_v1")[0]
    assert RunRecord.from_row({**row, "a_field_of_version_3": 1}) == RunRecord.from_row(row)
    del row["run_id"]
    with pytest.raises(TypeError):
        RunRecord.from_row(row)


def test_schema_measurement_is_the_records_measured_part() -> None:
    measured = {f.name for f in fields(OperationRecord)}
    assert measured <= {f.name for f in fields(Measurement)}
    assert measured <= {f.name for f in fields(RunRecord)}
    assert not {"commands", "raw_files", "data_label"} & V2_KEYS  # the workload's provenance stays in raw/


def test_schema_record_of_a_measurement_keeps_its_fields_and_the_runners() -> None:
    m = Measurement(
        operation="write",
        throughput_bytes_per_s=1e8,
        latency_p99_us=40.0,
        logical_bytes_written=4096,
        commands=[["fio", "job.fio"]],
        extra={"fio_wall_s": 1.5},
    )
    record = RunRecord.of(m, run_id="u.write", target="ext4", workload="seq", repetition=1, cpu_user_s=0.5)
    assert record.operation == "write"
    assert record.throughput_bytes_per_s == 1e8
    assert record.latency_p99_us == 40.0
    assert record.logical_bytes_written == 4096
    assert record.extra == {"fio_wall_s": 1.5}
    assert record.cpu_user_s == 0.5
    assert record.elapsed_s is None
    # a measured field the runner names is the runner's
    record = RunRecord.of(m, run_id="u.write", target="ext4", workload="seq", repetition=1, elapsed_s=2.0)
    assert record.elapsed_s == 2.0


def test_schema_csv_columns_lead_with_the_run(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.create()
    store.append([RunRecord.from_row(row) for row in rows("results_v2")])
    store.write_csv()
    header = (tmp_path / "runs.csv").read_text().splitlines()[0].split(",")
    assert header[:4] == ["run_id", "target", "workload", "operation"]
    assert set(header) == V2_KEYS
