"""The lead of a report: one row per target with the space it saves and its speed against the
baseline and against its transport baseline, each with one verdict; and the one note that says how
verdicts are reached (the significance story, told once for the terminal and the HTML page).

Speed is the primary comparison over all throughput operations (geometric mean of per-cell ratios,
`zbdlab.stats.compare`), and its word comes from that comparison's verdict, which needs the
Benjamini-Hochberg adjusted p below alpha. The transport baseline of a target on zbd is the target
with the same filesystem on `nbdkit file` through the same NBD attach path (`transport = "nbdkit"`),
so "vs transport" shows what zbd costs beyond the path it is attached by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from zbdlab.parsers.model import DataSet
from zbdlab.stats.compare import ALL, Analysis, Primary, analyse
from zbdlab.stats.tests import TEST_LABELS


@dataclass
class LeadRow:
    name: str
    role: str  # "baseline" | "transport baseline" | ""
    compression_ratio: float  # median over runs and operations; NaN when not measured
    space: str  # "smaller" | "same size" | "larger" | "" (not measured)
    vs_base: Primary | None
    verdict_base: str
    transport: str  # name of this target's transport baseline, "" when it has none
    vs_transport: Primary | None = None
    verdict_transport: str = ""

    @property
    def saved_pct(self) -> float:
        return (1 - 1 / self.compression_ratio) * 100 if self.compression_ratio > 0 else math.nan


@dataclass
class Lead:
    baseline: str
    rows: list[LeadRow]
    transport_analyses: list[Analysis] = field(default_factory=list)


def compression_ratio(data: DataSet) -> float:
    ratios = [s.metrics["compression_ratio"] for s in data.samples if "compression_ratio" in s.metrics]
    return float(np.median(ratios)) if ratios else math.nan


def space_word(ratio: float, margin: float) -> str:
    if not math.isfinite(ratio):
        return ""
    if ratio >= 1 + margin:
        return "smaller"
    if ratio <= 1 - margin:
        return "larger"
    return "same size"


def speed_word(primary: Primary | None) -> str:
    if primary is None:
        return ""
    if primary.significant:
        return primary.verdict  # "faster" | "slower"
    if primary.qualifier in ("equivalent", "below margin"):
        return "as fast"
    return "speed unclear"


def verdict(space: str, speed: str) -> str:
    """One phrase: "smaller and as fast", "smaller, slower", "same size, slower"..."""
    if not space or not speed:
        return space or speed
    good = space in ("smaller", "same size") and speed in ("faster", "as fast")
    return f"{space} and {speed}" if good else f"{space}, {speed}"


def _is_transport(data: DataSet) -> bool:
    return bool(data.target.get("transport")) and not data.target.get("zbd")


def transport_of(data: DataSet, candidates: list[DataSet]) -> DataSet | None:
    """The transport baseline of a target on zbd: same filesystem (and throttling, and server page
    cache policy; results from before that option had none, read as "host") on the plain NBD export
    through the same attach path."""
    if not data.target.get("zbd"):
        return None
    for other in candidates:
        if (
            _is_transport(other)
            and other.target.get("fs") == data.target.get("fs")
            and other.target.get("throttle") == data.target.get("throttle")
            and (other.target.get("server_cache") or "host") == (data.target.get("server_cache") or "host")
        ):
            return other
    return None


def build_lead(analysis: Analysis) -> Lead:
    margin = analysis.options.margin
    transports: dict[str, tuple[DataSet, list[DataSet]]] = {}
    pairs: dict[str, str] = {}
    for data in analysis.others:
        if (t := transport_of(data, analysis.sets)) is not None:
            transports.setdefault(t.name, (t, []))[1].append(data)
            pairs[data.name] = t.name
    versus: dict[str, Primary | None] = {}
    transport_analyses = []
    for t, sets in transports.values():
        sub = analyse([t, *sets], analysis.options)
        transport_analyses.append(sub)
        versus.update({d.name: sub.primary(d.name, ALL) for d in sets})
    rows = []
    for data in analysis.sets:
        ratio = compression_ratio(data)
        space = space_word(ratio, margin)
        if data is analysis.baseline:
            rows.append(LeadRow(data.name, "baseline", ratio, space, None, "", ""))
            continue
        vs_base = analysis.primary(data.name, ALL)
        row = LeadRow(
            data.name,
            "transport baseline" if _is_transport(data) else "",
            ratio,
            space,
            vs_base,
            verdict(space, speed_word(vs_base)),
            pairs.get(data.name, ""),
        )
        if row.transport:
            row.vs_transport = versus.get(data.name)
            row.verdict_transport = verdict(space, speed_word(row.vs_transport))
        rows.append(row)
    return Lead(analysis.baseline.name, rows, transport_analyses)


def significance_note(analysis: Analysis) -> list[str]:
    """How a verdict is reached and what the per-cell tests can show: the only place it is said."""
    o = analysis.options
    conf = round(o.confidence * 100)
    lines = [
        f"Speed is the geometric mean over cells of per-cell mean ratios with a {conf} % bootstrap interval "
        f"over runs. A change is called faster or slower only when it lies beyond ±{o.margin * 100:g} % and "
        f"its bootstrap p, adjusted for all comparisons of that target (Benjamini-Hochberg q), is below "
        f"{o.alpha:g}; within ±{o.margin * 100:g} % it is as fast; otherwise no verdict (more runs needed)."
    ]
    label = TEST_LABELS[o.test]
    blind = {}  # set -> (designs, smallest reachable p) when none of its per-cell tests can reach alpha
    for data in analysis.others:
        tests = analysis.tests_for(data.name)
        floors = [t.smallest_p for t in tests if math.isfinite(t.smallest_p)]
        if floors and min(floors) >= o.alpha:
            designs = sorted({f"{t.n_baseline}+{t.n_set}" for t in tests})
            blind[data.name] = ("/".join(designs), min(floors))
    if blind:
        if len(blind) == len(analysis.others) and len({d for d, _ in blind.values()}) == 1:
            where = f"with {next(iter(blind.values()))[0]} runs"
        else:
            where = "for " + ", ".join(f"{name} ({d} runs)" for name, (d, _) in blind.items())
        floor = min(p for _, p in blind.values())
        lines.append(
            f"Per-cell {label} tests (secondary, in the operation sections) cannot show a difference "
            f"{where}: the smallest p they can reach is {floor:.2g}, not below {o.alpha:g}. "
            f"The verdicts do not use them."
        )
    elif analysis.cell_tests:
        lines.append(
            f"Per-cell {label} tests, Benjamini-Hochberg adjusted per target, are a secondary check shown "
            f"in the operation sections; the verdicts do not use them."
        )
    return lines
