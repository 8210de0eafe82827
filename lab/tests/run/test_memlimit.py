"""The study option memory_limit: each workload tool runs in a memory-limited cgroup of its own, its
page cache is held to the limit, and the group is gone afterwards whatever the tool did."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zbdlab.config import ConfigError, parse_study
from zbdlab.memlimit import MemoryCgroup, cgroup_problem, find_hierarchy
from zbdlab.workloads.base import DataSpec, RunContext
from zbdlab.workloads.tool import run_measured

LIMIT = 32 << 20

needs_cgroup = pytest.mark.skipif(
    os.geteuid() != 0 or cgroup_problem() is not None,
    reason=f"needs root and a cgroup memory controller ({cgroup_problem()})",
)


def ours() -> list[Path]:
    found = find_hierarchy()
    assert not isinstance(found, str)
    return sorted(found.parent.glob(f"zbdlab-{os.getpid()}-*"))


@needs_cgroup
def test_page_cache_is_held_to_the_limit_and_the_group_removed(tmp_path: Path) -> None:
    # not tmpfs: the data must be page cache that can be written back and reclaimed
    target = tmp_path / "data"
    ctx = RunContext(mountpoint=tmp_path, raw_dir=tmp_path, data=DataSpec(), memory_limit_bytes=LIMIT)
    argv = ["sh", "-c", f"cat /proc/self/cgroup; dd if=/dev/zero of={target} bs=1M count=96 status=none"]
    proc, _ = run_measured(argv, ctx, "write")
    assert proc.returncode == 0, proc.stderr
    assert f"/zbdlab-{os.getpid()}-" in proc.stdout  # the tool ran inside our group
    [usage] = ctx.memory_usage
    assert usage["memory_limit_bytes"] == LIMIT
    assert 0 < usage["memory_peak_bytes"] <= LIMIT
    assert usage["memory_limit_hits"] > 0  # 96 MiB written through a 32 MiB group: reclaim happened
    assert target.stat().st_size == 96 << 20
    assert ours() == []


@needs_cgroup
def test_group_is_removed_when_the_tool_fails_or_never_starts(tmp_path: Path) -> None:
    ctx = RunContext(mountpoint=tmp_path, raw_dir=tmp_path, data=DataSpec(), memory_limit_bytes=LIMIT)
    proc, _ = run_measured(["sh", "-c", "exit 3"], ctx, None)
    assert proc.returncode == 3
    proc, _ = run_measured(["/nonexistent/tool"], ctx, None)
    assert proc.returncode != 0
    assert ours() == []
    with pytest.raises(RuntimeError), MemoryCgroup(LIMIT) as group:
        assert group.path.is_dir()
        raise RuntimeError("the workload failed")
    assert not group.path.exists()


def study(memory_limit: str) -> str:
    return f"""version = 1
memory_limit = {memory_limit}
[[targets]]
name = "a"
fs = "ext4"
[workloads.w]
kind = "postmark"
"""


@pytest.mark.parametrize(
    ("value", "problem"),
    [('"1M"', "too small"), ('"lots"', "not a size"), ("true", "not a size")],
)
def test_bad_memory_limit_is_a_one_line_error(value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_study(study(value))
    message = str(info.value)
    assert "memory_limit" in message and problem in message and "\n" not in message


def test_memory_limit_is_read() -> None:
    assert parse_study(study('"128M"')).memory_limit == 128 << 20
    assert parse_study(study('"128M"').replace("memory_limit", "# memory_limit")).memory_limit is None
