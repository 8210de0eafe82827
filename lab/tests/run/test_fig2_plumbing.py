"""Issue 30's reproduction plumbing: device request and flush counters, the page-cache drop, the
mail-like mailbox, PostMark's data shim, and 002-fig2's targets, rows and verdict (no device touched)."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zbdlab.config import ConfigError, parse_study
from zbdlab.corpus import mail
from zbdlab.monitors import counters
from zbdlab.reproduce import seed002
from zbdlab.reproduce.model import Measured, Table
from zbdlab.reproduce.studies import study_head
from zbdlab.results.schema import RunRecord
from zbdlab.runner.execute import _cache_drop
from zbdlab.workloads import postmark

STAT_17 = "10 0 80 5 20 0 400 9 0 12 14 0 0 0 0 3 1\n"


def test_the_stat_line_gives_requests_and_flushes() -> None:
    s = counters.parse_stat(STAT_17)
    assert (s.ios_read, s.sectors_read, s.ios_written, s.sectors_written, s.ios_flushed) == (
        10,
        80,
        20,
        400,
        3,
    )
    # a kernel before 5.5 has no flush fields: flushes are unknown, not zero
    assert counters.parse_stat("10 0 80 5 20 0 400 9 0 12 14\n").ios_flushed is None


def test_request_deltas_sum_devices_and_say_when_flushes_are_unknown() -> None:
    before = {"loop1": counters.parse_stat(STAT_17), "loop2": counters.parse_stat(STAT_17)}
    after = {
        "loop1": counters.parse_stat("15 0 99 5 27 0 999 9 0 12 14 0 0 0 0 5 1"),
        "loop2": counters.parse_stat("11 0 88 5 20 0 400 9 0 12 14 0 0 0 0 4 1"),
    }
    assert counters.io_delta_requests(before, after) == {
        "read_requests": 6,
        "write_requests": 7,
        "flushes": 3,
    }
    old = {"loop1": counters.parse_stat("15 0 99 5 27 0 999 9 0 12 14")}
    assert counters.io_delta_requests(before, old)["flushes"] is None


def test_the_drop_is_recorded_only_when_it_happened() -> None:
    assert _cache_drop([]) == {}
    assert _cache_drop([{"when": "x", "cached_before_bytes": 5 << 20, "cached_after_bytes": 1 << 20}]) == {
        "cache_dropped": True,
        "cached_before_drop_bytes": 5 << 20,
        "cached_after_drop_bytes": 1 << 20,
    }


def test_server_cache_is_for_targets_with_a_server(tmp_path: Path) -> None:
    from zbdlab.targets.zbd import NbdkitExport, ZbdVolume

    head = study_head("t", "t", repetitions=2, cache="warm", seed=1)
    body = '\n[workloads.p]\nkind = "postmark"\n'
    with pytest.raises(ConfigError, match="server_cache"):
        parse_study(head + '[[targets]]\nname = "e"\nfs = "ext4"\nserver_cache = "none"\n' + body)
    with pytest.raises(ConfigError, match="server_cache"):
        parse_study(
            head + '[[targets]]\nname = "e"\nfs = "ext4"\ntransport = "nbdkit"\nserver_cache = "x"\n' + body
        )
    nbd = NbdkitExport.__new__(NbdkitExport)
    nbd.socket, nbd.pidfile, nbd.backing, nbd.server_cache = (
        tmp_path / "s",
        tmp_path / "p",
        "/dev/loop9",
        "none",
    )
    assert nbd.server_argv()[-2:] == ["file=/dev/loop9", "cache=none"]
    nbd.server_cache = "host"
    assert nbd.server_argv()[-1] == "file=/dev/loop9"
    vol = ZbdVolume.__new__(ZbdVolume)
    vol.binary, vol.socket, vol.pidfile, vol.backing, vol.server_cache = (
        "zbd",
        nbd.socket,
        nbd.pidfile,
        "/d",
        "none",
    )
    assert vol.server_argv()[-1] == "--direct"


def test_drop_caches_is_a_warm_study_key() -> None:
    body = '[[targets]]\nname = "e"\nfs = "ext4"\n\n[workloads.p]\nkind = "postmark"\n'
    warm = parse_study(study_head("t", "t", repetitions=2, cache="warm", seed=1, drop_caches=True) + body)
    assert warm.drop_caches
    assert not parse_study(study_head("t", "t", repetitions=2, cache="warm", seed=1) + body).drop_caches
    cold = study_head("t", "t", repetitions=2, cache="cold", seed=1).replace(
        "seed = 1", "drop_caches = true\nseed = 1"
    )
    with pytest.raises(ConfigError, match="drop_caches"):
        parse_study(cold + body)


CHANGELOG = """pkg (1.2-1) unstable; urgency=medium

  * New upstream release.
  * From now on the docs are built.

 -- Ann Example <ann@example.org>  Tue, 20 Sep 2022 12:17:15 -0400

