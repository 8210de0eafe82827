"""The common shape every input is parsed into: a named set of per-run samples keyed by cell.

A *cell* is one point of the design: (operation, file size, record size). A *run* is one repetition of
the whole design (one IOzone output file, one fio JSON file, one `repetition` of a zbdlab study).
Throughput is kept in the original comparator's unit, MB/s = IOzone KB/s / 1024 = bytes/s / 2**20,
so its printed numbers can be checked against ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from zbdlab.results.schema import IOZONE_OPERATIONS

BYTES_PER_MB = 1024 * 1024
THROUGHPUT_UNIT = "MB/s"


# Other spellings users type for `--detail`: the original tool's short names and IOzone's headings.
_ALIASES = {
    "iwrite": "write",
    "irewrite": "rewrite",
    "iread": "read",
    "ireread": "reread",
    "randrd": "random_read",
    "randread": "random_read",
    "randwr": "random_write",
    "randwrite": "random_write",
    "bkwdrd": "backward_read",
    "bkwdread": "backward_read",
    "backwardsread": "backward_read",
    "recrewr": "record_rewrite",
    "recordrewrite": "record_rewrite",
    "strdrd": "stride_read",
    "strideread": "stride_read",
    "stridedread": "stride_read",
}


class InputError(Exception):
    """Bad or unusable input; the message is a one-line explanation for the user."""


def canonical_operation(name: str) -> str:
    """Map any accepted spelling of an operation to its canonical name (unknown names are kept)."""
    squashed = re.sub(r"[^a-z0-9]", "", name.lower())
    if squashed in _ALIASES:
        return _ALIASES[squashed]
    for op in IOZONE_OPERATIONS:
        if squashed == op.replace("_", ""):
            return op
    return re.sub(r"[^a-z0-9@:]+", "_", name.lower()).strip("_")


def operation_order(op: str) -> tuple[int, str]:
    """Sort key: IOzone's column order first, everything else alphabetically after."""
    base = op.split("@")[0].split(":")[-1]
    if base in IOZONE_OPERATIONS:
        return (IOZONE_OPERATIONS.index(base), op)
    return (len(IOZONE_OPERATIONS), op)


@dataclass(frozen=True, order=True)
class CellKey:
    operation: str
    file_size_kb: int | None
    record_size_kb: int | None

    def label(self) -> str:
        return f"{self.operation} fs={_kb(self.file_size_kb)} rs={_kb(self.record_size_kb)}"


def _kb(value: int | None) -> str:
    return "-" if value is None else str(value)


@dataclass
class Sample:
    """One measured value of one cell in one run, plus optional efficiency metrics (zbdlab, fio)."""

    cell: CellKey
    run: str
    value: float  # throughput in MB/s (or `unit` when the source has no throughput)
    unit: str = THROUGHPUT_UNIT
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class DataSet:
    name: str
    source: str
    kind: str  # "iozone" | "fio" | "zbdlab"
    samples: list[Sample] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how it was measured (e.g. a throttled disk)
    # the study's options of the target measured (environment.json "targets"), when known: fs, zbd,
    # transport, throttle... The report finds each zbd target's transport baseline with them.
    target: dict[str, Any] = field(default_factory=dict)

    def operations(self) -> list[str]:
        return sorted({s.cell.operation for s in self.samples}, key=operation_order)

    def units(self) -> dict[str, str]:
        return {s.cell.operation: s.unit for s in self.samples}
