"""The fio layer: job files carry explicit data settings, the JSON parser agrees with a real fio run
saved during the test, and the data written is as compressible as declared."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import lz4.block
import pytest
import zstandard

from zbdlab.workloads import from_config
from zbdlab.workloads.base import DataSpec, WorkloadError
from zbdlab.workloads.fio import JobFile, data_options, load_fio_json, measurement, run_fio, summarize


def chunk_ratio(path: Path, compress, unit: int = 4096) -> float:  # type: ignore[no-untyped-def]
    data = path.read_bytes()
    stored = sum(min(unit, len(compress(data[i : i + unit]))) for i in range(0, len(data), unit))
    return len(data) / stored


def test_wl_data_options_are_explicit_and_refuse_non_synthetic_data() -> None:
    options = data_options(DataSpec("synthetic", 60))
    assert options == {
        "refill_buffers": 1,
        "buffer_compress_percentage": 60,
        "buffer_compress_chunk": "4k",
        "fallocate": "none",
    }
    assert "dedupe_percentage" not in options  # no dedup declared: fio's default (all unique)
    dedup = data_options(DataSpec("synthetic", 60, dedupe_percentage=25))
    assert dedup == {**options, "dedupe_percentage": 25, "dedupe_mode": "repeat"}
    with pytest.raises(WorkloadError, match="synthetic data only"):
        data_options(DataSpec("corpus", corpus_dir=Path("/x")))
    job = JobFile({"thread": True, "bs": "4k", **options})
    job.add("a", {"stonewall": True, "rw": "read", "skipped": None})
    assert job.render().splitlines()[1:] == [
        "[global]", "thread", "bs=4k", "refill_buffers=1", "buffer_compress_percentage=60",
        "buffer_compress_chunk=4k", "fallocate=none", "", "[a]", "stonewall", "rw=read",
    ]  # fmt: skip


def test_wl_parser_matches_a_real_fio_run(tmp_path: Path) -> None:
    """Two stonewalled groups, one with two jobs: bytes and I/O counts are what the jobs asked for, the
    runtime is the sum over groups, and percentiles from merged bins match fio's own for one job."""
    job = tmp_path / "parse.fio"
    job.write_text(
        f"[global]\ndirectory={tmp_path}\nioengine=psync\nthread\nbs=4k\nrefill_buffers=1\n"
        "buffer_compress_percentage=50\nbuffer_compress_chunk=4k\nfallocate=none\n"
        "[w]\nrw=write\nsize=2m\nnumjobs=2\n[r]\nstonewall\nrw=randread\nsize=1m\nfilename_format=w.0.0\n"
    )
    out = tmp_path / "parse.json"
    subprocess.run(["fio", "--output-format=json+", f"--output={out}", str(job)], check=True)
    doc = load_fio_json(out)
    summary = summarize(doc)
    assert summary.directions["write"].io_bytes == 2 * (2 << 20)
    assert summary.directions["write"].total_ios == 2 * 512
    assert summary.directions["read"].io_bytes == 1 << 20
    assert summary.directions["read"].total_ios == 256
    groups: dict[int, int] = {}
    for j in doc["jobs"]:
        groups[j["groupid"]] = max(groups.get(j["groupid"], 0), j["job_runtime"])
    assert summary.elapsed_s == pytest.approx(sum(groups.values()) / 1000)
    reader = next(j for j in doc["jobs"] if j["jobname"] == "r")
    fio_p = reader["read"]["clat_ns"]["percentile"]
    for p in (50.0, 99.0):
        assert summary.directions["read"].percentile_us(p) == pytest.approx(
            fio_p[f"{p:.6f}"] / 1000, rel=0.02
        )
    assert sum(summary.directions["write"].bins.values()) == 1024


def test_wl_fio_failure_and_garbage_output_are_clear_errors(tmp_path: Path, make_ctx) -> None:  # type: ignore[no-untyped-def]
    ctx, _ = make_ctx(tmp_path, DataSpec("synthetic", 50))
    job = JobFile({"ioengine": "no-such-engine", **data_options(ctx.data)})
    job.add("bad", {"rw": "read", "size": "4k", "filename": str(tmp_path / "f")})
    with pytest.raises(WorkloadError, match=r"fio failed \(exit"):
        run_fio(job, "bad", ctx, "read")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("fio: note\n{ not json")
    with pytest.raises(WorkloadError, match="not valid JSON"):
        load_fio_json(garbage)
    garbage.write_text(json.dumps({"jobs": []}))
    with pytest.raises(WorkloadError, match="no jobs"):
        load_fio_json(garbage)