pkg (1.1-1) unstable; urgency=low

  * Initial release.

 -- Bob Example <bob@example.org>  Mon, 01 Aug 2022 10:00:00 +0000

Old free-form history without a trailer.
"""


def test_changelog_entries_become_mbox_messages() -> None:
    found = list(mail.entries(CHANGELOG))
    assert [(e[0], e[1], e[2]) for e in found] == [
        ("pkg", "1.2-1", "Ann Example <ann@example.org>"),
        ("pkg", "1.1-1", "Bob Example <bob@example.org>"),
    ]
    text = mail.message(*found[0])
    assert text.startswith(
        "From ann@example.org Tue Sep 20 12:17:15 2022\nFrom: Ann Example <ann@example.org>\n"
    )
    assert "Subject: Accepted pkg 1.2-1 (source) into unstable\n" in text
    assert (
        "\n  * >From now on" not in text and "  * From now on" in text
    )  # only a line starting "From " is quoted
    assert mail.message("p", "1", "A <a@b>", "not a date", ">From x\nFrom y").count(">From ") == 2
    box = mail.mbox([CHANGELOG], 1 << 20)
    assert box.count(b"\nFrom: ") + box.startswith(b"From: ") == 2
    assert len(mail.mbox([CHANGELOG] * 10, 300)) == 300


def test_build_mbox_refuses_a_machine_without_changelogs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="too little"):
        mail.build_mbox(tmp_path / "m.mbox", root=tmp_path)


def test_postmark_write_data_key_and_argv(tmp_path: Path) -> None:
    w = postmark.from_config("p", {"write_data": "/data/mail.mbox"})
    assert w.config.data == Path("/data/mail.mbox")
    assert postmark.from_config("p", {}).config.data is None
    with pytest.raises(Exception, match="absolute"):
        postmark.from_config("p", {"write_data": "mail.mbox"})
    argv = postmark.data_argv(["postmark", "x.cfg"], Path("/d/m"), Path("/lib/s.so"))
    # env in front: the cgroup wrapper's shell runs without the preload
    assert argv == ["env", "LD_PRELOAD=/lib/s.so", "ZBDLAB_POSTMARK_DATA=/d/m", "postmark", "x.cfg"]
    assert postmark.replaced_bytes("x\nzbdlab postmark data: 123 bytes replaced\n") == 123
    assert postmark.replaced_bytes("no shim here") is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_shim_replaces_file_bytes_and_leaves_pipes_alone(tmp_path: Path) -> None:
    lib = postmark.shim_path(tmp_path / "cache")
    assert postmark.shim_path(tmp_path / "cache") == lib  # built once
    data = tmp_path / "data"
    data.write_bytes(b"0123456789")
    out = tmp_path / "out"
    code = f"import os\nos.write(1, b'to the pipe')\nopen({str(out)!r}, 'wb').write(b'x' * 25)\n"
    argv = postmark.data_argv([sys.executable, "-c", code], data, lib)
    proc = subprocess.run(argv, capture_output=True, check=True)
    assert proc.stdout == b"to the pipe"
    assert out.read_bytes() == b"0123456789" * 2 + b"01234"
    assert postmark.replaced_bytes(proc.stderr.decode()) == 25


def test_fig2_study_has_the_transport_control_and_every_codec_on_the_throttled_disk() -> None:
    for fs in seed002.FIG2_FS:
        study = parse_study(seed002.fig2_study(False, 2, fs, "/m/mail.mbox"))
        assert [t.name for t in study.targets] == list(seed002.FIG2_TARGETS)
        assert all(t.fs == fs and t.throttle for t in study.targets)
        by = {t.name: t for t in study.targets}
        assert by["transport"].transport == "nbdkit" and by["transport"].zbd is None
        assert by["zbd-lz4"].zbd.codec == "lz4" and by["zbd-zstd1"].zbd.codec == "zstd:1"
        assert study.drop_caches and study.cache == "warm"
        assert by["native"].server_cache == "host"  # no server under native: the key is not written
        assert by["transport"].server_cache == by["zbd-none"].server_cache == seed002.SERVER_CACHE == "none"
        assert 'write_data = "/m/mail.mbox"' in study.text
    assert [t.name for t in parse_study(seed002.fig2_study(True, 1)).targets] == ["zbd-zlib"]


def _records(target: str, tps_runs: list[float], reads: int, flushes: int) -> list[RunRecord]:
    transactions = seed002.postmark_size(False)[1]
    return [
        RunRecord(
            run_id=f"{target}{i}",
            target=target,
            workload="postmark",
            operation="postmark",
            repetition=i,
            elapsed_s=transactions / v,
            backing_bytes_read=reads * 4096,
            backing_bytes_written=2 << 20,
            discarded=i == 0,
            extra={
                "backing_read_requests": reads,
                "backing_write_requests": 7,
                "backing_flushes": flushes,
                "sync_s": transactions / v,  # as long again: half the rate
            },
        )
        for i, v in enumerate(tps_runs)
    ]


def test_fig2_rows_and_verdict_read_the_new_rows() -> None:
    tps = {
        "native": 300.0,
        "transport": 290.0,
        "zbd-none": 290.0,
        "zbd-lzo": 380.0,
        "zbd-lz4": 400.0,
        "zbd-zstd1": 420.0,
        "zbd-zlib": 250.0,
    }
    records = [r for t, v in tps.items() for r in _records(t, [1.0, v, v, v], 256, 5)]
    rows, note = seed002.fig2_rows(records, "xfs", 2, quick=False)
    assert [r[0] for r in rows][:3] == ["XFS native", "XFS transport control", "XFS ZBD (none)"]
    lz4 = rows[seed002.FIG2_TARGETS.index("zbd-lz4")]
    assert lz4 == ["XFS ZBD (lz4)", 400.0, 200.0, 1.33, 1.38, 256, 1, 7, 2, 5]
    assert "n=3" in note
    ext4 = [[r[0].replace("XFS", "ext4"), *r[1:]] for r in rows]
    one, _ = seed002.fig2_rows(_records("zbd-zlib", [1.0, 225.0, 225.0, 225.0], 1, 1), "xfs", 1, quick=False)
    assert one[0][0] == "XFS ZBD (zlib:1), 1 CPU" and one[0][3] is None
    table = Table(seed002.FIG2_COLUMNS, rows + ext4 + one)
    verdict = seed002.fig2_compare(seed002.FIG2.seed, Measured(table))
    assert "seed +69 %, ours +40 %" in verdict.reason and "seed -12 %, ours -10 %" in verdict.reason
    assert "XFS ZBD (none) / native 0.97 (goal >= 0.95: met)" in verdict.reason
    assert "ext4 ZBD (lzo) / ZBD (lz4) 0.95 (goal >= 0.9: met)" in verdict.reason
    assert "ZBD (zstd:1) / native 1.40 (goal >= 1.3: met)" in verdict.reason
    missing = Table(seed002.FIG2_COLUMNS, rows)
    assert "ext4 ZBD (lz4) / native: not measured" in seed002.goal_checks(missing)


def test_fig2_drop_note_says_what_was_dropped() -> None:
    r = _records("native", [1.0, 2.0], 1, 1)
    assert seed002.drop_note(r) == "page cache: not dropped between runs"
    for x in r:
        x.extra.update(
            cache_dropped=True, cached_before_drop_bytes=300 << 20, cached_after_drop_bytes=20 << 20
        )
    assert "before each of 2 of 2 runs" in seed002.drop_note(
        r
    ) and "300..300 MiB before" in seed002.drop_note(r)
    assert not math.isnan(seed002.COST["fig2"][0])


def test_fig10_has_the_transport_control_and_mail_data() -> None:
    study = parse_study(seed002.fig10_study(False, "/m/mail.mbox"))
    by = {t.name: t for t in study.targets}
    assert by["transport"].transport == "nbdkit" and by["transport"].throttle
    assert all(t.server_cache == seed002.SERVER_CACHE for t in study.targets)
    assert 'write_data = "/m/mail.mbox"' in study.text and study.drop_caches
    rows = [["8K", 100.0, 50.0], ["32K", 120.0, 40.0], ["128K", 150.0, 30.0], ["1M", 140.0, 20.0]]
    seed = seed002.FIG10.seed
    plain = seed002.fig10_compare(seed, Measured(Table(["extent", "PostMark (tps)", "r"], rows)))
    assert "transport control" not in plain.reason
    control = seed002.fig10_compare(
        seed, Measured(Table(["extent", "PostMark (tps)", "r"], [*rows, ["transport control", 100.0, 45.0]]))
    )
    assert control.kind == plain.kind and control.reason.endswith("vs the transport control: 1.50x")
