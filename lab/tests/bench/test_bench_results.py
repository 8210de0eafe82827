"""Where `zbdlab bench` writes: the committed results directory holds only summary.md, figures.json and
environment.json; every tool's own output goes to bench/raw/<run>/ (ignored by git). Runs the real
writer (`run_bench`) with a fake zbd binary and fake scripts in a throwaway repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zbdlab.bench import engine
from zbdlab.bench.report import RESULT_FILES, raw_dir
from zbdlab.bench.run import run_bench
from zbdlab.bench.settings import Settings

ENGINE_JSON = (
    '{"runs": [{"write_mb_s": 400, "read_mb_s": 1000}], "raw_compress_mb_s": 500, '
    '"raw_decompress_mb_s": 2000, "savings_pct": 50}'
)


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "repo"
    (root / "bench" / "results").mkdir(parents=True)
    monkeypatch.setenv("ZBD_BIN", "")  # run_bench sets it for the fs group; restored after the test
    monkeypatch.setattr(engine, "pinned", lambda threads: [])  # no taskset: any number of cores
    return root


def only_summaries(out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == sorted(RESULT_FILES)


def test_engine_run_commits_summaries_and_keeps_fio_json_raw(repo: Path, tmp_path: Path) -> None:
    zbd = executable(tmp_path / "zbd", f"#!/bin/sh\necho '{ENGINE_JSON}'\n")
    summary, failed = run_bench(str(zbd), Settings(rounds=1), ["engine"], repo, say=lambda _: None)
    out = summary.parent
    assert failed == []
    assert out.parent == repo / "bench" / "results" and out.name.endswith("-engine")
    only_summaries(out)
    raw = repo / "bench" / "raw" / out.name / "engine"
    assert len(list(raw.glob("engine-*.json"))) == 4  # lz4 and zstd:1 at 1 and 2 threads, one round
    doc = json.loads((out / "figures.json").read_text())
    assert {f["name"]: f["numerator"] for f in doc["figures"]}["lz4 write, 2 threads / 1 thread"] == [400.0]
    assert "| engine: lz4 write, 1 thread(s) / (lz4 alone x 1) | 0.80 |" in summary.read_text()


LATENCY_SCRIPT = """#!/bin/bash
set -e
mkdir -p "$1/raw/latency"
echo '{"jobs": []}' >"$1/raw/latency/idle-this-1.json"
printf '# Read latency\\n\\n| binary | idle p99 |\\n|---|---|\\n| this | 80 |\\n' >"$1/latency.md"
echo '{"this": {"idle_p99_us": 80}}' >"$1/latency.json"
echo "latency done with $ZBD_BIN"
"""


def test_a_script_group_keeps_its_summary_and_leaves_the_rest_raw(repo: Path, tmp_path: Path) -> None:
    executable(repo / "scripts" / "bench-latency.sh", LATENCY_SCRIPT)
    zbd = executable(tmp_path / "zbd", "#!/bin/sh\nexit 0\n")
    summary, failed = run_bench(str(zbd), Settings(), ["latency"], repo, say=lambda _: None)
    out = summary.parent
    assert failed == [] and out.name.endswith("-latency")
    only_summaries(out)
    text = summary.read_text()
    assert "## Read latency behind checkpoints" in text and "| this | 80 |" in text
    assert "# Read latency\n" not in text  # the script's title gives way to the group's
    assert json.loads((out / "figures.json").read_text())["data"]["latency"] == {"this": {"idle_p99_us": 80}}
    raw = repo / "bench" / "raw" / out.name / "latency"
    assert (raw / "raw" / "latency" / "idle-this-1.json").exists()
    assert f"latency done with {zbd}" in (raw / "log.txt").read_text()


def test_a_failing_script_fails_its_group_and_names_its_log(repo: Path, tmp_path: Path) -> None:
    executable(repo / "scripts" / "bench-scale.sh", "#!/bin/bash\necho 'no space left' >&2\nexit 4\n")
    zbd = executable(tmp_path / "zbd", "#!/bin/sh\nexit 0\n")
    summary, failed = run_bench(str(zbd), Settings(), ["scale"], repo, say=lambda _: None)
    assert failed == ["scale"]
    only_summaries(summary.parent)
    assert "scale: FAILED" in summary.read_text() and "no space left" in summary.read_text()
    assert "log.txt" in summary.read_text()


def test_raw_output_stays_beside_a_results_directory_outside_the_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    assert raw_dir(repo, repo / "bench" / "results" / "r") == repo / "bench" / "raw" / "r"
    assert raw_dir(repo, tmp_path / "elsewhere") == tmp_path / "elsewhere" / "raw"


def test_summary_sections_follow_the_order_groups_run_in(tmp_path: Path) -> None:
    from zbdlab.bench.core import Figure
    from zbdlab.bench.report import write_results
    from zbdlab.stats.compare import Options

    figs = [Figure("engine", "lz4 write", [90.0] * 3, [100.0] * 3).compute(Options())]
    tables = {"latency": ["| latency table |"], "fs": ["| fs table |"]}
    text = write_results(tmp_path, figs, {"tools": {}}, {}, [], tables, {"latency": {"x": 1}}).read_text()
    heads = [line for line in text.splitlines() if line.startswith("## ")]
    assert [h.split()[1] for h in heads] == ["Engine", "Through", "Read"]  # engine, fs, latency


DEDUP_WRITE_SCRIPT = """#!/usr/bin/python3
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
(out / "runs").mkdir(parents=True, exist_ok=True)
(out / "runs" / "rand4k-dup50-dedup-on-r1.json").write_text("{}")
arm = {"runs": 1, "mib_s": [100.0], "mib_s_median": 100.0, "live_bytes": 2**28}
summary = [{"case": "rand4k", "label": "4 KiB random write", "data": "dup50", "off": arm,
            "on": dict(arm, mib_s=[110.0], mib_s_median=110.0), "throughput_on_over_off": 1.1}]
(out / "summary.json").write_text(json.dumps({"version": 1, "summary": summary}))
table = "| write | MiB/s on / off |\\n|---|---|\\n| rand4k | 1.10 |\\n"
(out / "summary.md").write_text("# Inline dedup\\n\\n" + table)
"""


def test_dedup_write_keeps_its_summary_and_its_chart_beside_it(repo: Path, tmp_path: Path) -> None:
    executable(repo / "scripts" / "bench-dedup-write.py", DEDUP_WRITE_SCRIPT)
    zbd = executable(tmp_path / "zbd", "#!/bin/sh\nexit 0\n")
    summary, failed = run_bench(str(zbd), Settings(), ["dedup-write"], repo, say=lambda _: None)
    out = summary.parent
    assert failed == [] and out.name.endswith("-dedup-write")
    # the bar chart is the one file besides the summaries; the runs' fio output stays raw
    assert sorted(p.name for p in out.iterdir()) == sorted([*RESULT_FILES, "dedup-write.png"])
    assert (out / "dedup-write.png").read_bytes()[:4] == b"\x89PNG"
    text = summary.read_text()
    assert "## Inline dedup: write throughput" in text and "| rand4k | 1.10 |" in text
    assert "![MiB/s, dedup off and on](dedup-write.png)" in text
    data = json.loads((out / "figures.json").read_text())["data"]["dedup-write"]
    assert data["summary"][0]["throughput_on_over_off"] == 1.1
    assert (
        repo / "bench" / "raw" / out.name / "dedup-write" / "runs" / "rand4k-dup50-dedup-on-r1.json"
    ).exists()
