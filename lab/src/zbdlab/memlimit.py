"""A memory-limited cgroup for one workload process, so its page cache cannot hold the data set.

The seeds measured machines with little DRAM (the ZBD paper gave PostMark 1 GB for a data set many
times larger), so their file systems' reads and write-back reached the disks. This machine's page cache
would hold a scaled data set whole. A study's `memory_limit = "128M"` runs each workload tool in a child
cgroup of our own with that limit: page-cache pages are charged to the cgroup of the process that
touches them first, so the tool's cache is reclaimed at the limit while the servers under it (zbd,
nbdkit) stay outside. Only the tool's PID (and what it forks) goes in; the group is removed after the
tool exits, even when it fails.

cgroup v1 (the `memory` controller, as on this machine) or v2 with `memory` delegated to our group.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from zbdlab.app import HostError

PREFIX = "zbdlab-"


@dataclass(frozen=True)
class Hierarchy:
    parent: Path  # the memory cgroup this process is in; our groups are made under it
    version: int  # 1 or 2

    @property
    def limit_file(self) -> str:
        return "memory.limit_in_bytes" if self.version == 1 else "memory.max"


def _mounts() -> list[tuple[str, str, set[str]]]:
    out = []
    with open("/proc/self/mounts", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4:
                out.append((parts[1], parts[2], set(parts[3].split(","))))
    return out


def find_hierarchy() -> Hierarchy | str:
    """Where our memory cgroups go, or why they cannot be made (one line)."""
    try:
        own = Path("/proc/self/cgroup").read_text(encoding="utf-8").splitlines()
        mounts = _mounts()
    except OSError as exc:
        return f"cannot read the cgroup setup: {exc}"
    paths = {}
    for line in own:
        _, controllers, path = line.split(":", 2)
        paths[controllers] = path
    for mountpoint, fstype, options in mounts:
        if fstype == "cgroup" and "memory" in options:
            path = next((p for c, p in paths.items() if "memory" in c.split(",")), None)
            if path is not None:
                return Hierarchy(Path(mountpoint) / path.lstrip("/"), 1)
    for mountpoint, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in paths:
            parent = Path(mountpoint) / paths[""].lstrip("/")
            try:
                delegated = (parent / "cgroup.subtree_control").read_text(encoding="utf-8").split()
            except OSError:
                delegated = []
            if "memory" in delegated:
                return Hierarchy(parent, 2)
            return f"cgroup v2 at {mountpoint} does not delegate the memory controller to {parent}"
    return "no cgroup memory controller on this host (cgroup v1 memory or v2 with memory delegated)"


def cgroup_problem() -> str | None:
    """Why memory-limited runs cannot happen here, or None."""
    found = find_hierarchy()
    if isinstance(found, str):
        return f"memory_limit: {found}"
    if not os.access(found.parent, os.W_OK):
        return f"memory_limit: cannot create cgroups under {found.parent} (needs root)"
    return None


class MemoryCgroup:
    """`with MemoryCgroup(limit) as group: subprocess.run(group.wrap(argv))`."""

    _count = 0

    def __init__(self, limit_bytes: int) -> None:
        found = find_hierarchy()
        if isinstance(found, str):
            raise HostError(f"memory_limit: {found}")
        self.hierarchy = found
        self.limit_bytes = limit_bytes
        MemoryCgroup._count += 1
        self.path = found.parent / f"{PREFIX}{os.getpid()}-{MemoryCgroup._count}"

    def __enter__(self) -> MemoryCgroup:
        try:
            self.path.mkdir()
        except OSError as exc:
            raise HostError(f"memory_limit: cannot create cgroup {self.path}: {exc.strerror}") from None
        try:
            (self.path / self.hierarchy.limit_file).write_text(str(self.limit_bytes))
        except OSError as exc:
            self.remove()
            raise HostError(f"memory_limit: cannot set {self.hierarchy.limit_file}: {exc.strerror}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def wrap(self, argv: list[str]) -> list[str]:
        """argv run inside the group: the shell moves itself in, then execs the tool (same PID), so
        not one page the tool touches is charged outside the group."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"), *argv]

    def usage(self) -> dict[str, int]:
        """Peak memory of the group (page cache included) and how often it hit the limit."""
        out: dict[str, int] = {"memory_limit_bytes": self.limit_bytes}
        files = (
            {"memory_peak_bytes": "memory.max_usage_in_bytes", "memory_limit_hits": "memory.failcnt"}
            if self.hierarchy.version == 1
            else {"memory_peak_bytes": "memory.peak"}
        )
        for key, name in files.items():
            try:
                out[key] = int((self.path / name).read_text().strip())
            except (OSError, ValueError):
                pass
        # v1 memory.oom_control and v2 memory.events are both "key value" lines
        v1 = self.hierarchy.version == 1
        try:
            text = (self.path / ("memory.oom_control" if v1 else "memory.events")).read_text()
            events = dict(line.split() for line in text.splitlines())
        except (OSError, ValueError):
            events = {}
        if not v1 and "max" in events:
            out["memory_limit_hits"] = int(events["max"])
        if "oom_kill" in events:
            out["memory_oom_kills"] = int(events["oom_kill"])
        return out

    def remove(self) -> None:
        remove_group(self.path, self.hierarchy.parent)


def remove_group(path: Path, parent: Path) -> None:
    """Move anything left in the group back to the parent (a tool's orphaned child), then remove it."""
    if not path.exists():
        return
    for attempt in range(50):
        try:
            for pid in (path / "cgroup.procs").read_text().split():
                try:
                    (parent / "cgroup.procs").write_text(pid)
                except OSError:
                    pass  # exited meanwhile
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            # a process that just exited can keep the group busy for a moment (the kernel frees it
            # asynchronously); give up after about a second rather than hang the run
            if attempt == 49:
                raise HostError(f"memory_limit: cannot remove cgroup {path}: {exc.strerror}") from None
            time.sleep(0.02)


def remove_stale() -> list[str]:
    """Remove groups left by a zbdlab that was killed (its PID gone); returns what was removed."""
    found = find_hierarchy()
    if isinstance(found, str) or not found.parent.is_dir():
        return []
    removed = []
    for path in found.parent.glob(f"{PREFIX}*-*"):
        pid = path.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            remove_group(path, found.parent)
            removed.append(str(path))
    return removed
