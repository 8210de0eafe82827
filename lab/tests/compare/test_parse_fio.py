"""fio JSON parsing: constructed documents with known values, and a real fio run."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from zbdlab.parsers import InputError, load_set
from zbdlab.parsers.fio import fio_samples, parse_size_bytes
from zbdlab.parsers.model import CellKey

from .conftest import fio_document, fio_job


def test_parse_fio_sizes() -> None:
    assert parse_size_bytes("4k") == 4096
    assert parse_size_bytes("1g") == 1024**3
    assert parse_size_bytes("64M") == 64 * 1024**2
    assert parse_size_bytes("4096") == 4096
    assert parse_size_bytes("4k-16k") == 4096
    assert parse_size_bytes(None) is None


def test_parse_fio_known_values(tmp_path: Path) -> None:
    doc = fio_document(
        [
            fio_job("w", "randwrite", "4k", "64m", 10 * 1048576, "write", p50_ns=3000),
            fio_job("r", "read", "128k", "1g", 200 * 1048576, "read"),
        ]
    )
    path = tmp_path / "run1.json"
    path.write_text("note: fio printed this first\n" + json.dumps(doc))
    samples, warnings = fio_samples(path, "r1")
    by_cell = {s.cell: s for s in samples}
    write = by_cell[CellKey("random_write", 64 * 1024, 4)]
    assert write.value == pytest.approx(10.0)
    assert write.metrics["latency_p50_us"] == pytest.approx(3.0)
    assert write.metrics["latency_p999_us"] == pytest.approx(27.0)
    # 40 % CPU of 1 s for 64 MiB moved
    assert write.metrics["cpu_s_per_gb"] == pytest.approx(0.4 / (64 * 1024 * 1024 / 1e9))
    assert by_cell[CellKey("read", 1024 * 1024, 128)].value == pytest.approx(200.0)
    assert warnings == []


def test_parse_fio_truncated_json_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(fio_document([fio_job("w", "write", "4k", "1m", 1.0, "write")]))[:50])
    with pytest.raises(InputError, match="not valid JSON"):
        fio_samples(path, "r")


def test_parse_real_fio_output(tmp_path: Path) -> None:
    fio = shutil.which("fio")
    if fio is None:
        print("SKIP reason: fio not installed")
        pytest.skip("fio not installed")
    runs = tmp_path / "runs"
    runs.mkdir()
    for index in range(2):
        subprocess.run(
            [
                fio,
                "--name=seqw",
                f"--filename={tmp_path / 'data'}",
                "--rw=write",
                "--bs=64k",
                "--size=2m",
                "--refill_buffers",
                "--buffer_compress_percentage=50",
                "--buffer_compress_chunk=4k",
                "--output-format=json",
                f"--output={runs / f'run{index}.json'}",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
    data = load_set("fio", runs)
    assert data.kind == "fio"
    assert len(data.runs) == 2
    cells = {s.cell for s in data.samples}
    assert cells == {CellKey("write", 2048, 64)}
    for sample in data.samples:
        document = json.loads((runs / sample.run.split(":", 1)[1]).read_text())
        assert sample.value == pytest.approx(document["jobs"][0]["write"]["bw_bytes"] / 1048576)