@pytest.mark.parametrize(("percentage", "low", "high"), [(75, 3.3, 4.4), (0, 0.99, 1.02)])
def test_wl_written_data_compresses_as_declared(
    ext4_dir: Path,
    make_ctx,
    percentage: int,
    low: float,
    high: float,  # type: ignore[no-untyped-def]
) -> None:
    """Read back what the iozone write wrote and compress it in 4 KiB units: 75 % -> about 4:1,
    0 % -> incompressible (fio's default buffers would give about 11:1)."""
    workload = from_config("iozone", {"file_sizes": ["4M"], "record_sizes": ["64K"], "operations": ["write"]})
    workload.keep_files = True  # type: ignore[attr-defined]
    ctx, _ = make_ctx(ext4_dir, DataSpec("synthetic", percentage))
    (m,) = workload.execute(workload.cells()[0], ctx)
    written = ext4_dir / "iozone" / "iozone.0"
    assert m.logical_bytes_written == written.stat().st_size == 4 << 20
    zstd = zstandard.ZstdCompressor(level=3).compress
    for compress in (zstd, lambda b: lz4.block.compress(b, store_size=False)):
        assert low <= chunk_ratio(written, compress) <= high
    text = (ctx.raw_dir / f"{workload.cells()[0].key}-write.fio").read_text()
    assert f"buffer_compress_percentage={percentage}" in text and "refill_buffers=1" in text


def test_wl_measurement_sums_sequential_runs(tmp_path: Path, make_ctx) -> None:  # type: ignore[no-untyped-def]
    ctx, hooks = make_ctx(tmp_path, DataSpec("synthetic", 50))
    runs = []
    for i in range(2):
        job = JobFile({"ioengine": "psync", "thread": True, "bs": "4k", **data_options(ctx.data)})
        job.add("w", {"rw": "write", "size": "256k", "filename": str(tmp_path / f"m{i}")})
        runs.append(run_fio(job, f"m{i}", ctx, f"op{i}"))
    m = measurement("write", runs, ("write",))
    assert m.logical_bytes_written == 2 * 256 * 1024 and m.logical_bytes_read == 0
    assert m.elapsed_s == pytest.approx(sum(summarize(r.doc).elapsed_s for r in runs))
    assert len(m.commands) == 2 and all(c[0] == "fio" for c in m.commands)
    assert all(p.exists() for p in m.raw_files)
    assert hooks.calls == ["before:op0", "after:op0", "before:op1", "after:op1"]


@pytest.mark.parametrize(("compress", "dedup", "declared"), [(0, 50, 2.0), (50, 75, 4.0)])
def test_wl_written_data_deduplicates_as_declared(
    ext4_dir: Path,
    make_ctx,
    compress: int,
    dedup: int,
    declared: float,  # type: ignore[no-untyped-def]
) -> None:
    """Read back an iozone write of 4 KiB records and hash its 4 KiB blocks: dedupe_percentage=p makes
    about p % of them repeat an earlier block (ratio 100/(100-p)), and the unique blocks keep the
    declared compressibility."""
    workload = from_config("iozone", {"file_sizes": ["8M"], "record_sizes": ["4K"], "operations": ["write"]})
    workload.keep_files = True  # type: ignore[attr-defined]
    data = DataSpec("synthetic", compress, dedupe_percentage=dedup)
    assert data.declared_dedup_ratio == declared
    ctx, _ = make_ctx(ext4_dir, data)
    workload.execute(workload.cells()[0], ctx)
    raw = (ext4_dir / "iozone" / "iozone.0").read_bytes()
    blocks = [raw[i : i + 4096] for i in range(0, len(raw), 4096)]
    unique = {hashlib.sha256(b).digest(): b for b in blocks}
    assert len(blocks) == 2048
    # binomial over 2048 blocks: the standard deviation of the ratio is about 2 % (2:1) and 4 % (4:1)
    assert len(blocks) / len(unique) == pytest.approx(declared, rel=0.15)
    zstd = zstandard.ZstdCompressor(level=3).compress
    stored = sum(min(4096, len(zstd(b))) for b in unique.values())
    assert len(unique) * 4096 / stored == pytest.approx(100 / (100 - compress), rel=0.12)
    text = (ctx.raw_dir / f"{workload.cells()[0].key}-write.fio").read_text()
    assert f"dedupe_percentage={dedup}" in text and f"buffer_compress_percentage={compress}" in text
