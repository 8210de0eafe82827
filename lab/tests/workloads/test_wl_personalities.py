"""Filebench-style personalities as fio jobs on a real ext4: the operation mix, fsync behaviour and
request counts follow the Filebench parameters the job files were derived from."""

from __future__ import annotations

import json
from pathlib import Path

from zbdlab.workloads import from_config
from zbdlab.workloads.base import DataSpec
from zbdlab.workloads.personalities import FILEBENCH, OLTP_DB_WRITERS


def _run(name: str, table: dict[str, object], ext4_dir: Path, make_ctx):  # type: ignore[no-untyped-def]
    workload = from_config(name, table)
    (cell,) = workload.cells()
    ctx, hooks = make_ctx(ext4_dir, DataSpec("synthetic", 50))
    (m,) = workload.execute(cell, ctx)
    assert m.operation == name
    assert hooks.calls == [f"before:{name}", f"after:{name}"]
    doc = json.loads(next(ctx.raw_dir.glob("*.json")).read_text())
    job_text = next(ctx.raw_dir.glob("*.fio")).read_text()
    assert "buffer_compress_percentage=50" in job_text and "refill_buffers=1" in job_text
    assert m.throughput_bytes_per_s and m.throughput_bytes_per_s > 0
    assert not list((ext4_dir / name).iterdir())  # files removed afterwards
    return m, doc, job_text


def _ios(m, direction: str) -> int:  # type: ignore[no-untyped-def]
    return int(m.extra["directions"][direction]["total_ios"])


def test_wl_fileserver_mixes_one_read_per_two_writes(ext4_dir: Path, make_ctx) -> None:  # type: ignore[no-untyped-def]
    m, _, job = _run("fileserver", {"scale": 0.01, "threads": 5}, ext4_dir, make_ctx)
    assert "numjobs=5" in job and "nrfiles=20" in job  # 10000 x 0.01 files over 5 threads
    assert "filesize=64k-192k" in job  # mean 128k preserved
    reads, writes = _ios(m, "read"), _ios(m, "write")
    assert 0.2 < reads / (reads + writes) < 0.45  # rwmixread=33
    assert m.logical_bytes_written and m.logical_bytes_read


def test_wl_varmail_fsyncs_every_write(ext4_dir: Path, make_ctx) -> None:  # type: ignore[no-untyped-def]
    m, doc, job = _run("varmail", {"scale": 0.05, "threads": 2}, ext4_dir, make_ctx)
    assert "fsync=1" in job
    syncs = sum(j["sync"]["total_ios"] for j in doc["jobs"])
    assert syncs >= _ios(m, "write") > 0  # fio also syncs files it closes
    assert 0.35 < _ios(m, "read") / (_ios(m, "read") + _ios(m, "write")) < 0.65


def test_wl_webserver_appends_one_log_record_per_ten_reads(ext4_dir: Path, make_ctx) -> None:  # type: ignore[no-untyped-def]
    # Large enough that fio's millisecond runtime is never 0 on a fast machine (throughput needs it).
    m, _, _ = _run("webserver", {"scale": 0.5, "threads": 4}, ext4_dir, make_ctx)
    assert _ios(m, "write") == _ios(m, "read") // 10
    assert m.logical_bytes_written == _ios(m, "write") * FILEBENCH["webserver"].append_size


def test_wl_oltp_readers_writers_and_log_follow_filebench_ratios(ext4_dir: Path, make_ctx) -> None:  # type: ignore[no-untyped-def]
    m, doc, job = _run("oltp", {"scale": 0.05, "threads": 8}, ext4_dir, make_ctx)
    assert job.count("sync=dsync") == 2 and "bs=2k" in job and "bs=256k" in job
    reads = _ios(m, "read")
    assert m.logical_bytes_read == reads * 2048
    per_writer = reads * 100 // 1000 // OLTP_DB_WRITERS
    log_writes = max(1, reads // 3200)
    assert _ios(m, "write") == OLTP_DB_WRITERS * per_writer + log_writes
    assert m.logical_bytes_written == OLTP_DB_WRITERS * per_writer * 2048 + log_writes * 256 * 1024
