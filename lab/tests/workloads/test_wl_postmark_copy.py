"""PostMark (the real binary) and the copy workload (dd, cp -a, tar) on real filesystems."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import zstandard

from zbdlab.workloads import from_config
from zbdlab.workloads.base import DataSpec, WorkloadError
from zbdlab.workloads.postmark import DATA_LABEL, parse_report


def test_wl_postmark_runs_and_its_report_parses(tmp_path: Path, make_ctx) -> None:  # type: ignore[no-untyped-def]
    """The filesystem does not matter here, so a temporary directory will do."""
    table = {"number": 40, "transactions": 300, "size_low": "1K", "size_high": "16K", "subdirectories": 3,
             "read_block": "4K", "write_block": "4K", "buffering": False, "seed": 7}  # fmt: skip
    workload = from_config("postmark", table)
    (cell,) = workload.cells()
    mount = tmp_path / "mnt"
    mount.mkdir()
    ctx, hooks = make_ctx(mount, DataSpec("tool"))
    (m,) = workload.execute(cell, ctx)
    assert hooks.calls == ["before:postmark", "after:postmark"]
    assert m.data_label == DATA_LABEL
    config = next(ctx.raw_dir.glob("*.cfg")).read_text()
    for line in ("set number 40", "set size 1024 16384", "set subdirectories 3", "set buffering false",
                 f"set location {mount / 'postmark'}", "set read 4096"):  # fmt: skip
        assert line in config.splitlines()
    output = next(ctx.raw_dir.glob("*.out")).read_text()
    report = parse_report(output)  # the report saved by this very run
    pm = m.extra["postmark"]
    assert pm["files_created"] == report.files_created >= 40  # the base set at least
    assert pm["files_created"] == pm["files_deleted"]  # it cleans up what it made
    assert pm["files_read"] + pm["files_appended"] == 300  # each transaction reads or appends once
    assert m.logical_bytes_written == report.bytes_written > 40 * 1024  # at least the base files' bytes
    assert m.logical_bytes_read == report.bytes_read
    assert m.iops == report.transactions_per_s > 0
    assert m.elapsed_s and m.elapsed_s > 0
    assert not (mount / "postmark").exists()


def test_wl_postmark_parser_names_what_is_missing() -> None:
    report = """Time:
\t3 seconds total
\t2 seconds of transactions (250 per second)

Files:
\t1203 created (401 per second)
\t604 read (201 per second)
\t596 appended (198 per second)
\t1203 deleted (401 per second)

Data:
\t3.12 megabytes read (1.04 megabytes per second)
\t512.50 kilobytes written (170.83 kilobytes per second)
"""
    parsed = parse_report(report)
    assert (parsed.total_s, parsed.transaction_s, parsed.transactions_per_s) == (3, 2, 250.0)
    assert parsed.bytes_read == round(3.12 * 2**20) and parsed.bytes_written == round(512.5 * 1024)
    assert parsed.files_appended == 596
    with pytest.raises(WorkloadError, match="data written"):
        parse_report(report.replace("written", "scribbled"))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_wl_copy_dd_writes_the_declared_data(ext4_dir: Path, make_ctx) -> None:  # type: ignore[no-untyped-def]
    workload = from_config(
        "copy", {"operations": ["dd"], "dd_size": "8M", "dd_block": "256K", "keep_files": True}
    )
    ctx, hooks = make_ctx(ext4_dir, DataSpec("synthetic", 50))
    (m,) = workload.execute(workload.cells()[0], ctx)
    assert hooks.calls == ["before:copy_dd", "after:copy_dd"]  # staging the source is not measured
    target = ext4_dir / "copy" / "dd.bin"
    assert m.logical_bytes_written == target.stat().st_size == 8 << 20
    assert "conv=fsync" in m.commands[0] and m.commands[0][0] == "dd"
    data = target.read_bytes()
    zstd = zstandard.ZstdCompressor(level=3)
    stored = sum(min(4096, len(zstd.compress(data[i : i + 4096]))) for i in range(0, len(data), 4096))
    assert 1.8 < len(data) / stored < 2.2  # 50 % compressible -> about 2:1


def _small_tree(root: Path) -> Path:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "text.txt").write_text("corpus text\n" * 500)
    (root / "a" / "b" / "blob.bin").write_bytes(os.urandom(70_000))
    (root / "top.csv").write_text("x,y\n1,2\n")
    (root / "link").symlink_to("top.csv")
    return root


@pytest.mark.parametrize("method", ["cp", "tar"])
def test_wl_copy_tree_copies_the_corpus_exactly(
    ext4_dir: Path, tmp_path: Path, make_ctx, method: str
) -> None:  # type: ignore[no-untyped-def]
    source = _small_tree(tmp_path / "corpus")
    workload = from_config("copy", {"operations": ["tree"], "tree_method": method, "keep_files": True})
    ctx, _ = make_ctx(ext4_dir, DataSpec("corpus", corpus_dir=source))
    (m,) = workload.execute(workload.cells()[0], ctx)
    copied = ext4_dir / "copy" / "tree"
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file() and not p.is_symlink())
    assert m.extra["files"] == len(files) == 3
    assert m.logical_bytes_written == sum((source / f).stat().st_size for f in files)
    for f in files:
        assert _sha(copied / f) == _sha(source / f)
    assert (copied / "link").is_symlink()
    assert m.commands[-1][:2] == ["sync", "-f"]


def test_wl_copy_refuses_data_it_cannot_write(tmp_path: Path, make_ctx) -> None:  # type: ignore[no-untyped-def]
    ctx, _ = make_ctx(tmp_path, DataSpec("tool"))
    with pytest.raises(WorkloadError, match="needs corpus data"):
        from_config("copy", {"operations": ["tree"]}).execute(from_config("copy", {}).cells()[0], ctx)
    with pytest.raises(WorkloadError, match="synthetic or corpus"):
        from_config("copy", {"operations": ["dd"], "dd_size": "1M"}).execute(
            from_config("copy", {}).cells()[0], ctx
        )
