"""What a reproduction is: the seed's published numbers, how we measure ours, how the two compare.

A `Reproduction` is a small declarative entry (one per headline figure or table of a seed); running it
gives an `Outcome`, a plain JSON-able record that the renderer turns into Markdown and HTML. Outcomes
are stored one file per entry, which is what makes `zbdlab reproduce` resumable.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zbdlab.reproduce.context import Context

# The three verdicts of the issue, in order of agreement.
SAME = "same direction and size"
SAME_DIRECTION = "same direction, different size"
DIFFERENT = "different"
NOT_RUN = "not reproduced"


@dataclass(frozen=True)
class Cite:
    """Where a number comes from. The seeds are text renditions without page breaks, so `page` is the
    document's own page number where its table of contents gives one, else "-", and `line` is the
    line in /work/shared/seeds/<file> so a reader can check the number."""

    doc: str  # e.g. "002 (ZBD paper, FORTH)"
    where: str  # e.g. "Table I" or "Fig. 2, section IV-A"
    page: str
    line: int

    @property
    def text(self) -> str:
        page = f", p. {self.page}" if self.page != "-" else ""
        return f"seed {self.doc}, {self.where}{page} (seed text line {self.line})"


@dataclass
class Table:
    """Rows of numbers with a header; the first column labels the row."""

    columns: list[str]
    rows: list[list[Any]]
    unit: str = ""

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [row[i] for row in self.rows]

    def value(self, row_label: str, column: str) -> Any:
        i = self.columns.index(column)
        for row in self.rows:
            if row[0] == row_label:
                return row[i]
        return None


@dataclass
class Verdict:
    kind: str  # SAME | SAME_DIRECTION | DIFFERENT
    reason: str


@dataclass
class Measured:
    """What running our side gives: the table in the seed's shape, plus what went into it. What was
    run (zbdlab run ..., zbd bench ...) is not here: the Context records every command it runs."""

    table: Table
    notes: list[str] = field(default_factory=list)  # how it was measured, anything a reader must know
    extra: dict[str, Any] = field(default_factory=dict)  # anything compare() needs besides the table


@dataclass(frozen=True)
class Part:
    """One piece of a figure's planned work: `units` of one kind (a study's units, a bench), each
    costing about `s_per_unit` seconds on a quiet 2-core machine, plus `fixed_s` once (provisioning,
    formatting, the throttle probe). The per-unit costs are measured (docs/reproduction.md, Time), so
    a figure's run time is designed, not found out."""

    label: str
    units: int
    s_per_unit: float
    fixed_s: float = 0.0

    @property
    def seconds(self) -> float:
        return self.fixed_s + self.units * self.s_per_unit


def planned_seconds(parts: list[Part]) -> float:
    return sum(p.seconds for p in parts)


def _unplanned(_quick: bool) -> list[Part]:
    return []


@dataclass(frozen=True)
class Reproduction:
    name: str  # e.g. "002-table1"; --only takes it
    title: str
    cite: Cite
    seed: Table  # the seed's numbers, as published
    seed_setup: str  # what the seed measured on
    scaling: Callable[[bool], str]  # quick -> what we changed (sizes, durations, disks) and why
    measure: Callable[[Context], Measured]
    compare: Callable[[Table, Measured], Verdict]
    substitute: str = ""  # non-empty when the seed's setup cannot exist here: what stands in for it
    plot: str = "bar"  # "bar" (rows x numeric columns), "line" (x = first column), "none"
    plot_columns: tuple[str, ...] = ()  # ours: only these columns are drawn (all numeric ones if empty)
    small: bool = False  # cheap enough for the test suite's end-to-end run
    plan: Callable[[bool], list[Part]] = _unplanned  # quick -> the planned work and its cost


@dataclass
class Outcome:
    """One reproduction's result, as stored in DIR/<name>/outcome.json and rendered."""

    name: str
    title: str
    cite: str
    seed_setup: str
    seed: dict[str, Any]
    ours: dict[str, Any] | None
    scaling: str
    substitute: str
    verdict: str
    reason: str
    notes: list[str]
    commands: list[str]
    plot: str
    quick: bool
    elapsed_s: float
    error: str = ""
    plot_columns: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def table_dict(table: Table) -> dict[str, Any]:
    return {"columns": table.columns, "rows": table.rows, "unit": table.unit}


def table_of(data: dict[str, Any]) -> Table:
    return Table(list(data["columns"]), [list(r) for r in data["rows"]], data.get("unit", ""))


# --- verdict helpers ------------------------------------------------------------------------------


def sign(value: float, dead_band: float = 0.0) -> int:
    if math.isnan(value) or abs(value) <= dead_band:
        return 0
    return 1 if value > 0 else -1


def change_verdict(what: str, seed_pct: float, ours_pct: float, tolerance_pp: float = 10.0) -> Verdict:
    """Compare two relative changes in percent (e.g. "+69 %" against "+12 %").

    Same size: within `tolerance_pp` percentage points, or within half of the seed's change; same
    direction: both above, both below or both within `tolerance_pp / 2` of zero."""
    band = tolerance_pp / 2
    s, o = sign(seed_pct, band), sign(ours_pct, band)
    text = f"{what}: seed {seed_pct:+.0f} %, ours {ours_pct:+.0f} %"
    if s != o:
        return Verdict(DIFFERENT, text)
    if abs(seed_pct - ours_pct) <= max(tolerance_pp, abs(seed_pct) / 2):
        return Verdict(SAME, text)
    return Verdict(SAME_DIRECTION, text)


def worst(verdicts: list[Verdict]) -> Verdict:
    """The least agreeing of several verdicts, with every reason kept."""
    order = [SAME, SAME_DIRECTION, DIFFERENT]
    kind = max((v.kind for v in verdicts), key=order.index, default=SAME)
    return Verdict(kind, "; ".join(v.reason for v in verdicts))


def pct_change(new: float, base: float) -> float:
    return (new / base - 1) * 100 if base else math.nan
