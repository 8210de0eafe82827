"""Turn a study's workload tables into Workload objects.

Built-in kinds go through `zbdlab.workloads.from_config(name, table)`; `kind = "custom"` loads
`factory = "module:callable"` (same signature), for workloads outside zbdlab (and the runner's tests).
A WorkloadConfigError(key, problem) becomes a study-file error naming `workloads.<name>.<key>`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from zbdlab.config import ConfigError, WorkloadSpec
from zbdlab.workloads.base import Workload

Factory = Callable[[str, dict[str, Any]], Workload]


def _builtin() -> Factory | None:
    try:
        module = importlib.import_module("zbdlab.workloads")
    except ImportError:
        return None
    return getattr(module, "from_config", None)


def _custom(source: str, spec: WorkloadSpec) -> Factory:
    ref = spec.table.get("factory")
    key = f"{spec.key}.factory"
    if not isinstance(ref, str) or ":" not in ref:
        raise ConfigError(source, key, "kind 'custom' needs factory = \"module:callable\"")
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(source, key, f"cannot import {module_name!r}: {exc}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(source, key, f"{module_name} has no callable {attr!r}")
    return factory


def build(source: str, spec: WorkloadSpec) -> Workload:
    if spec.kind == "custom":
        factory = _custom(source, spec)
        table = {k: v for k, v in spec.table.items() if k not in ("kind", "factory")}
    else:
        builtin = _builtin()
        if builtin is None:
            raise ConfigError(
                source,
                f"{spec.key}.kind",
                f"workload kind {spec.kind!r} is not available in this zbdlab build",
            )
        # The workloads package picks the kind by a `type` key; the study file says `kind`.
        table = {k: v for k, v in spec.table.items() if k != "kind"}
        table["type"] = spec.kind
        factory = builtin
    try:
        workload = factory(spec.name, table)
    except Exception as exc:
        if type(exc).__name__ == "WorkloadConfigError":
            key = str(getattr(exc, "key", "") or "")
            if key == "type":
                key = "kind"
            problem = getattr(exc, "problem", None) or str(exc)
            named = f"{spec.key}.{key}" if key and not key.startswith("(") else spec.key
            raise ConfigError(source, named, problem) from None
        raise
    return workload
