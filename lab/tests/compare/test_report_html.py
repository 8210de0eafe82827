"""The HTML report in headless Chromium: every section and image renders, no console errors; the
tables it links exist and parse; the detail pages render too."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from zbdlab.cli import main

from .chromium import dump_dom, screenshot
from .conftest import CHROMIUM, write_results_dir


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report")
    write_results_dir(root / "study", {"ext4": 1.0, "ext4-on-zbd-lz4": 0.8, "btrfs-zstd": 1.1}, runs=4)
    out = root / "out"
    result = CliRunner().invoke(
        main, ["report", str(root / "study"), "-o", str(out), "--bootstrap", "300", "--detail", "write"]
    )
    assert result.exit_code == 0, result.output
    return out


def _chromium() -> str:
    if CHROMIUM is None:
        print("SKIP reason: chromium not installed")
        pytest.skip("chromium not installed (scripts/install-deps.sh --with-browser)")
    return CHROMIUM


def test_report_console_capture_works(tmp_path: Path) -> None:
    # Control: a page that logs an error must be seen, or the "no console errors" check proves nothing.
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>console.error('deliberate-error-42')</script></body></html>")
    _, messages = dump_dom(_chromium(), page)
    assert any("deliberate-error-42" in m for m in messages)


def test_report_html_renders_every_section_and_image_without_console_errors(report_dir: Path) -> None:
    page = report_dir / "index.html"
    html = page.read_text()
    assert "http://" not in html and "https://" not in html  # self-contained: nothing to fetch
    dom, messages = dump_dom(_chromium(), page)
    assert messages == []
    check = re.search(r'<p id="selfcheck" data-images="(\d+)" data-broken="(\d+)" data-sections="(\d+)"', dom)
    assert check is not None, "the page's load handler did not run"
    images, broken, sections = (int(g) for g in check.groups())
    # summary box plot + per op (write, rewrite, read, reread): 2 quartile plots + 2 sets x (scatter, heatmap)
    assert images == 1 + 4 * (2 + 2 * 2)
    assert broken == 0
    ids = set(re.findall(r'<section id="([^"]+)"', dom))
    expected = {"summary", "primary", "overview", "metrics", "method", "files"}
    expected |= {f"op-{op}" for op in ("write", "rewrite", "read", "reread")}
    assert ids == expected
    assert sections == len(expected)
    # the summary says in words what is real
    # the summary leads with space saved and speed together
    assert "ext4-on-zbd-lz4 against ext4: saves 50 % of space (ratio 2.00:1) at 80 % of the speed" in dom
    assert "slower in write" in dom
    assert "btrfs-zstd against ext4: saves 0 % of space (ratio 1.00:1) at 110 % of the speed" in dom
    assert "faster in write" in dom
    assert "smallest reachable p 0.029 with 4+4 runs" in dom  # Mann-Whitney 2 / C(8, 4)
    shot = report_dir / "screenshot.png"
    screenshot(_chromium(), page, shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_detail_pages_render(report_dir: Path) -> None:
    for name in ("detail-write-by-record-size.html", "detail-write-by-file-size.html"):
        dom, messages = dump_dom(_chromium(), report_dir / name)
        assert messages == []
        images, broken = (int(g) for g in re.search(r'data-images="(\d+)" data-broken="(\d+)"', dom).groups())
        assert images > 0 and broken == 0
        assert dom.count("<section") == images  # one plot per fixed size


def test_report_tables_exist_in_csv_tsv_and_json(report_dir: Path) -> None:
    document = json.loads((report_dir / "comparison.json").read_text())
    assert document["meta"]["baseline"] == "ext4"
    for name, table in document["tables"].items():
        for suffix, delimiter in (("csv", ","), ("tsv", "\t")):
            with open(report_dir / "tables" / f"{name}.{suffix}") as handle:
                rows = list(csv.reader(handle, delimiter=delimiter))
            assert rows[0] == table["columns"]
            assert len(rows) - 1 == len(table["rows"])
    metrics = document["tables"]["metrics"]
    wa = [
        r
        for r in metrics["rows"]
        if r[1] == "backing bytes written per byte written" and r[2] == "ext4-on-zbd-lz4"
    ]
    assert wa and wa[0][4] == pytest.approx(0.5, abs=0.01)


def test_report_html_leads_with_the_table_on_the_demo_results(tmp_path: Path) -> None:
    demo = Path(__file__).parent / "fixtures" / "demo_quick"
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["report", str(demo), "-o", str(out), "--bootstrap", "500", "--no-plots"]
    )
    assert result.exit_code == 0, result.output
    dom, messages = dump_dom(_chromium(), out / "index.html")
    assert messages == []
    summary = dom.split('<section id="summary">')[1].split("</section>")[0]
    first_table = summary.split("<table")[1].split("</table>")[0]
    assert summary.index("<table") < summary.index("<p")  # the table comes before any paragraph
    heads = re.findall(r"<th[^>]*>([^<]+)</th>", first_table)
    assert heads == [
        "target",
        "space saved",
        "speed vs ext4",
        "verdict",
        "speed vs transport baseline",
        "verdict",
    ]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", first_table, re.S)[1:]
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in rows]
    assert [c[0] for c in cells] == [
        "ext4",
        "ext4-on-nbdkit",
        "btrfs-lzo",
        "ext4-on-zbd-lz4",
        "btrfs-zstd1",
        "ext4-on-zbd-zstd1",
    ]
    lz4 = cells[3]
    assert lz4[1] == "51 % (2.03:1)" and lz4[3] == "smaller, slower" and lz4[5] == "smaller, speed unclear"
    assert '<td class="label slower">smaller, slower</td>' in first_table
    shot = tmp_path / "lead.png"
    screenshot(_chromium(), out / "index.html", shot, width=1280, height=1000)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
