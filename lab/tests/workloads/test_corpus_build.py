"""The corpus: generated data is deterministic, downloads are verified by sha256 (a tampered cache is
re-fetched, a wrong pin is refused), and the ratio report measures what it says."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from zbdlab.cli import main
from zbdlab.corpus import CorpusError, data_dir, pins
from zbdlab.corpus.build import build
from zbdlab.corpus.fetch import FIXED_MTIME, fetch, sha256_file
from zbdlab.corpus.generate import generate
from zbdlab.corpus.ratios import measure_files

TINY = 1 << 20


def test_corpus_generated_part_is_deterministic(tmp_path: Path) -> None:
    first = build(tmp_path / "a", "small", tmp_path / "cache", pin_list=(), generated_bytes=TINY)
    second = build(tmp_path / "b", "small", tmp_path / "cache", pin_list=(), generated_bytes=TINY)
    assert first.manifest == second.manifest
    assert (tmp_path / "a" / "SHA256SUMS").read_bytes() == (tmp_path / "b" / "SHA256SUMS").read_bytes()
    paths = [f["path"] for f in first.manifest["files"]]  # type: ignore[union-attr]
    assert paths == ["generated/csv/sensors.csv", "generated/json/events.jsonl",
                     "generated/logs/access.log", "generated/sqlite/shop.sqlite"]  # fmt: skip
    data = data_dir(tmp_path / "a")
    for f in first.manifest["files"]:  # type: ignore[union-attr]
        path = data / f["path"]
        assert sha256_file(path) == f["sha256"] and path.stat().st_size == f["size"]
        assert path.stat().st_mtime == FIXED_MTIME
    db = sqlite3.connect(data / "generated/sqlite/shop.sqlite")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("SELECT count(*) FROM orders").fetchone()[0] > 1000
    finally:
        db.close()
    assert (data / "generated/logs/access.log").stat().st_size == int(TINY * 0.3)


def test_corpus_seed_changes_the_data(tmp_path: Path) -> None:
    """The determinism check above can fail: another seed gives other bytes."""
    generate(tmp_path / "a", TINY, seed=1)
    generate(tmp_path / "b", TINY, seed=2)
    a = sha256_file(tmp_path / "a" / "logs" / "access.log")
    assert a != sha256_file(tmp_path / "b" / "logs" / "access.log")


def test_corpus_download_is_verified_and_a_tampered_cache_is_refetched(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    messages: list[str] = []
    path = fetch(pins.SIX, cache, messages.append)
    assert sha256_file(path) == pins.SIX.sha256
    assert any("downloading" in m for m in messages)
    with path.open("r+b") as f:  # flip one byte in the cached copy
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
    messages.clear()
    again = fetch(pins.SIX, cache, messages.append)
    assert sha256_file(again) == pins.SIX.sha256
    assert any("fetching again" in m for m in messages)
    messages.clear()
    fetch(pins.SIX, cache, messages.append)  # a good cached copy is used as it is
    assert messages == []


def test_corpus_wrong_pin_is_refused_and_not_kept(tmp_path: Path) -> None:
    wrong = dataclasses.replace(pins.SIX, sha256="0" * 64)
    with pytest.raises(CorpusError, match=r"six-1\.16\.0.*has sha256 8abb2f1d.*expected 0{64}"):
        fetch(wrong, tmp_path)
    assert not list((tmp_path / "downloads").iterdir())


def test_corpus_unreachable_url_is_a_clear_error(tmp_path: Path) -> None:
    gone = dataclasses.replace(pins.SIX, url="http://127.0.0.1:9/six.whl")
    with pytest.raises(
        CorpusError, match="downloading six-1.16.0-py2.py3-none-any.whl from http://127.0.0.1:9"
    ):
        fetch(gone, tmp_path)


def test_corpus_build_unpacks_pins_and_reports_ratios(tmp_path: Path) -> None:
    archive = dataclasses.replace(pins.SIX, group="compressed", name="six-wheel", extract=False)
    result = build(
        tmp_path / "c", "small", tmp_path / "cache", pin_list=(pins.SIX, archive), generated_bytes=TINY
    )
    data = data_dir(tmp_path / "c")
    assert (data / "pypi-text/six-1.16.0/six.py").is_file()
    assert sha256_file(data / "compressed/six-wheel/six-1.16.0-py2.py3-none-any.whl") == pins.SIX.sha256
    report = json.loads((tmp_path / "c" / "compression.json").read_text())
    by_part = {p["part"]: p for p in report["parts"]}
    assert set(by_part) == {"pypi-text/six-1.16.0", "compressed/six-wheel", "generated/sqlite",
                            "generated/logs", "generated/csv", "generated/json"}  # fmt: skip
    assert by_part["compressed/six-wheel"]["ratio"]["zstd-3@4096"] < 1.05  # a zip does not compress
    assert by_part["pypi-text/six-1.16.0"]["ratio"]["zstd-3@131072"] > 2.0  # Python source does
    logs = by_part["generated/logs"]["ratio"]
    assert logs["zstd-3@131072"] > logs["zstd-3@4096"]  # bigger units find more redundancy
    assert len(result.manifest["pins"]) == 2  # type: ignore[arg-type]


def test_corpus_ratios_of_known_data(tmp_path: Path) -> None:
    zeros = tmp_path / "zeros"
    zeros.write_bytes(bytes(256 * 1024))
    noise = tmp_path / "noise"
    noise.write_bytes(os.urandom(256 * 1024))
    half = tmp_path / "half"  # every 4 KiB: 2 KiB random + 2 KiB zeros
    half.write_bytes(b"".join(os.urandom(2048) + bytes(2048) for _ in range(64)))
    assert measure_files("zeros", [zeros]).ratio("lz4", 4096) > 50
    for codec in ("lz4", "zstd-3", "zlib-6"):
        for unit in (4096, 131072):
            assert measure_files("noise", [noise]).ratio(codec, unit) == 1.0  # stored raw, never worse
            assert 1.8 < measure_files("half", [half]).ratio(codec, unit) < 2.05


def test_corpus_cli_refuses_a_foreign_directory_and_builds_a_small_corpus(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    runner = CliRunner()
    result = runner.invoke(main, ["corpus", "build", "-o", str(foreign)])
    assert result.exit_code == 1
    assert "holds no corpus manifest" in result.output
    assert (foreign / "precious.txt").read_text() == "keep me"
    out = tmp_path / "small"
    result = runner.invoke(main, ["corpus", "build", "-o", str(out), "--size", "small"])
    assert result.exit_code == 0, result.output
    assert "generated/logs" in result.output and "zstd-3" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["size"] == "small" and 20 << 20 < manifest["total_bytes"] < 60 << 20
    sums = (out / "SHA256SUMS").read_text().splitlines()
    assert len(sums) == len(manifest["files"])
    first = manifest["files"][0]
    assert sums[0] == f"{first['sha256']}  {first['path']}"
    assert hashlib.sha256((out / "data" / first["path"]).read_bytes()).hexdigest() == first["sha256"]
