"""Shared helpers for the compare/report tests: fixture location and generators of inputs in the real
formats (IOzone auto-mode text, fio JSON, zbdlab results directories) with known values."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from zbdlab.parsers.model import IOZONE_OPERATIONS
from zbdlab.results.schema import RunRecord

REPO_ROOT = Path(__file__).resolve().parents[3]
IOZONE_FIXTURES = REPO_ROOT.parent / "shared" / "fixtures" / "iozone"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)

FILE_SIZES_KB = (64, 128, 256, 512)
RECORD_SIZES_KB = (4, 8, 16, 32, 64)
DESIGN = [(f, r) for f in FILE_SIZES_KB for r in RECORD_SIZES_KB if r <= f]

_TOP = (
    "                                                            random  random    bkwd   record   stride"
    "                                   "
)
_HEADING = (
    "              KB  reclen   write rewrite    read    reread    read   write    read  rewrite     read"
    "   fwrite frewrite   fread  freread"
)
_WIDTHS = (16, 8, 8, 8, 9, 9, 8, 8, 8, 9, 9, 9, 9, 8, 9)  # each field's width, as IOzone 3.327 prints


def iozone_fixture_dir(name: str) -> Path:
    path = IOZONE_FIXTURES / name
    if not path.is_dir():
        print(f"SKIP reason: fixtures absent at {path}")
        pytest.skip(f"IOzone fixtures absent: {path} (needs ../shared next to the repository)")
    return path


def iozone_text(table: dict[tuple[int, int], list[float | None]], complete: bool = True) -> str:
    """IOzone 3.327 auto-mode output with the given KB/s values; None leaves the cell blank."""
    lines = [
        "\tIozone: Performance Test of File I/O",
        "\t        Version $Revision: 3.327 $",
        "",
        "\tAuto Mode",
        "\tOutput is in Kbytes/sec",
        _TOP,
        _HEADING,
    ]
    for (file_kb, record_kb), values in sorted(table.items()):
        fields = [str(file_kb), str(record_kb)] + ["" if v is None else str(int(round(v))) for v in values]
        lines.append("".join(f.rjust(w) for f, w in zip(fields, _WIDTHS, strict=False)))
    if complete:
        lines += ["", "iozone test complete."]
    return "\n".join(lines) + "\n"


def base_speeds(seed: int = 7) -> dict[tuple[int, int], np.ndarray]:
    """A typical speed (KB/s) per cell and operation, spread over two orders of magnitude."""
    rng = np.random.default_rng(seed)
    return {cell: rng.uniform(50_000, 3_000_000, size=len(IOZONE_OPERATIONS)) for cell in DESIGN}


def write_iozone_set(
    directory: Path,
    runs: int = 5,
    scale: float = 1.0,
    noise: float = 0.02,
    seed: int = 11,
    speeds: dict[tuple[int, int], np.ndarray] | None = None,
) -> list[dict[tuple[int, int], np.ndarray]]:
    """`runs` IOzone files of the design: speed x scale x (1 + noise*N(0,1)). Returns the exact
    (rounded) KB/s values written, per run, so tests can compute expectations independently."""
    directory.mkdir(parents=True, exist_ok=True)
    speeds = speeds if speeds is not None else base_speeds()
    rng = np.random.default_rng(seed)
    written = []
    for run in range(runs):
        table = {
            cell: np.round(s * scale * (1 + noise * rng.standard_normal(s.size)))
            for cell, s in speeds.items()
        }
        (directory / f"run{run + 1}.iozone").write_text(iozone_text({c: list(v) for c, v in table.items()}))
        written.append(table)
    return written


def copy_set(source: Path, target: Path) -> None:
    shutil.copytree(source, target)


def fio_document(jobs: list[dict]) -> dict:
    """A fio --output-format=json document with the given job entries (minimal real field names)."""
    return {"fio version": "fio-3.33", "timestamp": 1, "jobs": jobs}


def fio_job(
    name: str, rw: str, bs: str, size: str, bw_bytes: float, direction: str, p50_ns: int = 2000
) -> dict:
    idle = {"io_bytes": 0, "bw_bytes": 0, "iops": 0.0, "clat_ns": {"percentile": {}}}
    active = {
        "io_bytes": 64 * 1024 * 1024,
        "bw_bytes": bw_bytes,
        "iops": bw_bytes / 4096,
        "clat_ns": {
            "percentile": {
                "50.000000": p50_ns,
                "95.000000": 2 * p50_ns,
                "99.000000": 4 * p50_ns,
                "99.900000": 9 * p50_ns,
            }
        },
    }
    job = {
        "jobname": name,
        "job options": {"name": name, "rw": rw, "bs": bs, "size": size},
        "read": idle,
        "write": idle,
        "trim": idle,
        "job_runtime": 1000,
        "usr_cpu": 10.0,
        "sys_cpu": 30.0,
    }
    job[direction] = active
    return job


def write_results_dir(
    directory: Path,
    targets: dict[str, float],
    runs: int = 5,
    study_name: str = "study",
    seed: int = 3,
    environment: dict | None = None,
) -> None:
    """A zbdlab results directory: IOzone-style cells for each target at `speed x factor`, one
    discarded warm-up run per target, efficiency fields filled."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    speeds = base_speeds()
    rows = []
    for target, factor in targets.items():
        for rep in range(runs + 1):
            for (file_kb, record_kb), ops in speeds.items():
                for op, kbs in zip(IOZONE_OPERATIONS[:4], ops[:4], strict=True):
                    value = kbs * 1024 * factor * (1 + 0.02 * rng.standard_normal())
                    written = file_kb * 1024
                    rows.append(
                        RunRecord(
                            run_id=f"{target}-{rep}-{file_kb}-{record_kb}-{op}",
                            target=target,
                            workload="iozone",
                            operation=op,
                            repetition=rep,
                            file_size_bytes=file_kb * 1024,
                            record_size_bytes=record_kb * 1024,
                            throughput_bytes_per_s=value * (100.0 if rep == 0 else 1.0),
                            cpu_user_s=0.01,
                            cpu_system_s=0.03,
                            logical_bytes_written=written,
                            backing_bytes_written=int(written * (0.5 if "zbd" in target else 1.0)),
                            physical_bytes_used=written // 2,
                            compression_ratio=2.0 if "zbd" in target else 1.0,
                            dedup_ratio=1.5 if "zbd" in target else None,
                            latency_p99_us=100.0 / factor,
                            discarded=rep == 0,
                        )
                    )
    (directory / "runs.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    (directory / "environment.json").write_text(json.dumps(environment or {"kernel": "6.1.0", "cpus": 2}))
    targets_toml = "".join(f'[[targets]]\nname = "{t}"\n' for t in targets)
    (directory / "study.toml").write_text(f'[study]\nname = "{study_name}"\n\n{targets_toml}')
