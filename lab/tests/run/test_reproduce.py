"""`zbdlab reproduce`: the renderer against golden files, the entries' declarations, and one small
figure end to end (a real study on loop devices it creates and removes, and `zbdlab compare`).

Regenerate the golden files with ZBDLAB_UPDATE_GOLDEN=1 after a deliberate change of the pages."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from conftest import loops_over, mounts_under, run_zbdlab

from zbdlab.reproduce import pipeline
from zbdlab.reproduce.model import DIFFERENT, SAME, SAME_DIRECTION, Outcome, change_verdict
from zbdlab.reproduce.render import render_html, render_markdown

GOLDEN = Path(__file__).parent / "golden"
SEEDS = Path(os.environ.get("ZBDLAB_SEEDS", Path(__file__).resolve().parents[3].parent / "shared" / "seeds"))

HEADER = {
    "command": "zbdlab reproduce --quick -o out",
    "commit": "abc1234",
    "date": "2026-01-01 00:00 UTC",
    "machine": "m",
}


def outcomes() -> list[Outcome]:
    seed = {
        "columns": ["codec", "compression (us)"],
        "rows": [["lzo", 46], ["zlib", 150]],
        "unit": "per 4 KiB",
    }
    ours = {
        "columns": ["codec", "compression (us)"],
        "rows": [["lzo", 12.5], ["zlib", math.nan]],
        "unit": "per 4 KiB",
    }
    common = dict(seed_setup="Xeon | 2 GHz", seed=seed, plot="bar", quick=True, elapsed_s=3.2)
    return [
        Outcome(
            name="002-table1",
            title="Codec <cost>",
            cite="seed 002, Table I (seed text line 104)",
            ours=ours,
            scaling="none",
            substitute="",
            verdict=SAME_DIRECTION,
            reason="zlib costs 3.3x lzo there, 2.0x here",
            notes=["data: sample"],
            commands=["zbd bench codec --json"],
            **common,
        ),
        Outcome(
            name="004-filebench",
            title="Filebench",
            cite="seed 004, section 5.1.1, p. 20 (seed text line 406)",
            ours=None,
            scaling="1/50",
            substitute="fio personalities stand in",
            verdict="not reproduced",
            reason="failed: zbdlab run failed",
            notes=[],
            commands=["zbdlab run x.toml"],
            error="StepFailed: zbdlab run failed",
            **common,
        ),
    ]


@pytest.mark.parametrize(
    ("name", "render"), [("reproduction.md", render_markdown), ("reproduction.html", render_html)]
)
def test_renderer_matches_golden(name: str, render: object) -> None:
    text = render(outcomes(), HEADER, {"002-table1": "plots/002-table1.png"})  # type: ignore[operator]
    golden = GOLDEN / name
    if os.environ.get("ZBDLAB_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


def test_change_verdicts() -> None:
    assert change_verdict("x", 69, 60).kind == SAME
    assert change_verdict("x", 69, 10).kind == SAME_DIRECTION
    assert change_verdict("x", 69, -20).kind == DIFFERENT
    assert change_verdict("x", -12, 2).kind == DIFFERENT  # within the dead band is "no change"


def test_entries_are_declared_completely() -> None:
    names = [e.name for e in pipeline.ENTRIES]
    assert len(names) == len(set(names))
    for e in pipeline.ENTRIES:
        assert e.seed.rows and all(len(r) == len(e.seed.columns) for r in e.seed.rows), e.name
        assert e.scaling(True) and e.scaling(False), e.name


def _spellings(value: float) -> set[str]:
    v = abs(value)
    text = f"{v:g}" if v != int(v) else str(int(v))
    return {text, text.replace(".", ","), f"{v:,.0f}" if v >= 1000 else text}


@pytest.mark.skipif(not SEEDS.is_dir(), reason="seed texts not present (../shared/seeds)")
def test_seed_numbers_are_in_the_seed_text() -> None:
    """Every number an entry attributes to a seed occurs in that seed's text (derived columns, marked
    "vs", excepted), and the cited line is next to at least one of them."""
    for e in pipeline.ENTRIES:
        (path,) = SEEDS.glob(f"{e.cite.doc[:3]}_*.txt")
        text = path.read_text()
        lines = text.splitlines()
        window = " ".join(lines[max(0, e.cite.line - 4) : e.cite.line + 3])
        cited = [
            v
            for row in e.seed.rows
            for col, v in zip(e.seed.columns[1:], row[1:], strict=True)
            if isinstance(v, int | float) and not math.isnan(v) and " vs " not in col
        ]
        for v in cited:
            assert any(s in text for s in _spellings(v)), (e.name, v)
        if cited:
            assert any(s in window for v in cited for s in _spellings(v)), (e.name, e.cite.line)


@pytest.mark.needs_root
def test_quick_only_one_figure_end_to_end(tmp_path: Path) -> None:
    """001-compare: IOzone on ext4 and XFS loop devices, `zbdlab compare`, the pages; nothing left behind."""
    out = tmp_path / "repro"
    proc = run_zbdlab("reproduce", "--quick", "--only", "001-compare", "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    stored = json.loads((out / "001-compare" / "outcome.json").read_text())
    assert stored["error"] == ""
    assert stored["verdict"] in (SAME, SAME_DIRECTION, DIFFERENT)
    ops = {row[0]: row for row in stored["ours"]["rows"]}
    assert set(ops) == {"write", "reread"} and all(isinstance(ops[o][1], float) for o in ops)
    assert (out / "001-compare" / "compare" / "index.html").is_file()  # the comparison tool's own page
    page = (out / "reproduction.md").read_text()
    assert "## 001-compare" in page and "Verdict:" in page
    assert (out / "reproduction.html").read_text().count("<h2") == 1
    # everything the study made is gone: its scratch directory (images, mounts), loop devices
    plan = json.loads((out / "001-compare" / "study" / "plan.json").read_text())
    for scratch in plan["scratch_dirs"]:
        assert not Path(scratch).exists(), scratch
        assert not mounts_under(Path(scratch))
        assert not loops_over([f"{scratch}/"]), scratch
    # a second run resumes: the stored outcome is kept, nothing runs again
    again = run_zbdlab("reproduce", "--quick", "--only", "001-compare", "-o", str(out))
    assert again.returncode == 0 and "already reproduced" in again.stderr


def test_unknown_only_is_a_one_line_error(tmp_path: Path) -> None:
    proc = run_zbdlab("reproduce", "--only", "nope", "-o", str(tmp_path))
    assert proc.returncode == 2
    assert (
        proc.stderr.strip().splitlines() == [proc.stderr.strip()]
        and "no reproduction named 'nope'" in proc.stderr
    )


def test_every_generated_study_is_valid_at_both_sizes() -> None:
    """Each entry's study files parse and their workloads build (what `zbdlab run` checks before it
    touches a device), quick and full: a mistake shows here, not 20 minutes into a reproduction."""
    from zbdlab.config import parse_study
    from zbdlab.reproduce import seed000, seed001, seed002, seed003, seed004
    from zbdlab.runner import factory

    makers = [
        lambda quick: seed002.fig2_study(quick, 1),
        lambda quick: seed002.fig2_study(quick, 2),
        seed002.fig10_study,
        seed002.fig11_study,
        seed000.study,
        seed001.postmark_study,
        seed001.iozone_study,
        seed003.study,
        seed004.study,
    ]
    for make in makers:
        for quick in (True, False):
            study = parse_study(make(quick), source=f"{make.__module__}.{make.__qualname__}")
            for spec in study.workloads:
                assert list(factory.build(study.source, spec).cells()), (study.source, spec.name)


def test_study_builders_give_the_keys_asked_for_and_no_others() -> None:
    import tomllib

    from zbdlab.reproduce.studies import study_head, target, zbd_table

    tool = tomllib.loads(study_head("x: y", "repro-x", repetitions=2, cache="warm", seed=7))
    assert tool == {
        "version": 1,
        "name": "repro-x",
        "repetitions": 2,
        "cache": "warm",
        "seed": 7,
        "data": {"kind": "tool"},
    }
    head = study_head(
        "x",
        "n",
        repetitions=1,
        cache="cold",
        seed=1,
        compress_percentage=50,
        format="once",
        memory_limit="16M",
    )
    assert head.startswith("# zbdlab reproduce x\n") and head.endswith("\n\n")
    synthetic = tomllib.loads(head)
    assert synthetic["data"] == {"kind": "synthetic", "compress_percentage": 50}
    assert (synthetic["format"], synthetic["memory_limit"]) == ("once", "16M")
    text = (
        target("a", "xfs", "1G")
        + "\n"
        + target(
            "b",
            "xfs",
            "2G",
            devices=3,
            throttle='{ rate = "100M" }',
            lines=zbd_table(codec="lzo", extent_size="8K"),
        )
    )
    a, b = tomllib.loads(text)["targets"]
    assert a == {"name": "a", "fs": "xfs", "size": "1G"}
    assert b == {
        "name": "b",
        "fs": "xfs",
        "size": "2G",
        "devices": 3,
        "throttle": {"rate": "100M"},
        "zbd": {"codec": "lzo", "extent_size": "8K"},
    }


def test_spread_note_gives_the_interval_or_says_there_is_none() -> None:
    from zbdlab.reproduce.context import spread_note
    from zbdlab.stats.describe import describe

    note = spread_note("tps", {("native",): describe([10.0, 12.0, 14.0]), ("zbd",): describe([7.0])})
    assert note.startswith("tps, median per repetition set: native 12 (90 % CI of the mean 8.6")
    assert "n=3" in note and "zbd 7 (1 run, no interval)" in note


def test_medians_noted_is_medians_and_the_spread_note_of_the_same_runs() -> None:
    from zbdlab.reproduce.context import by_target, medians, medians_noted, spread_note, spreads
    from zbdlab.results.schema import RunRecord

    records = [
        RunRecord(
            run_id=f"{t}{i}",
            target=t,
            workload="w",
            operation="write",
            repetition=i,
            iops=v,
            discarded=i == 0,
        )
        for t, values in (("native", [99.0, 10.0, 12.0, 14.0]), ("zbd", [99.0, 7.0, None, 9.0]))
        for i, v in enumerate(values)
    ]
    table, note = medians_noted("IOPS", records, by_target, lambda r: r.iops)
    assert table == medians(records, by_target, lambda r: r.iops) == {("native",): 12.0, ("zbd",): 8.0}
    assert note == spread_note("IOPS", spreads(records, by_target, lambda r: r.iops))


def test_the_sets_are_sized_to_their_budgets() -> None:
    """The run time is designed: every figure declares its work and cost per unit, and the sets'
    planned totals stay within what they are sized for (a design check, no timing measured here)."""
    from zbdlab.reproduce.model import planned_seconds

    for e in pipeline.ENTRIES:
        for quick in (True, False):
            parts = e.plan(quick)
            assert parts and all(p.units > 0 and p.s_per_unit > 0 for p in parts), (e.name, quick)
    full = sum(planned_seconds(e.plan(False)) for e in pipeline.ENTRIES)
    # the per-unit costs were measured on the shared machine (load 2-50): the full set fits its
    # budget even at those costs. The quick set does not yet (docs/reproduction.md, Time): its plan
    # is printed against the budget, not held to it here.
    assert full <= pipeline.FULL_BUDGET_S, f"full set planned at {full / 60:.1f} min"
    lines = pipeline.plan_lines(pipeline.ENTRIES, True)
    assert len(lines) == len(pipeline.ENTRIES) + 1 and lines[-1].startswith("planned: ")


def test_study_units_are_the_planners() -> None:
    from zbdlab.reproduce import seed002
    from zbdlab.reproduce.context import study_units

    # 7 targets (native, transport control, zbd with 5 codecs) x 4 repetitions x one PostMark cell;
    # quick 1 CPU keeps only ZBD (zlib)
    assert study_units(seed002.fig2_study(False, 2)) == 28
    assert study_units(seed002.fig2_study(False, 2, "ext4")) == 28
    assert study_units(seed002.fig2_study(True, 1)) == 4
    (fig10,) = seed002.FIG10.plan(False)
    # (extents + the transport control) x repetitions x (PostMark, reads)
    assert fig10.units == (len(seed002.EXTENTS_FULL) + 1) * 4 * 2


def test_eta_follows_the_pace_so_far() -> None:
    said: list[str] = []
    now = [0.0]
    eta = pipeline.Eta({"a": 100.0, "b": 300.0}, {"a": 10, "b": 30}, said.append, clock=lambda: now[0])
    eta.begin("a")
    now[0] = 100.0  # half of a's units in all of a's planned time: twice as slow as planned
    eta.advance(5)
    assert "5/10 units" in said[-1] and "pace 2.00x" in said[-1] and "12 % of the plan" in said[-1]
    assert "about 12 min left" in said[-1]  # (400 - 50) planned seconds at 2x
    eta.end()
    eta.begin("b")
    assert "25 % of the plan" in eta.status()


def test_an_interrupted_wait_stops_the_child_and_lets_it_clean_up(tmp_path: Path) -> None:
    """What `zbdlab reproduce` does with a running study when it is interrupted (SIGTERM, Ctrl-C):
    SIGTERM the child and wait for its teardown; before, the child ran on, holding its devices."""
    import subprocess
    import sys

    from zbdlab.reproduce.context import wait_child

    ready, cleaned = tmp_path / "ready", tmp_path / "cleaned"
    child = (
        "import pathlib, signal, sys, time\n"
        "def stop(*_):\n"
        f"    pathlib.Path({str(cleaned)!r}).write_text('torn down')\n"
        "    sys.exit(130)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"pathlib.Path({str(ready)!r}).write_text('')\n"
        "while True:\n"
        "    time.sleep(1)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", child])

    def poll() -> None:
        if ready.exists():
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        wait_child(proc, poll, 0.05)
    assert proc.returncode == 130
    assert cleaned.read_text() == "torn down"
