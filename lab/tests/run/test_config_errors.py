"""Broken study files: one line naming the key and the problem, exit code 2, never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import zbdlab_argv, zbdlab_env

from zbdlab.cli import main
from zbdlab.config import parse_study

GOOD_TARGETS = """
[[targets]]
name = "ext4"
fs = "ext4"

[[targets]]
name = "btrfs-zstd"
fs = "btrfs"
compress = "zstd:3"
"""
WORKLOAD = """
[workloads.tiny]
kind = "custom"
factory = "run_tinyload:make"
"""


def study(body: str = GOOD_TARGETS, head: str = "version = 1", workloads: str = WORKLOAD) -> str:
    return f"{head}\n{body}\n{workloads}"


CASES = [
    (
        study('[[targets]]\nname = "t"\nfs = "ext4"\nthrottle = { rate = "fast" }\n'),
        "study.toml: targets[0].throttle.rate: expected bytes per second such as '100M', got 'fast'",
    ),
    (
        study('[[targets]]\nname = "t"\nfs = "ext4"\nthrottle = { latency = "0.5ms" }\n'),
        "study.toml: targets[0].throttle.latency: nbdkit delays by whole milliseconds, got '0.5ms'",
    ),
    (
        study('[[targets]]\nname = "t"\nfs = "ext4"\nthrottle = { rate = "1M", burst = 2 }\n'),
        "study.toml: targets[0].throttle.burst: unknown key (expected one of latency, rate)",
    ),
    (
        study('[[targets]]\nname = "t"\nfs = "ext4"\nthrottle = {}\n'),
        "study.toml: targets[0].throttle: sets neither rate nor latency",
    ),
    (
        study(GOOD_TARGETS + '[[targets]]\nname = "bad"\nfs = "ext5"\n'),
        "study.toml: targets[2].fs: unknown filesystem 'ext5' (expected ext4, xfs, btrfs, zfs)",
    ),
    (study(head=""), "study.toml: version: missing (expected version = 1)"),
    (study(head="version = 9"), "study.toml: version: unsupported study version 9 (this zbdlab reads 1)"),
    ("version = 1\n[[targets]\n", "study.toml: not valid TOML"),
    (
        study('[[targets]]\nname = "e"\nfs = "ext4"\ncompress = "zstd"\n'),
        "study.toml: targets[0].compress: only btrfs",
    ),
    (
        study('[[targets]]\nname = "r"\nfs = "btrfs"\ndevices = 2\nraid = "raid10"\n'),
        "study.toml: targets[0].raid: raid10 needs at least 4 devices, got 2",
    ),
    (
        study('[[targets]]\nname = "b"\nfs = "btrfs"\ncompress = "zstd:99"\n'),
        "study.toml: targets[0].compress: unknown btrfs compression 'zstd:99'",
    ),
    (
        study('[[targets]]\nname = "z"\nfs = "zfs"\nlayout = "mirror"\n'),
        "study.toml: targets[0].layout: mirror needs at least 2 devices, got 1",
    ),
    (
        study('[[targets]]\nname = "z"\nfs = "zfs"\ncompresion = "gzip"\n'),
        "study.toml: targets[0].compresion: unknown key",
    ),
    (
        study('[[targets]]\nname = "d"\nfs = "ext4"\ndevice = "/dev/sdb"\n'),
        "study.toml: targets[0].device: a real device is used only with allow_real_device = true",
    ),
    (
        study('[[targets]]\nname = "s"\nfs = "ext4"\nsize = "lots"\n'),
        "study.toml: targets[0].size: not a size: 'lots'",
    ),
    (
        study(GOOD_TARGETS + '[[targets]]\nname = "ext4"\nfs = "xfs"\n'),
        "study.toml: targets[2].name: duplicate name",
    ),
    (
        study('[[targets]]\nname = "z"\nfs = "ext4"\n[targets.zbd]\ncodec = "brotli"\n'),
        "study.toml: targets[0].zbd.codec: unknown codec 'brotli'",
    ),
    (
        study(workloads='[workloads.w]\nkind = "bonnie"\n'),
        "study.toml: workloads.w.kind: unknown workload kind 'bonnie'",
    ),
    (
        study(workloads='[workloads.w]\nkind = "custom"\nfactory = "no_such_module:make"\n'),
        "study.toml: workloads.w.factory: cannot import 'no_such_module'",
    ),
    (
        study(head='version = 1\ncache = "lukewarm"'),
        "study.toml: cache: unknown value 'lukewarm' (expected cold, warm)",
    ),
    (study(head="version = 1\nrepetitions = 0"), "study.toml: repetitions: must be at least 1, got 0"),
    (study(body=""), "study.toml: targets: missing"),
    (
        study('[[targets]]\nname = "x"\nfs = "xfs"\nsize = "128M"\n'),
        "study.toml: targets[0].size: xfs needs at least 300M per device",
    ),
    (
        study(head="version = 1\n[data]\ndedupe_percentage = 101"),
        "study.toml: data.dedupe_percentage: must be at most 100, got 101",
    ),
    (
        study(workloads=WORKLOAD + "[workloads.tiny.data]\ndedupe_percentage = -5\n"),
        "study.toml: workloads.tiny.data.dedupe_percentage: must be at least 0, got -5",
    ),
    (
        study(head='version = 1\n[data]\ndedupe_percentage = "half"'),
        "study.toml: data.dedupe_percentage: expected an integer, got 'half'",
    ),
    (
        study(head='version = 1\n[data]\nkind = "tool"\ndedupe_percentage = 50'),
        "study.toml: data.dedupe_percentage: applies to synthetic data only, not kind 'tool'",
    ),
    (
        study(GOOD_TARGETS + '[[targets]]\nname = "t"\nfs = "ext4"\ntransport = "qemu"\n'),
        "study.toml: targets[2].transport: unknown value 'qemu' (expected nbdkit)",
    ),
    (
        study(GOOD_TARGETS + '[[targets]]\nname = "t"\nfs = "ext4"\ntransport = "nbdkit"\n[targets.zbd]\n'),
        "study.toml: targets[2].transport: a transport baseline is one kernel filesystem on one plain NBD "
        "export (no zbd)",
    ),
]


@pytest.mark.parametrize(("text", "message"), CASES, ids=[m.split(":")[1].strip() for _, m in CASES])
def test_broken_study_names_key_and_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "study.toml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["run", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, "one line"
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists(), "nothing is created for a broken study"


def test_exit_code_2_from_the_real_command(tmp_path: Path) -> None:
    path = tmp_path / "study.toml"
    path.write_text(study(GOOD_TARGETS + '[[targets]]\nname = "bad"\nfs = "ext5"\n'))
    proc = subprocess.run(zbdlab_argv("run", str(path)), env=zbdlab_env(), capture_output=True, text=True)
    assert proc.returncode == 2
    assert "targets[2].fs: unknown filesystem 'ext5'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_good_study_parses_with_defaults() -> None:
    s = parse_study(study())
    assert (s.repetitions, s.cache, s.format, s.measures) == (5, "cold", "repetition", "disk")
    assert [t.compression_label for t in s.targets] == ["off", "btrfs:zstd:3"]
    assert s.workloads[0].data.declared_ratio == 2.0
    assert (s.workloads[0].data.dedupe_percentage, s.workloads[0].data.declared_dedup_ratio) == (0, 1.0)


def test_dedupe_percentage_is_inherited_and_overridden_per_workload() -> None:
    s = parse_study(
        study(
            head="version = 1\n[data]\ncompress_percentage = 50\ndedupe_percentage = 50",
            workloads=WORKLOAD + "[workloads.four]\nkind = 'custom'\nfactory = 'run_tinyload:make'\n"
            "[workloads.four.data]\ndedupe_percentage = 75\n",
        )
    )
    tiny, four = s.workloads
    assert (tiny.data.declared_dedup_ratio, tiny.data.label) == (2.0, "synthetic:50:dedup50")
    assert (four.data.declared_dedup_ratio, four.data.label) == (4.0, "synthetic:50:dedup75")


@pytest.mark.needs_root
def test_zfs_lz4_without_kernel_zfs_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    if Path("/sys/module/zfs").exists():
        reason = "kernel ZFS present: lz4 is available"
        print(f"SKIP reason: {reason}")
        pytest.skip(reason)
    path = tmp_path / "study.toml"
    path.write_text(study('[[targets]]\nname = "z"\nfs = "zfs"\ncompression = "lz4"\n'))
    result = CliRunner().invoke(main, ["run", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "study.toml: targets[0].compression: lz4 needs kernel ZFS" in result.output
    assert not (tmp_path / "out").exists()
