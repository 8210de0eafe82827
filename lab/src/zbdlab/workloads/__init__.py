"""Workloads run with real tools (fio, postmark, cp/tar): render -> run -> parse.

`from_config(name, table)` builds a workload from its study-file table; every key is documented in
docs/workloads.md. The table's `type` key picks the kind; without it the workload's name does.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from zbdlab.workloads.base import (
    Cell,
    DataSpec,
    Measurement,
    RunContext,
    Workload,
    WorkloadConfigError,
    WorkloadError,
)

__all__ = [
    "Cell",
    "DataSpec",
    "Measurement",
    "RunContext",
    "Workload",
    "WorkloadConfigError",
    "WorkloadError",
    "WORKLOAD_TYPES",
    "from_config",
]


def _builders() -> dict[str, Callable[[str, dict[str, Any]], Workload]]:
    # Imported here so `import zbdlab.workloads` stays cheap and free of cycles.
    from zbdlab.workloads import copy, iozone, personalities, postmark

    builders: dict[str, Callable[[str, dict[str, Any]], Workload]] = {
        "iozone": iozone.iozone_from_config,
        "throughput": iozone.throughput_from_config,
        "postmark": postmark.from_config,
        "copy": copy.from_config,
    }
    for personality in personalities.PERSONALITIES:
        builders[personality] = personalities.from_config
    return builders


WORKLOAD_TYPES = ("iozone", "throughput", "postmark", "fileserver", "varmail", "webserver", "oltp", "copy")


def from_config(name: str, table: dict[str, Any], runner_keys: Collection[str] = ()) -> Workload:
    """Build the workload `name` from its study-file table; bad values raise WorkloadConfigError.
    Unknown keys are refused, except `runner_keys`: keys the runner reads itself from the same table."""
    if not isinstance(table, dict):
        raise WorkloadConfigError("(table)", f"expected a table, got {type(table).__name__}")
    table = {key: value for key, value in table.items() if key not in runner_keys}
    kind = table.get("type", name)
    builders = _builders()
    if kind not in builders:
        key = "type" if "type" in table else "(name)"
        raise WorkloadConfigError(key, f"unknown workload type {kind!r}; one of {', '.join(WORKLOAD_TYPES)}")
    return builders[kind](name, table)
