"""Run order: cold interleaves targets in a seeded random order; warm keeps a target's runs together
and discards the first repetition of each cell."""

from __future__ import annotations

from zbdlab.config import parse_study
from zbdlab.runner import plan
from zbdlab.workloads.base import Cell

STUDY = """
version = 1
repetitions = 4
cache = "{cache}"
format = "{fmt}"
[[targets]]
name = "a"
fs = "ext4"
[[targets]]
name = "b"
fs = "xfs"
[[targets]]
name = "c"
fs = "btrfs"
[workloads.w]
kind = "custom"
factory = "run_tinyload:make"
"""
CELLS = {"w": [Cell(file_size_bytes=1 << 20), Cell(file_size_bytes=2 << 20)]}


def units(cache: str, fmt: str = "repetition") -> tuple[object, list[plan.Unit]]:
    study = parse_study(STUDY.format(cache=cache, fmt=fmt))
    return study, plan.units_of(study, CELLS)


def test_cold_order_is_seeded_interleaved_and_complete() -> None:
    study, us = units("cold")
    first = plan.order_units(study, us, seed=1)
    assert first == plan.order_units(study, us, seed=1), "same seed, same order"
    assert [u.unit_id for u in first] != [u.unit_id for u in plan.order_units(study, us, seed=2)]
    assert sorted(u.unit_id for u in first) == sorted(u.unit_id for u in us)
    assert not any(u.discarded for u in first)
    # every target runs repetition r before any target runs r+1 (targets interleaved in time)
    reps = [u.repetition for u in first]
    assert reps == sorted(reps)
    # one instance's units stay together, so only one filesystem per target is live at a time
    keys = [u.instance_key for u in first]
    assert len([k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]) == len(set(keys))


def test_warm_keeps_targets_together_and_discards_first_repetition() -> None:
    study, us = units("warm")
    order = plan.order_units(study, us, seed=1)
    targets = [u.target for u in order]
    assert targets == sorted(targets, key="abc".index)
    discarded = [u for u in order if u.discarded]
    assert {u.repetition for u in discarded} == {1}
    assert len(discarded) == 3 * 2  # first repetition of each cell on each target


def test_once_format_shares_one_instance_per_target() -> None:
    study, us = units("warm", "once")
    order = plan.order_units(study, us, seed=1)
    assert {u.instance_key for u in order} == {"a", "b", "c"}
    a = [u for u in order if u.target == "a" and u.cell.file_size_bytes == 1 << 20]
    assert [u.repetition for u in a] == [1, 2, 3, 4], "repetitions of a cell back to back (warm)"
