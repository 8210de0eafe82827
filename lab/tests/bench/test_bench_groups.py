"""What the groups build from measurements (no tool runs): figures, fio jobs, the fs study file,
and the results directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zbdlab.bench import engine, fs, nbd, report, scripts
from zbdlab.bench.core import Figure, Goal, Rounds
from zbdlab.bench.report import write_results
from zbdlab.bench.settings import Settings
from zbdlab.config import parse_study
from zbdlab.stats.compare import Options


def test_engine_figures_compare_with_codec_times_threads_and_one_thread() -> None:
    rounds = Rounds(["lz4/1t", "lz4/2t"])
    for r in range(5):
        rounds.add(
            r,
            "lz4/1t",
            {"write_mb_s": 400, "read_mb_s": 1000, "codec_compress_mb_s": 500, "codec_decompress_mb_s": 2000},
        )
        rounds.add(
            r,
            "lz4/2t",
            {"write_mb_s": 720, "read_mb_s": 1500, "codec_compress_mb_s": 500, "codec_decompress_mb_s": 2000},
        )
    figs = {f.name: f.compute(Options()) for f in engine.figures(rounds)}
    two = figs["lz4 write, 2 thread(s) / (lz4 alone x 2)"]
    assert two.ratio == 720 / 1000 and two.verdict == "miss"
    assert figs["lz4 write, 2 threads / 1 thread"].ratio == 720 / 400
    assert figs["lz4 write, 2 threads / 1 thread"].verdict == "pass"
    assert figs["lz4 read, 2 threads / 1 thread"].verdict == "miss"  # 1.5 < 1.7


def test_fio_jobs_set_data_flush_and_halves() -> None:
    target = {"ioengine": "nbd", "uri": "nbd+unix:///?socket=/s"}
    write = nbd.fio_job(nbd.TEST_BY_KEY["seq_write"], 1 << 30, 5, target).render()
    for line in (
        "end_fsync=1",
        "refill_buffers=1",
        "buffer_compress_percentage=50",
        "buffer_compress_chunk=4k",
        "numjobs=2",
        f"size={1 << 29}",
        f"offset_increment={1 << 29}",
        "ioengine=nbd",
    ):
        assert line in write.splitlines()
    assert "time_based" not in write
    rand = nbd.fio_job(nbd.TEST_BY_KEY["randread_qd16"], 1 << 30, 5, target).render().splitlines()
    assert "time_based" in rand and "runtime=5" in rand and "iodepth=16" in rand
    assert "end_fsync=1" not in rand


def test_nbd_figures_attach_goals_and_zbd_ratio() -> None:
    rounds = Rounds([*nbd.ZBD_CODECS, *nbd.BASELINES])
    for r in range(5):
        for arm in rounds.arms:
            metrics = {t.key: 100.0 for t in nbd.TESTS}
            metrics["zbd_ratio"] = 2.0 if arm.startswith("zbd") else float("nan")
            rounds.add(r, arm, metrics)
    figs = {f.name: f for f in nbd.figures("nbd-fast", rounds, rounds.arms)}
    fig = figs["1 MiB seq write: zbd-lz4 / zbd-none"]
    assert fig.goal == Goal(at_least=0.8) and fig.note == "zbd ratio 2.00:1"
    assert figs["1 MiB seq read: nbdkit / qemu-nbd"].goal is None


def test_fs_study_parses_and_has_the_like_for_like_targets() -> None:
    study = parse_study(fs.study_text(Settings.quick(), tree_source="/usr"))
    kinds = {t.name: t.kind for t in study.targets}
    assert kinds["ext4-on-nbdkit"] == "ext4-on-nbdkit"
    assert kinds["ext4-on-zbd-zstd1"] == "ext4-on-zbd"
    btrfs = {t.name: (t.compress, t.compress_force) for t in study.targets if t.fs == "btrfs"}
    assert btrfs == {
        "btrfs-lzo": ("lzo", False),
        "btrfs-force-lzo": ("lzo", True),
        "btrfs-zstd1": ("zstd:1", False),
        "btrfs-force-zstd1": ("zstd:1", True),
    }
    assert study.repetitions == Settings.quick().rounds and study.cache == "cold"


def _row(target: str, rep: int, op: str, mb_s: float, allocated: int) -> dict[str, object]:
    return {
        "target": target,
        "repetition": rep,
        "operation": op,
        "throughput_bytes_per_s": mb_s * 1e6,
        "cpu_user_s": 1.0,
        "cpu_system_s": 0.5,
        "backing_bytes_written": 1000,
        "compression_ratio": 2.0,
        "extra": {"backing_allocated_bytes": allocated},
    }


def test_fs_runs_become_rounds_and_figures() -> None:
    rows = []
    for rep in (1, 2, 3):
        rows.append(_row("ext4-on-nbdkit", rep, "copy_tree", 100, 4000))
        rows.append(_row("ext4-on-zbd-lz4", rep, "copy_tree", 90, 2000))
        rows.append(_row("btrfs-lzo", rep, "copy_tree", 150, 2500))
    rounds = fs.rounds_from_runs(rows)
    assert rounds.get("ext4-on-zbd-lz4", "copy_tree_cpu_s") == [1.5, 1.5, 1.5]
    figs = {f.name: f.compute(Options()) for f in fs.figures(rounds)}
    speed = figs["tree copy (through sync), speed: ext4-on-zbd-lz4 / ext4-on-nbdkit"]
    assert speed.ratio == 0.9 and speed.verdict == "pass"
    space = figs["tree copy (through sync), space after fstrim: ext4-on-zbd-lz4 / btrfs-lzo"]
    assert space.ratio == 0.8
    table = fs.space_table(rounds)
    assert any(line.startswith("| ext4-on-zbd-lz4 | 0 | 2.00 | 90 |") for line in table)


def test_results_directory_holds_summary_figures_and_environment(tmp_path: Path) -> None:
    figs = [
        Figure("engine", "lz4 write", [90.0] * 5, [100.0] * 5, goal=Goal(at_least=0.8)),
        Figure("engine", "lz4 read", [50.0] * 5, [100.0] * 5, goal=Goal(at_least=0.8)),
    ]
    for f in figs:
        f.compute(Options())
    env = {
        "cpu_model": "Test CPU",
        "cpu_count": 2,
        "mem_total_bytes": 2**34,
        "kernel": "6.1",
        "tools": {"zbd": "zbd 0.1", "fio": "fio-3.33"},
        "date": "2026-01-01",
        "repo_commit": "abc1234",
    }
    summary = write_results(tmp_path, figs, env, {"rounds": 5}, ["a note"], {"engine": ["| a table |"]})
    text = summary.read_text()
    assert "Test CPU, 2 cores, 16.0 GiB RAM, kernel 6.1" in text
    assert "1 pass, 1 miss (each also in its group below)" in text
    assert "| lz4 read | 0.50 | 0.50-0.50 | >= 0.8 | **miss** |" in text
    assert "| a table |" in text and "- a note" in text
    doc = json.loads((tmp_path / "figures.json").read_text())
    assert [f["verdict"] for f in doc["figures"]] == ["pass", "miss"]
    assert doc["figures"][0]["numerator"] == [90.0] * 5
    assert json.loads((tmp_path / "environment.json").read_text())["repo_commit"] == "abc1234"


def test_a_base_binary_adds_this_over_base_figures() -> None:
    arms = ["lz4/1t", "lz4/1t@base"]
    rounds = Rounds(arms)
    for r in range(5):
        rounds.add(r, "lz4/1t", {"write_mb_s": 300, "read_mb_s": 900})
        rounds.add(r, "lz4/1t@base", {"write_mb_s": 200, "read_mb_s": 900})
    figs = {f.name: f.compute(Options()) for f in engine.figures(rounds)}
    assert figs["lz4 write, 1 thread(s): this zbd / base zbd"].ratio == 1.5
    assert figs["lz4 read, 1 thread(s): this zbd / base zbd"].ratio == 1.0

    arms = ["zbd-lz4", "zbd-lz4@base"]
    rounds = Rounds(arms)
    for r in range(5):
        rounds.add(r, "zbd-lz4", {t.key: 200.0 for t in nbd.TESTS})
        rounds.add(r, "zbd-lz4@base", {t.key: 100.0 for t in nbd.TESTS})
    figs = {f.name: f.compute(Options()) for f in nbd.figures("nbd-fast", rounds, arms)}
    assert figs["1 MiB seq write: zbd-lz4 this zbd / base zbd"].ratio == 2.0
    assert len(figs) == len(nbd.TESTS)  # no baseline server ran: only the binary comparison


def test_summary_renders_again_from_figures_json(tmp_path: Path) -> None:
    figs = [
        Figure("nbd-slow", "w", [2.0, 2.2, 1.9, 2.1, 2.0], [1.0] * 5, goal=Goal(at_least=1.6), note="n"),
        Figure("fs", "space", [50.0] * 5, [100.0] * 5, unit="B", goal=Goal(at_most=0.85)),
    ]
    for f in figs:
        f.compute(Options())
    env = {"cpu_model": "c", "cpu_count": 2, "kernel": "k", "tools": {}}
    first = write_results(tmp_path, figs, env, {"rounds": 5}, [], {"fs": ["| t |"]}).read_text()
    (tmp_path / "summary.md").unlink()
    again = report.rerender(tmp_path, 0.9).read_text()
    assert again == first  # same figures, same seed: the same intervals
    assert "| nbd-slow: w | 2.00 |" in again  # the targets table names the group


def test_engine_arms_run_pinned_to_as_many_cores_as_threads() -> None:
    import os

    import pytest

    from zbdlab.app import HostError

    cpus = sorted(os.sched_getaffinity(0))
    assert engine.pinned(1) == ["taskset", "--cpu-list", str(cpus[0])]
    with pytest.raises(HostError, match=f"{len(cpus) + 1} threads need"):
        engine.pinned(len(cpus) + 1)


def test_a_group_that_fails_fails_the_command_after_writing_the_results(tmp_path: Path) -> None:
    import subprocess
    import sys

    broken = tmp_path / "zbd"
    broken.write_text("#!/bin/sh\necho 'zbd: broken on purpose' >&2\nexit 3\n")
    broken.chmod(0o755)
    out = tmp_path / "results"
    argv = [sys.executable, "-c", "from zbdlab.cli import main; main()", "bench", "--only", "engine"]
    argv += ["--rounds", "1", "--zbd", str(broken), "-o", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, proc.stdout
    assert "group failed: engine" in proc.stderr
    assert "engine: FAILED" in (out / "summary.md").read_text()


def _space_doc() -> dict[str, Any]:
    """A dedup-space.json as scripts/bench-dedup-space.py writes it, with round numbers."""
    mib = 2**20

    def row(system: str, stored_mib: int, extra: dict[str, Any], base: bool = False) -> dict[str, Any]:
        r = {"set": "seed 003's case", "system": system, "logical_bytes": 300 * mib}
        return (
            r
            | {"stored_bytes": stored_mib * mib, "measure": "m", "extra": extra}
            | ({"base": True} if base else {})
        )

    compsize = {"disk_usage": 0, "uncompressed": 200 * mib, "referenced": 300 * mib}
    return {
        "version": 1,
        "sets": [
            {
                "key": "seed",
                "name": "seed 003's case",
                "logical_bytes": 300 * mib,
                "description": "fio files",
                "declared_ratio": 3.0,
                "facts": {
                    "exact_dedup_128k": 2.98,
                    "estimate": {
                        "dedup_ratio": 2.97,
                        "compression_ratio": 1.0,
                        "stored_bytes": 100 * mib,
                        "codec": "zstd:1",
                    },
                },
            }
        ],
        "rows": [
            row("btrfs compress=zstd:1", 300, {"empty_bytes": 4 * mib}, base=True),
            row("btrfs compress=zstd:1 + duperemove -d", 240, {"compsize": compsize, "duperemove_s": 12.0}),
            row("ZFS (zfs-fuse) gzip-1, dedup=on", 101, {"dedupratio": "2.97x", "compressratio": "1.00x"}),
        ],
    }


def test_dedup_space_table_divides_by_logical_and_by_btrfs_and_checks_the_declared_ratio() -> None:
    lines = scripts.dedup_space_table(_space_doc())
    rows = [ln for ln in lines if ln.startswith("| seed")]
    # 300 MiB logical: 300 stored is 1:1 and the base; 240 is 0.80x btrfs; 101 is 2.97:1, -1 % of 3:1
    assert rows[0] == (
        "| seed 003's case | btrfs compress=zstd:1 | 300 | 300 | 1.00:1 | 1.00 | "
        "empty 4 MiB; achieved 1.00:1 vs declared 3.00:1 (-67%) |"
    )
    assert "| 240 | 1.25:1 | 0.80 | duperemove shared 100 MiB in 12 s;" in rows[1]
    assert (
        "| 101 | 2.97:1 | 0.34 | dedupratio 2.97x, compressratio 1.00x; achieved 2.97:1 vs declared"
        in rows[2]
    )
    assert rows[2].endswith("(-1%) |")
    # the projection closes the set, marked as one
    assert rows[3].startswith(
        "| seed 003's case | *zbd estimate: dedup 4 KiB + zstd:1 (projection)* | 300 | 100 |"
    )
    assert any("holds 2.98:1 at 128 KiB" in ln and "2.97:1" in ln for ln in lines if ln.startswith("- seed"))


def test_dedup_space_table_without_a_base_row_shows_no_ratio_to_btrfs() -> None:
    doc = _space_doc()
    doc["rows"] = [r for r in doc["rows"] if not r.get("base")]
    rows = [ln for ln in scripts.dedup_space_table(doc) if ln.startswith("| seed")]
    assert all(ln.split(" | ")[5] == "-" for ln in rows)


def test_dedup_space_is_a_default_script_group_with_a_title() -> None:
    from zbdlab.bench.settings import DEFAULT_GROUPS, SCRIPT_GROUPS
    from zbdlab.cli.bench import DEFAULT_GROUPS as CLI_DEFAULT_GROUPS

    assert "dedup-space" in SCRIPT_GROUPS and "dedup-space" in DEFAULT_GROUPS
    assert "dedup-space" in CLI_DEFAULT_GROUPS and "dedup-space" in scripts.SCRIPT_RUNNERS
    assert "dedup-space" in report.GROUP_TITLES


def test_dedup_space_notes_the_inline_rows_index_and_compaction() -> None:
    doc = _space_doc()
    mib = 2**20
    served = {"dedup_ratio": 2.9, "dedup_index": {"hit_rate": 0.985}, "data_bytes_written": 110 * mib}
    inline = {"served": served, "copy_s": 7.0, "empty_bytes": 0}
    doc["rows"] += [
        {"set": "seed 003's case", "system": "ext4 on zbd zstd:1 + inline dedup", "logical_bytes": 300 * mib}
        | {"stored_bytes": 110 * mib, "measure": "m", "extra": inline},
        {"set": "seed 003's case", "system": "ext4 on zbd zstd:1 + inline dedup, then zbd compact"}
        | {"logical_bytes": 300 * mib, "stored_bytes": 105 * mib, "measure": "m"}
        | {"extra": {"zbd_compact_s": 2.0, "before_compact_bytes": 110 * mib}},
    ]
    doc["notes"] = ["a note"]
    lines = scripts.dedup_space_table(doc)
    rows = [ln for ln in lines if "inline dedup" in ln]
    assert "inline, dedup ratio 2.90:1, index hit rate 98.5%, 110 MiB data written; copy 7 s" in rows[0]
    assert "| 105 | 2.86:1 | 0.35 | zbd compact 2 s, 110 MiB before;" in rows[1]
    assert "- a note" in lines


def _write_doc() -> dict[str, Any]:
    """A summary.json as scripts/bench-dedup-write.py writes it."""

    def arm(values: list[float]) -> dict[str, Any]:
        return {"runs": len(values), "mib_s": values, "mib_s_median": sorted(values)[1], "live_bytes": 2**28}

    return {
        "version": 1,
        "summary": [
            {"case": "rand4k", "data": "dup50", "off": arm([90, 100, 95]), "on": arm([99, 100, 120])}
            | {"throughput_on_over_off": 1.05},
            {"case": "seq128k", "data": "unique", "off": arm([500, 510, 520])},
        ],
    }


def test_dedup_write_plot_draws_medians_and_nothing_without_runs(tmp_path: Path) -> None:
    path = tmp_path / "dedup-write.png"
    assert scripts.dedup_write_plot(_write_doc(), path)
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert not scripts.dedup_write_plot({"summary": []}, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_dedup_write_is_a_rootless_default_script_group_with_a_title() -> None:
    from zbdlab.bench.settings import DEFAULT_GROUPS, SCRIPT_GROUPS
    from zbdlab.cli.bench import DEFAULT_GROUPS as CLI_DEFAULT_GROUPS
    from zbdlab.cli.bench import ROOTLESS_GROUPS

    assert "dedup-write" in SCRIPT_GROUPS and "dedup-write" in DEFAULT_GROUPS
    assert "dedup-write" in CLI_DEFAULT_GROUPS and "dedup-write" in scripts.SCRIPT_RUNNERS
    assert "dedup-write" in report.GROUP_TITLES and "dedup-write" in ROOTLESS_GROUPS
    assert scripts.FIGURE_FILES["dedup-write"] == ("dedup-write.png",)
