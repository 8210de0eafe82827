"""Reading a workload's study-file table: sizes, lists and choices, with errors that name the key.

Every workload builds its settings through `Table`, so a bad value always becomes a
`WorkloadConfigError(key, problem)` and an unknown key is refused instead of silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from zbdlab.workloads.base import WorkloadConfigError

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: Any, key: str) -> int:
    """ "64M", "4K", "1.5G", "512" or an integer -> bytes (binary units, like IOzone and fio)."""
    if isinstance(value, bool):
        raise WorkloadConfigError(key, f'expected a size like "64M", got {value!r}')
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (match := _SIZE_RE.match(value)):
        size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    else:
        raise WorkloadConfigError(key, f'expected a size like "64M" or "4K", got {value!r}')
    if size <= 0:
        raise WorkloadConfigError(key, f"size must be positive, got {value!r}")
    return size


def format_size(size: int) -> str:
    """Bytes -> the shortest exact fio size string ("64m", "4k", "1000")."""
    for suffix, unit in (("t", 1 << 40), ("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


class Table:
    """A study-file table being read; `done()` refuses keys nobody asked for."""

    def __init__(self, table: dict[str, Any], *, ignore: Sequence[str] = ("type",)) -> None:
        if not isinstance(table, dict):
            raise WorkloadConfigError("(table)", f"expected a table, got {type(table).__name__}")
        self._table = table
        self._seen: set[str] = set(ignore)

    def has(self, key: str) -> bool:
        return key in self._table

    def raw(self, key: str, default: Any = None) -> Any:
        self._seen.add(key)
        return self._table.get(key, default)

    def size(self, key: str, default: int | str) -> int:
        return parse_size(self.raw(key, default), key)

    def sizes(self, key: str, default: Sequence[str]) -> list[int]:
        values = self.raw(key, list(default))
        if not isinstance(values, list) or not values:
            raise WorkloadConfigError(key, f"expected a non-empty list of sizes, got {values!r}")
        return [parse_size(v, f"{key}[{i}]") for i, v in enumerate(values)]

    def integer(self, key: str, default: int, *, low: int = 1, high: int = 1 << 30) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise WorkloadConfigError(key, f"expected an integer, got {value!r}")
        if not low <= value <= high:
            raise WorkloadConfigError(key, f"must be between {low} and {high}, got {value}")
        return value

    def integers(self, key: str, default: Sequence[int], *, low: int = 1, high: int = 1 << 20) -> list[int]:
        values = self.raw(key, list(default))
        if isinstance(values, int) and not isinstance(values, bool):
            values = [values]
        if not isinstance(values, list) or not values:
            raise WorkloadConfigError(key, f"expected an integer or a non-empty list, got {values!r}")
        out = []
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise WorkloadConfigError(f"{key}[{i}]", f"expected an integer in {low}..{high}, got {v!r}")
            out.append(v)
        return out

    def number(self, key: str, default: float, *, low: float, high: float) -> float:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WorkloadConfigError(key, f"expected a number, got {value!r}")
        if not low <= value <= high:
            raise WorkloadConfigError(key, f"must be between {low} and {high}, got {value}")
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise WorkloadConfigError(key, f"expected true or false, got {value!r}")
        return value

    def string(self, key: str, default: str | None) -> str | None:
        value = self.raw(key, default)
        if value is not None and not isinstance(value, str):
            raise WorkloadConfigError(key, f"expected a string, got {value!r}")
        return value

    def choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        value = self.raw(key, default)
        if value not in choices:
            raise WorkloadConfigError(key, f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    def choices(self, key: str, default: Sequence[str], choices: Sequence[str]) -> list[str]:
        values = self.raw(key, list(default))
        if not isinstance(values, list) or not values:
            raise WorkloadConfigError(key, f"expected a non-empty list, got {values!r}")
        for i, v in enumerate(values):
            if v not in choices:
                raise WorkloadConfigError(f"{key}[{i}]", f"must be one of {', '.join(choices)}; got {v!r}")
        if len(set(values)) != len(values):
            raise WorkloadConfigError(key, f"lists an entry twice: {values!r}")
        return list(values)

    def done(self) -> None:
        unknown = sorted(set(self._table) - self._seen)
        if unknown:
            raise WorkloadConfigError(unknown[0], "unknown key (see docs/workloads.md)")
