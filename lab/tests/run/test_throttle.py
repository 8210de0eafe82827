"""The throttled device: nbdkit rate + delay filters through nbdfuse and a loop device.

The rate check runs real fio against the device; the rate filter's two-second burst bucket is drained
by fio's ramp time before measuring."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zbdlab.app import HostError
from zbdlab.throttle import (
    Throttle,
    ThrottledDevice,
    ThrottleError,
    fio_probe,
    parse_latency,
    parse_rate,
    throttle_problem,
)

needs_tools = pytest.mark.skipif(throttle_problem() is not None, reason=str(throttle_problem()))


def test_rate_and_latency_parse() -> None:
    assert parse_rate("100M") == 100 << 20
    assert parse_rate("1.5MiB/s") == 3 << 19
    assert parse_rate(None) is None
    assert parse_latency("2ms") == 2
    assert parse_latency("1s") == 1000
    assert parse_latency("3000us") == 3
    assert Throttle(20 << 20, 2).nbdkit_args() == [f"rate={(20 << 20) * 8}", "rdelay=2ms", "wdelay=2ms"]


@pytest.mark.parametrize(
    ("rate", "latency", "problem"),
    [
        ("fast", None, "rate: expected bytes per second"),
        ("1K", None, "rate: at least 64K"),
        (True, None, "rate: expected"),
        (None, "2", "latency: expected a duration"),
        (None, "0.5ms", "whole milliseconds"),
        (None, "20s", "at most 10s"),
    ],
)
def test_bad_values_are_one_line_errors(rate: object, latency: object, problem: str) -> None:
    with pytest.raises(ThrottleError, match=problem) as info:
        ThrottledDevice("/nonexistent.img", rate=rate, latency=latency)
    assert "\n" not in str(info.value)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes; Popen.wait in the teardown reaps it
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.needs_root
@needs_tools
def test_rate_holds_within_20_percent_and_everything_is_undone(scratch: Path) -> None:
    image = scratch / "disk.img"
    throttled = ThrottledDevice(image, "256M", rate="24M", latency="1ms")
    with throttled as dev:
        assert dev.startswith("/dev/loop")
        assert throttled.nbdkit is not None and throttled.nbdfuse is not None
        pids = [throttled.nbdkit.pid, throttled.nbdfuse.pid]
        workdir = throttled.workdir
        wrote = fio_probe(dev, "write", "1M", 4, runtime_s=3, ramp_s=2.5)
        read = fio_probe(dev, "read", "1M", 4, runtime_s=3, ramp_s=2.5)
    for numbers in (wrote, read):
        assert 24 * 0.8 <= numbers["MiBps"] <= 24 * 1.2, numbers
    assert not any(_alive(pid) for pid in pids)
    assert workdir is not None and not workdir.exists()
    assert not image.exists()  # created by the device, so removed by it


@pytest.mark.needs_root
@needs_tools
def test_latency_is_added_to_every_request(scratch: Path) -> None:
    image = scratch / "disk.img"
    with ThrottledDevice(image, "64M", latency="6ms") as dev:
        probe = fio_probe(dev, "randread", "4k", 1, runtime_s=1, ramp_s=0, size="64M")
    assert probe["clat_ms"] >= 6, probe


@pytest.mark.needs_root
@needs_tools
def test_failed_start_leaves_nothing(scratch: Path) -> None:
    # nbdkit's file plugin refuses a directory: the start fails after the work directory exists
    backing = scratch / "not-an-image"
    backing.mkdir()
    throttled = ThrottledDevice(backing, workdir=scratch / "work")
    with pytest.raises(HostError, match="nbdkit exited at start"), throttled:
        pass
    assert list((scratch / "work").iterdir()) == []
    assert backing.exists()  # not ours to remove


def test_report_notes_name_the_throttle_and_its_overhead() -> None:
    from zbdlab.parsers.results import throttle_notes

    env = {
        "targets": {"slow": {"throttle": Throttle(100 << 20, 2).as_dict()}, "fast": {"throttle": None}},
        "throttle_overhead": {"overhead_pct": {"seq_write_MiBps": 49.0, "rand_read_4k_iops": 76.7}},
    }
    notes = throttle_notes(env, ["fast", "slow"])
    assert notes == [
        "slow: on a throttled disk (100 MiB/s, 2 ms/request)",
        "throttle chain overhead when unthrottled, vs a plain loop device: seq_write_MiBps +49 %, "
        "rand_read_4k_iops +77 %",
    ]
    assert throttle_notes(env, ["fast"]) == []


def test_trace_log_is_off_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from zbdlab import throttle

    monkeypatch.delenv("ZBDLAB_TRACE_DIR", raising=False)
    assert throttle._trace_filter() == [] and throttle._trace_args(tmp_path / "disk.img") == []
    monkeypatch.setenv("ZBDLAB_TRACE_DIR", str(tmp_path / "trace"))
    # outermost filter, so a request's logged time includes its delay and rate wait
    assert throttle._trace_filter() == ["--filter=log"]
    (arg,) = throttle._trace_args(tmp_path / "t1" / "disk0.img")
    assert arg.startswith(f"logfile={tmp_path / 'trace'}/t1-disk0-") and arg.endswith(".log")
    assert (tmp_path / "trace").is_dir()
