"""Which runs a study makes, and in what order.

A *unit* is one execution of one workload cell on one target in one repetition; it yields one run
(row) per operation. Units sharing an *instance key* run on the same provisioned target instance
(format = "repetition": one fresh filesystem per target and repetition; "run": one per unit; "once":
one per target for the whole study).

cold: repetition by repetition, the instance groups of that repetition in a seeded random order,
      units inside a group shuffled too, so targets are interleaved and drift hits all alike.
warm: each target's units together, in study order; the first repetition of every cell is run but
      marked discarded (it warms the cache), as in seed 004.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from zbdlab.config import Study
from zbdlab.workloads.base import Cell

_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]+")


@dataclass(frozen=True)
class Unit:
    unit_id: str
    target: str
    workload: str
    cell: Cell
    repetition: int  # 1-based
    instance_key: str
    discarded: bool


def safe(text: str) -> str:
    return _UNSAFE.sub("_", text)


def units_of(study: Study, cells: dict[str, list[Cell]]) -> list[Unit]:
    """Every unit in the study's stable order (target, repetition, workload, cell)."""
    out: list[Unit] = []
    for target in study.targets:
        for rep in range(1, study.repetitions + 1):
            for wl in study.workloads:
                for cell in cells[wl.name]:
                    unit_id = safe(f"{target.name}.r{rep:02d}.{wl.name}.{cell.key}")
                    key = {
                        "repetition": f"{target.name}.r{rep:02d}",
                        "run": unit_id,
                        "once": target.name,
                    }[study.format]
                    discarded = study.cache == "warm" and rep == 1 and study.repetitions > 1
                    out.append(Unit(unit_id, target.name, wl.name, cell, rep, key, discarded))
    ids = [u.unit_id for u in out]
    if len(set(ids)) != len(ids):
        raise ValueError("two workload cells share a key; cell keys must be unique within a workload")
    return out


def order_units(study: Study, units: list[Unit], seed: int) -> list[Unit]:
    if study.cache == "warm":
        if study.format == "once":
            # one instance per target: keep each cell's repetitions back to back (truly warm)
            return sorted(
                units, key=lambda u: (_target_index(study, u.target), u.workload, u.cell.key, u.repetition)
            )
        return list(units)
    rng = random.Random(seed)
    ordered: list[Unit] = []
    for rep in range(1, study.repetitions + 1):
        groups: dict[str, list[Unit]] = {}
        for u in units:
            if u.repetition == rep:
                groups.setdefault(u.unit_id if study.format == "once" else u.instance_key, []).append(u)
        keys = list(groups)
        rng.shuffle(keys)
        for key in keys:
            group = groups[key]
            rng.shuffle(group)
            ordered.extend(group)
    return ordered


def _target_index(study: Study, name: str) -> int:
    return next(i for i, t in enumerate(study.targets) if t.name == name)
