"""The IOzone matrix and throughput mode on a real ext4: every operation runs with fio in IOzone's
order, moves the bytes IOzone would, and visits the offsets IOzone's definitions say."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from zbdlab.workloads import from_config
from zbdlab.workloads.base import DataSpec
from zbdlab.workloads.iozone import IOZONE_OPERATIONS, backward_order, stride_order

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


def _issued_offsets(job_file: Path) -> list[int]:
    """Run a rendered job file under fio --debug=io: the read offsets fio really issued, in order."""
    proc = subprocess.run(["fio", "--debug=io", str(job_file)], check=True, capture_output=True, text=True)
    found = re.findall(r"queue: io_u \S+: off=(0x[0-9a-f]+),len=\S+,ddir=0", proc.stdout + proc.stderr)
    return [int(offset, 16) for offset in found]


def test_wl_iozone_orders() -> None:
    """Worked by hand from iozone.c: after record p comes p + 17 unless p + 1 + 17 >= records - 1;
    then pass w starts at record w."""
    assert backward_order(4) == [3, 2, 1, 0]
    assert stride_order(40, 17)[:16] == [0, 17, 34, 1, 18, 35, 2, 19, 36, 3, 20, 37, 4, 21, 5, 22]
    assert stride_order(10, 17) == [0] * 10  # fewer records than the stride: IOzone re-reads record 0
    for records in (1, 5, 17, 40, 1000):
        assert len(stride_order(records, 17)) == records  # bytes read = file size


@pytest.mark.parametrize("op", ["backward_read", "stride_read"])
def test_wl_replayed_reads_hit_iozone_offsets(ext4_dir: Path, make_ctx, op: str) -> None:  # type: ignore[no-untyped-def]
    records = 40
    table = {"file_sizes": ["160K"], "record_sizes": ["4K"], "operations": ["write", op], "keep_files": True}
    workload = from_config("iozone", table)
    (cell,) = workload.cells()
    ctx, _ = make_ctx(ext4_dir, DataSpec("synthetic", 50))
    _, m = workload.execute(cell, ctx)
    assert m.logical_bytes_read == records * 4096 and m.extra["directions"]["read"]["total_ios"] == records
    expected = backward_order(records) if op == "backward_read" else stride_order(records, 17)
    issued = _issued_offsets(ctx.raw_dir / f"{cell.key}-{op}.fio")
    assert [o // 4096 for o in issued] == expected


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
