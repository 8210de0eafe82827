"""The IOzone matrix and throughput mode on a real ext4: every operation runs with fio in IOzone's
order, moves the bytes IOzone would, and visits the offsets IOzone's definitions say."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from zbdlab.workloads import from_config
from zbdlab.workloads.base import DataSpec
from zbdlab.workloads.fio import JobFile
from zbdlab.workloads.iozone import IOZONE_OPERATIONS, _backward_jobs, _stride_jobs

MIB = 1 << 20


@pytest.mark.parametrize("threads", [1, 2])
def test_wl_iozone_runs_every_operation_in_order(ext4_dir: Path, make_ctx, threads: int) -> None:  # type: ignore[no-untyped-def]
    # 32 MiB: fio counts whole milliseconds, and a cached read of a smaller file can take less than one
    workload = from_config("iozone", {"file_sizes": ["32M"], "record_sizes": ["1M"], "threads": [threads]})
    (cell,) = workload.cells()
    ctx, hooks = make_ctx(ext4_dir, DataSpec("synthetic", 50))
    results = workload.execute(cell, ctx)
    assert [m.operation for m in results] == list(IOZONE_OPERATIONS)
    expected_hooks = []
    for i, op in enumerate(IOZONE_OPERATIONS):
        expected_hooks += (["between"] if i else []) + [f"before:{op}", f"after:{op}"]
    assert hooks.calls == expected_hooks
    for m in results:
        moved = m.logical_bytes_written if "write" in m.operation else m.logical_bytes_read
        idle = m.logical_bytes_read if "write" in m.operation else m.logical_bytes_written
        assert moved == threads * 32 * MIB, m.operation  # IOzone moves the file size in every test
        assert idle == 0, m.operation
        assert m.throughput_bytes_per_s and m.throughput_bytes_per_s > 0
        assert m.iops == pytest.approx(m.throughput_bytes_per_s / MIB)
        assert m.latency_p50_us is not None and m.latency_p999_us is not None
        assert 0 < m.latency_p50_us <= m.latency_p95_us <= m.latency_p99_us <= m.latency_p999_us  # type: ignore[operator]
        assert m.commands and m.commands[0][0] == "fio"
        assert all(p.is_file() and p.parent == ctx.raw_dir for p in m.raw_files)
    assert not list((ext4_dir / "iozone").iterdir())  # files removed after the cell


def test_wl_iozone_reads_need_a_file_so_one_is_written_first(ext4_dir: Path, make_ctx) -> None:  # type: ignore[no-untyped-def]
    workload = from_config(
        "iozone", {"file_sizes": ["512K"], "record_sizes": ["4K"], "operations": ["stride_read", "read"]}
    )
    ctx, hooks = make_ctx(ext4_dir, DataSpec("synthetic", 50))
    results = workload.execute(workload.cells()[0], ctx)
    assert [m.operation for m in results] == ["read", "stride_read"]  # IOzone's order, not the list's
    assert hooks.calls[0] == "between"  # after the unmeasured preparing write
    assert all(m.logical_bytes_read == 512 * 1024 for m in results)


def _offsets(tmp_path: Path, job: JobFile, file_size: int) -> list[int]:
    """Run `job` (with an I/O log per section) against a file of file_size; the offsets read, in order."""
    target = tmp_path / "data"
    target.write_bytes(b"\1" * file_size)
    logs = []
    for i, (_, options) in enumerate(job.jobs):
        options["filename"] = str(target)
        options["write_iolog"] = str(tmp_path / f"{i}.iolog")
        logs.append(tmp_path / f"{i}.iolog")
    path = tmp_path / "offsets.fio"
    path.write_text(job.render())
    subprocess.run(["fio", "--output-format=json", str(path)], check=True, capture_output=True)
    offsets = []
    for log in logs:
        for line in log.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 4 and fields[-3] == "read":  # [time] file action offset length
                offsets.append(int(fields[-2]))
    return offsets


def _job() -> JobFile:
    return JobFile({"ioengine": "psync", "invalidate": 0, "bs": "4k", "thread": True})


@pytest.mark.parametrize("records", [40, 5])
def test_wl_stride_read_reads_every_record_once_in_iozone_order(tmp_path: Path, records: int) -> None:
    job = _job()
    _stride_jobs(job, records * 4096, 4096, 17)
    got = [o // 4096 for o in _offsets(tmp_path, job, records * 4096)]
    expected = [r for k in range(17) for r in range(k, records, 17)]  # IOzone: stride 17, wrap +1
    assert got == expected


def test_wl_backward_read_reads_every_record_once_backwards(tmp_path: Path) -> None:
    job = _job()
    _backward_jobs(job, 16 * 4096, 4096)
    got = [o // 4096 for o in _offsets(tmp_path, job, 16 * 4096)]
    assert sorted(got) == list(range(16))
    assert got == [15, 0, *range(14, 0, -1)]  # fio's backward mode starts at 0: documented deviation


def test_wl_throughput_mode_scales_threads(ext4_dir: Path, make_ctx) -> None:  # type: ignore[no-untyped-def]
    workload = from_config(
        "throughput",
        {"file_size": "1M", "record_size": "128K", "threads": [1, 3], "operations": ["write", "read"]},
    )
    for cell in workload.cells():
        ctx, _ = make_ctx(ext4_dir, DataSpec("synthetic", 25))
        write, read = workload.execute(cell, ctx)
        assert write.logical_bytes_written == read.logical_bytes_read == cell.threads * MIB
        job_text = next(ctx.raw_dir.glob("*-write.fio")).read_text()
        assert f"numjobs={cell.threads}" in job_text and "end_fsync=1" in job_text
