"""`zbdlab run` end to end on real loop devices: a tiny study, resume after SIGTERM, failure cleanup."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import loops_over, mounts_under, run_zbdlab, start_zbdlab

from zbdlab.targets.zbd import zbd_problem
from zbdlab.throttle import throttle_problem

pytestmark = pytest.mark.needs_root

TINY = """
version = 1
name = "tiny"
repetitions = {reps}
cache = "{cache}"
format = "{fmt}"
seed = 7
scratch_dir = "{scratch}"

[data]
compress_percentage = 50

[[targets]]
name = "ext4"
fs = "ext4"
size = "128M"

[[targets]]
name = "btrfs-zstd"
fs = "btrfs"
size = "256M"
compress = "zstd:1"
compress_force = true

{more}

[workloads.tiny]
kind = "custom"
factory = "run_tinyload:make"
size = "8M"
{wl}
"""


def write_study(tmp: Path, scratch: Path, reps=2, cache="cold", fmt="repetition", more="", wl="") -> Path:
    path = tmp / "study.toml"
    path.write_text(TINY.format(reps=reps, cache=cache, fmt=fmt, scratch=scratch, more=more, wl=wl))
    return path


def rows_of(results: Path) -> list[dict]:
    return [json.loads(line) for line in (results / "runs.jsonl").read_text().splitlines() if line.strip()]


def spawned_pids(results: Path) -> list[int]:
    pids = []
    for line in (results / "commands.jsonl").read_text().splitlines():
        note = json.loads(line).get("note") or ""
        if note.startswith("spawned pid "):
            pids.append(int(note.split()[-1]))
    return pids


def assert_nothing_left(results: Path, scratch: Path) -> None:
    argvs = [json.loads(line)["argv"] for line in (results / "commands.jsonl").read_text().splitlines()]
    images = [a[-1] for a in argvs if a[0] == "truncate"]
    assert images, "the run created image files"
    assert not mounts_under(scratch), "nothing left mounted"
    assert not loops_over(images), "no loop device left attached"
    assert not any(Path(i).exists() for i in images), "image files removed"
    for pid in spawned_pids(results):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_tiny_study_end_to_end(tmp_path: Path, scratch: Path) -> None:
    study = write_study(tmp_path, scratch)
    results = tmp_path / "results"
    proc = run_zbdlab("run", str(study), "-o", str(results))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    rows = rows_of(results)
    assert len(rows) == 2 * 2 * 2  # targets x repetitions x operations (write, read)
    assert {r["target"] for r in rows} == {"ext4", "btrfs-zstd"}
    assert {r["operation"] for r in rows} == {"write", "read"}
    for r in rows:
        assert r["schema_version"] == 2
        assert r["throughput_bytes_per_s"] > 0
        assert r["cpu_user_s"] is not None and r["cpu_system_s"] is not None
        assert r["cache_policy"] == "cold" and not r["discarded"]
        assert any("fewer than 5" in w for w in r["warnings"])
        assert any("fits in the page cache" in w for w in r["warnings"])
        monitors = json.loads((results / r["extra"]["raw_dir"] / "monitors.json").read_text())
        assert monitors["cache_checks"], "cold policy: caches dropped before and between operations"
        assert all(c["resident_bytes_after"] == 0 for c in monitors["cache_checks"])
        assert (results / r["extra"]["raw_dir"] / f"{r['operation']}.json").exists(), "raw fio output kept"
    writes = [r for r in rows if r["operation"] == "write"]
    reads = [r for r in rows if r["operation"] == "read"]
    assert all(r["backing_bytes_written"] >= 2 << 20 for r in writes), "the write reached the loop devices"
    assert all(r["backing_bytes_read"] >= 2 << 20 for r in reads), "cold reads came from the loop devices"
    ext4 = [r for r in writes if r["target"] == "ext4"]
    assert all(r["backing_bytes_written"] >= 8 << 20 for r in ext4), "ext4 writes the whole file"
    btrfs = [r for r in rows if r["target"] == "btrfs-zstd"]
    assert all(1.4 < r["compression_ratio"] < 3 for r in btrfs), "50 % compressible data compresses about 2:1"
    assert all(r["compression"] == "btrfs:zstd:1 force" for r in btrfs)
    # one tidy table, two formats
    with open(results / "runs.csv", newline="") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == len(rows)
    assert "throughput_bytes_per_s" in csv_rows[0]
    env = json.loads((results / "environment.json").read_text())
    assert env["kernel"] and env["mem_total_bytes"] > 0 and env["tools"]["fio"].startswith("fio-")
    assert env["study"]["seed"] == 7
    assert env["targets"]["btrfs-zstd"]["btrfs_compress"] == "zstd:1"
    assert (results / "study.toml").read_text() == study.read_text()
    argv0 = {json.loads(line)["argv"][0] for line in (results / "commands.jsonl").read_text().splitlines()}
    assert {"losetup", "mkfs.ext4", "mkfs.btrfs", "mount", "umount", "compsize"} <= argv0
    order = json.loads((results / "plan.json").read_text())["order"]
    assert [r["unit_id"] for r in sorted(rows, key=lambda r: r["order_index"])][::2] == order
    assert "medians over repetitions" in proc.stdout
    assert (results / "report" / "index.html").exists(), "the run ends with zbdlab report on its targets"
    assert_nothing_left(results, scratch)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_resume_after_kill_skips_recorded_runs(tmp_path: Path, scratch: Path, sig: signal.Signals) -> None:
    study = write_study(tmp_path, scratch, reps=3, wl="cells = 2")
    results = tmp_path / "results"
    runs = results / "runs.jsonl"
    proc = start_zbdlab("run", str(study), "-o", str(results), "--no-report")
    try:
        deadline = time.monotonic() + 120
        while not (runs.exists() and runs.read_text().count("\n") >= 2):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no run recorded in 120 s"
            time.sleep(0.05)
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    if sig == signal.SIGTERM:
        assert proc.returncode == 130, err
        assert "--resume" in err
        assert_nothing_left(results, scratch)
    else:
        assert proc.returncode == -signal.SIGKILL  # no cleanup ran: --resume must undo the leftovers
        # killed mid-unit: its target is attached (and mounted, unless caught in a cold remount)
        images = [str(p) for p in scratch.rglob("*.img")]
        assert images and loops_over(images), "the killed run left its loop devices attached"
    before = {r["run_id"]: r for r in rows_of(results)}
    assert 2 <= len(before) < 2 * 3 * 2 * 2, "interrupted part-way"

    done = run_zbdlab("run", str(study), "-o", str(results), "--resume", "--no-report")
    assert done.returncode == 0, done.stderr + done.stdout
    lines = [json.loads(line) for line in runs.read_text().splitlines() if line.strip()]
    ids = [r["run_id"] for r in lines]
    assert len(ids) == len(set(ids)) == 2 * 3 * 2 * 2, "every run recorded exactly once"
    for run_id, row in before.items():
        assert next(r for r in lines if r["run_id"] == run_id) == row, "recorded runs were not redone"
    assert f"{len(before) // 2} skipped" in done.stdout
    if sig == signal.SIGKILL:
        assert "cleaned up what the interrupted run left" in done.stdout
    assert_nothing_left(results, scratch)


THROTTLED = """[[targets]]
name = "slow"
fs = "ext4"
size = "128M"
throttle = { rate = "100M", latency = "1ms" }
"""


@pytest.mark.skipif(throttle_problem() is not None, reason=str(throttle_problem()))
def test_sigterm_during_the_throttle_probe_leaves_nothing_behind(tmp_path: Path, scratch: Path) -> None:
    """The throttle's overhead probe runs before the first unit (it makes its own loop devices,
    nbdkit and an nbdfuse mount); a SIGTERM there once killed zbdlab with all of them left behind."""
    study = write_study(tmp_path, scratch, reps=1, more=THROTTLED)
    results = tmp_path / "results"
    proc = start_zbdlab("run", str(study), "-o", str(results), "--no-report")
    probe = f"{scratch}/overhead-"
    try:
        deadline = time.monotonic() + 120
        # the probe is under way once a loop device sits over its image
        while probe not in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the throttle probe did not start in 120 s"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert probe not in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert not mounts_under(scratch), "the probe's nbdfuse mount was unmounted"
    assert not list(scratch.glob("overhead-*")), "the probe's directory was removed"
    servers = subprocess.run(["pgrep", "-af", "nbdkit|nbdfuse"], capture_output=True, text=True).stdout
    assert probe not in servers, f"nbdkit/nbdfuse of the probe still running: {servers}"


def test_failing_workload_leaves_nothing_behind(tmp_path: Path, scratch: Path) -> None:
    zfs = '[[targets]]\nname = "zfs"\nfs = "zfs"\nsize = "256M"\ncompression = "gzip"'
    raid = '[[targets]]\nname = "btrfs-raid1"\nfs = "btrfs"\nsize = "256M"\ndevices = 2\nraid = "raid1"'
    # format "once" keeps every target live until its last run: fail in repetition 2, when all are
    study = write_study(
        tmp_path, scratch, reps=2, fmt="once", more=f"{zfs}\n{raid}", wl="fail_on_execution = 5"
    )
    results = tmp_path / "results"
    proc = run_zbdlab("run", str(study), "-o", str(results))
    assert proc.returncode == 1, proc.stderr + proc.stdout
    assert "run failed" in proc.stderr and "fio read exited" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(rows_of(results)) == 4 * 2, "the four units before the failure stay recorded"
    argv0 = [json.loads(line)["argv"] for line in (results / "commands.jsonl").read_text().splitlines()]
    assert sum(1 for a in argv0 if a[:2] == ["zpool", "create"]) == 1
    assert sum(1 for a in argv0 if a[0] == "losetup" and "--find" in a) == 5, "all four targets were live"
    assert_nothing_left(results, scratch)


def test_ext4_on_zbd_end_to_end(tmp_path: Path, scratch: Path) -> None:
    problem = zbd_problem()
    if problem:
        print(f"SKIP reason: {problem}")
        pytest.skip(problem)
    zbd = '[[targets]]\nname = "ext4-zbd"\nfs = "ext4"\nsize = "256M"\n[targets.zbd]\ncodec = "lz4"'
    study = write_study(tmp_path, scratch, reps=1, more=zbd)
    results = tmp_path / "results"
    proc = run_zbdlab("run", str(study), "-o", str(results), "--no-report")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    rows = [r for r in rows_of(results) if r["target"] == "ext4-zbd"]
    assert {r["operation"] for r in rows} == {"write", "read"}
    write = next(r for r in rows if r["operation"] == "write")
    assert write["compression"] == "zbd:lz4" and write["extra"]["ratio_source"] == "zbd stat"
    assert write["compression_ratio"] > 1.4, "50 % compressible data compresses under lz4"
    # the oracle: compression means fewer bytes reach zbd's own loop device than the filesystem wrote
    front = write["extra"]["frontend_bytes_written"]
    assert front >= 8 << 20
    assert write["backing_bytes_written"] < 0.8 * front
    argv0 = [json.loads(line)["argv"] for line in (results / "commands.jsonl").read_text().splitlines()]
    assert sum(1 for a in argv0 if a[1:2] == ["serve"]) >= 2, "cold cache restarts the zbd server"
    assert_nothing_left(results, scratch)
