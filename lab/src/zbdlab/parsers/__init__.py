"""Parsers for everything `zbdlab compare` reads: IOzone text, fio JSON, zbdlab results directories.

`load_set(name, path)` detects the kind of input and returns one DataSet. A directory of repeated runs
(IOzone outputs or fio JSON files) is one set, each file one run.
"""

from __future__ import annotations

from pathlib import Path

from zbdlab.parsers.fio import fio_samples, looks_like_fio
from zbdlab.parsers.iozone import iozone_samples, looks_like_iozone
from zbdlab.parsers.model import CellKey, DataSet, InputError, Sample, canonical_operation
from zbdlab.parsers.results import is_results_dir, load_results_dir, results_to_set

__all__ = ["CellKey", "DataSet", "InputError", "Sample", "canonical_operation", "load_set"]


def _run_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise InputError(f"{path}: directory holds no files")
    return files


def load_set(name: str, path: Path, target: str | None = None) -> DataSet:
    """One set from `path`; `target` picks one target of a results directory holding several."""
    if not path.exists():
        raise InputError(f"set {name!r}: {path} does not exist")
    if is_results_dir(path):
        results = load_results_dir(path)
        if target is not None and target not in results.targets:
            raise InputError(f"{path}: no target {target!r} (has {', '.join(results.targets)})")
        if target is None and len(results.targets) > 1:
            raise InputError(
                f"{path} holds targets {', '.join(results.targets)}; pick one with NAME=PATH@TARGET "
                "or compare them all with `zbdlab report`"
            )
        return results_to_set(results, name, target)
    if target is not None:
        raise InputError(f"set {name!r}: @{target} applies only to a zbdlab results directory")
    files = _run_files(path) if path.is_dir() else [path]
    data = DataSet(name=name, source=str(path), kind="")
    errors: list[str] = []
    for index, file in enumerate(files, start=1):
        kind = "fio" if file.suffix == ".json" or looks_like_fio(file) else "iozone"
        if kind == "iozone" and not looks_like_iozone(file) and file.stat().st_size > 0:
            data.warnings.append(f"{file}: neither IOzone text nor fio JSON; skipped")
            continue
        try:
            parse = fio_samples if kind == "fio" else iozone_samples
            samples, warnings = parse(file, f"run{index}:{file.name}")
        except InputError as exc:
            errors.append(str(exc))
            continue
        if data.kind and data.kind != kind:
            raise InputError(f"set {name!r}: mixes IOzone and fio files ({file}); give one kind per set")
        data.kind = kind
        data.samples.extend(samples)
        data.warnings.extend(warnings)
        data.runs.append(f"run{index}:{file.name}")
    if not data.samples:
        detail = "; ".join(errors) if errors else "no IOzone or fio files"
        raise InputError(f"set {name!r}: nothing usable in {path} ({detail})")
    data.warnings.extend(f"{e} (file skipped)" for e in errors)
    return data
