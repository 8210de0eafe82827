"""Dropping the page cache and checking that it really dropped."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from zbdlab.monitors.counters import meminfo
from zbdlab.targets.commands import Commands

RESIDENT_FILES_MAX = 2000  # fincore is run on at most this many files (postmark makes thousands)


def drop_caches(cmds: Commands) -> dict[str, Any]:
    """sync, then echo 3 > /proc/sys/vm/drop_caches; returns Cached before/after (bytes)."""
    cmds.run(["sync"])
    before = meminfo().get("Cached", 0)
    cmds.record(["sh", "-c", "echo 3 > /proc/sys/vm/drop_caches"], 0, "written directly")
    with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as f:
        f.write("3\n")
    after = meminfo().get("Cached", 0)
    return {"cached_before_bytes": before, "cached_after_bytes": after}


def resident_bytes(cmds: Commands, root: Path) -> int | None:
    """Bytes of the files under `root` resident in the page cache (fincore), None if unknown."""
    files: list[str] = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                files.append(path)
            if len(files) >= RESIDENT_FILES_MAX:
                break
        if len(files) >= RESIDENT_FILES_MAX:
            break
    if not files:
        return 0
    proc = cmds.run(["fincore", "--json", "--bytes", "-o", "RES,FILE", *files], check=False)
    if proc.returncode != 0:
        return None
    try:
        rows = json.loads(proc.stdout).get("fincore", [])
    except json.JSONDecodeError:
        return None
    return sum(int(r.get("res", 0) or 0) for r in rows)
