"""The lead of the report on the results `make demo` produced (lab/studies/quick.toml: plain ext4, the
transport baseline, btrfs lzo / zstd:1, ext4 on zbd lz4 / zstd:1; 3 runs): one table of space saved and
speed against ext4 and against the transport baseline with one verdict each, a terminal report that
fits 120 columns, and verdicts that never contradict the adjusted p printed beside them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zbdlab.cli.report import sets_from_dirs
from zbdlab.parsers.model import CellKey, DataSet, Sample
from zbdlab.parsers.results import load_results_dir
from zbdlab.report.lead import build_lead, significance_note
from zbdlab.report.render import write_all
from zbdlab.report.terminal import WIDTH, render_terminal
from zbdlab.stats.compare import ALL, Analysis, Options, analyse

from .conftest import write_results_dir

DEMO = Path(__file__).parent / "fixtures" / "demo_quick"
OPTIONS = Options(bootstrap=1000, seed=1)
LONG_NAMES = {
    "ext4-plain-baseline-on-loop": 1.0,
    "ext4-on-nbdkit-transport-baseline": 0.6,
    "btrfs-compress-force-lzo-default": 0.7,
    "ext4-on-zbd-lz4-extent-128k": 0.55,
    "btrfs-compress-force-zstd-level1": 0.65,
    "ext4-on-zbd-zstd-level1-extent-128k": 0.5,
    "ext4-on-zbd-none-extent-128k": 0.58,
}


@pytest.fixture(scope="module")
def demo() -> Analysis:
    return analyse(sets_from_dirs([load_results_dir(DEMO)]), OPTIONS)


def _one_cell_set(name: str, values: dict[str, list[float]]) -> DataSet:
    data = DataSet(name, "test", "zbdlab")
    for op, runs in values.items():
        data.samples += [Sample(CellKey(op, 65536, 1024), f"rep{i + 1}", v) for i, v in enumerate(runs)]
    data.runs = sorted({s.run for s in data.samples})
    return data


@pytest.fixture(scope="module")
def borderline() -> Analysis:
    """read: the 90 % interval lies below 1 and the estimate beyond the margin, p = 0.09 (q >= 0.05)."""
    base = {"write": [100, 104, 96, 101, 99], "read": [100, 102, 98, 101, 99]}
    other = {"write": [50, 52, 48, 50.5, 49.5], "read": [v * 0.975 for v in (100, 104, 92, 103, 97)]}
    return analyse([_one_cell_set("base", base), _one_cell_set("set", other)], Options(seed=1))


def test_report_lead_rows_of_the_demo(demo: Analysis) -> None:
    lead = build_lead(demo)
    rows = {r.name: r for r in lead.rows}
    assert [r.name for r in lead.rows] == [
        "ext4",
        "ext4-on-nbdkit",
        "btrfs-lzo",
        "ext4-on-zbd-lz4",
        "btrfs-zstd1",
        "ext4-on-zbd-zstd1",
    ]
    assert rows["ext4"].role == "baseline" and rows["ext4-on-nbdkit"].role == "transport baseline"
    # zbd targets are compared with the transport baseline; btrfs does not use the NBD path
    assert rows["ext4-on-zbd-lz4"].transport == rows["ext4-on-zbd-zstd1"].transport == "ext4-on-nbdkit"
    assert rows["btrfs-lzo"].transport == "" and rows["btrfs-lzo"].vs_transport is None
    assert round(rows["ext4-on-zbd-lz4"].saved_pct) == 51
    assert rows["ext4-on-zbd-lz4"].verdict_base == "smaller, slower"
    assert rows["ext4-on-nbdkit"].verdict_base == "same size, slower"
    # against its transport baseline lz4 runs at 99 % [95, 103]: not shown to differ, not "as fast"
    lz4 = rows["ext4-on-zbd-lz4"].vs_transport
    assert lz4 is not None and lz4.ci_low < 0.98 and lz4.ci_high > 1.02
    assert rows["ext4-on-zbd-lz4"].verdict_transport == "smaller, speed unclear"
    zstd = rows["ext4-on-zbd-zstd1"].vs_transport
    assert zstd is not None and zstd.verdict == "slower"
    assert rows["ext4-on-zbd-zstd1"].verdict_transport == "smaller, slower"
    # the speed vs the transport baseline is the ratio of the two sets' speeds vs ext4
    nbdkit = demo.primary("ext4-on-nbdkit", ALL)
    vs_ext4 = demo.primary("ext4-on-zbd-lz4", ALL)
    assert nbdkit is not None and vs_ext4 is not None
    assert lz4.ratio == pytest.approx(vs_ext4.ratio / nbdkit.ratio)


def test_report_terminal_leads_with_the_table_and_fits_120_columns(demo: Analysis) -> None:
    text = render_terminal(demo)
    lines = text.splitlines()
    too_wide = [line for line in lines if len(line) > WIDTH]
    assert too_wide == []
    assert lines[3].split() == [
        "target",
        "space",
        "saved",
        "speed",
        "vs",
        "ext4",
        "verdict",
        "vs",
        "transport",
        "verdict",
    ]
    lz4 = next(line for line in lines if line.startswith("ext4-on-zbd-lz4 "))
    assert re.search(r"51 % \(2\.03:1\) +43 % \[\d+-\d+\] +smaller, slower +99 % \[\d+-\d+\]", lz4)
    # nothing is cut: every set's per-operation column is there, with its q
    for data in demo.others:
        assert any(re.search(rf"│\s+{re.escape(data.name)}\s", line) for line in lines), data.name
    assert sum(line.count("(q=") for line in lines) == sum(1 for p in demo.primaries if p.operation != ALL)


def test_report_terminal_fits_120_columns_with_long_names(tmp_path: Path) -> None:
    write_results_dir(tmp_path / "wide", LONG_NAMES, runs=3)
    analysis = analyse(sets_from_dirs([load_results_dir(tmp_path / "wide")]), Options(bootstrap=300))
    lines = render_terminal(analysis).splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    for name in LONG_NAMES:
        assert any(name in line for line in lines)


def _terminal_cells(text: str, analysis: Analysis) -> list[tuple[str, str, str]]:
    """(set, operation, vs-base text) for every cell of the per-operation tables."""
    out = []
    names: list[str] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("│")]
        if len(parts) < 3:
            continue
        if parts[0] == "" and parts[1] == analysis.baseline.name:
            names = [p.split()[0] for p in parts[2:] if p]
            continue
        if parts[0] in analysis.operations:
            for name, cell in zip(names, parts[2:], strict=False):
                out.append((name, parts[0], cell))
    return out


@pytest.mark.parametrize("which", ["demo", "borderline"])
def test_report_never_calls_a_change_its_adjusted_test_does_not_show(
    which: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    analysis: Analysis = request.getfixturevalue(which)
    alpha = analysis.options.alpha
    result = write_all(analysis, tmp_path / "out", plots=False)
    cells = _terminal_cells(result["terminal"], analysis)
    assert len(cells) == sum(1 for p in analysis.primaries if p.operation != ALL)
    for name, op, cell in cells:
        primary = analysis.primary(name, op)
        assert primary is not None
        q = float(re.search(r"\(q=([0-9.]+)\)", cell).group(1))
        assert q == pytest.approx(primary.q, abs=5e-4)
        called = re.search(r"[+-]\d+\.\d+% \(q=", cell) is not None  # a signed change: faster or slower
        assert called or "~ (q=" in cell
        assert called == (primary.q < alpha and primary.significant), (name, op, cell)
    html = (tmp_path / "out" / "index.html").read_text()
    rows = re.findall(
        r'<tr><td class="label">([^<]+)</td><td class="label">([^<]+)</td>.*?<td>([0-9.]+)</td>'
        r'<td>([0-9.]+)</td>\s*<td class="label (\w+)">([^<(]+)',
        html,
    )
    assert len(rows) == len(analysis.primaries)
    for _name, _op, _p, q, css, verdict in rows:
        if verdict.strip() in ("faster", "slower"):
            assert float(q) < alpha and css == verdict.strip()
    for row in build_lead(analysis).rows:
        for primary, words in ((row.vs_base, row.verdict_base), (row.vs_transport, row.verdict_transport)):
            if "slower" in words or "faster" in words:
                assert primary is not None and primary.q < alpha


def test_report_borderline_change_gets_no_verdict(borderline: Analysis) -> None:
    read = borderline.primary("set", "read")
    assert read is not None and read.ci_high < 1 and read.ratio < 0.98 and read.q >= 0.05
    text = render_terminal(borderline)
    row = next(line for line in text.splitlines() if line.startswith("read "))
    assert "~ (q=0.09" in row.split("│")[2]


def test_report_significance_story_is_told_once(demo: Analysis, tmp_path: Path) -> None:
    note = significance_note(demo)
    assert any("3+3 runs: the smallest p they can reach is 0.1, not below 0.05" in line for line in note)
    result = write_all(demo, tmp_path / "out", plots=False)
    terminal = result["terminal"]
    html = (tmp_path / "out" / "index.html").read_text()
    summary = html.split('<section id="primary">')[0]
    assert "<details>" in summary
    for text in (terminal, summary):
        assert text.count("smallest p they can reach") == 1
        assert "cells differ" not in text and "can never be significant" not in text
        assert "p=" not in text
