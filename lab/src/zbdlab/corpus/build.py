"""Build a corpus: fetch and unpack the pinned files, generate the seeded data, write the manifest
(sha256 per file) and the compressibility report.

Layout of a built corpus:
  manifest.json     {"format": 1, "size", "seed", "pins": [...], "files": [{"path","size","sha256"}]}
  SHA256SUMS        the same checksums for `sha256sum -c` (run inside data/)
  compression.json  ratio per part, codec and unit (see ratios.py)
  data/<group>/<part>/...   the files: pypi-text, pypi-binary, pypi-data, compressed, generated
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from zbdlab.corpus import CorpusError, pins
from zbdlab.corpus.fetch import fetch, normalize_tree, sha256_file, unpack
from zbdlab.corpus.generate import SEED, generate
from zbdlab.corpus.ratios import PartRatios, measure_part

MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class SizeProfile:
    pins: tuple[pins.Pin, ...]
    generated_bytes: int


SIZES = {
    "small": SizeProfile(pins=pins.SMALL, generated_bytes=24 << 20),
    "full": SizeProfile(pins=pins.FULL, generated_bytes=192 << 20),
}


@dataclass
class BuildResult:
    manifest: dict[str, object]
    ratios: list[PartRatios]


def build(
    out: Path,
    size: str,
    cache_dir: Path,
    log: Callable[[str], None] = lambda _: None,
    *,
    pin_list: Sequence[pins.Pin] | None = None,
    generated_bytes: int | None = None,
) -> BuildResult:
    """Build the corpus into `out` (its data/ is rebuilt from scratch). `pin_list` and
    `generated_bytes` override the size profile (tests build tiny corpora)."""
    if size not in SIZES:
        raise CorpusError(f"unknown corpus size {size!r}; one of {', '.join(SIZES)}")
    profile = SIZES[size]
    chosen = tuple(profile.pins if pin_list is None else pin_list)
    budget = profile.generated_bytes if generated_bytes is None else generated_bytes
    _prepare_out(out)
    data = out / "data"
    parts: list[Path] = []
    for pin in chosen:
        archive = fetch(pin, cache_dir, log)
        part = data / pin.group / pin.name
        if pin.extract:
            log(f"unpacking {pin.filename}")
            unpack(archive, part)
        else:
            part.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(archive, part / pin.filename)
        parts.append(part)
    log(f"generating {budget >> 20} MiB of seeded data")
    parts += generate(data / "generated", budget)
    normalize_tree(data)
    manifest = _manifest(data, size, chosen)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (out / "SHA256SUMS").write_text("".join(f"{f['sha256']}  {f['path']}\n" for f in manifest["files"]))
    log("measuring compressibility")
    ratios = [measure_part(data, part) for part in parts]
    report = {"format": 1, "parts": [r.to_json() for r in ratios]}
    (out / "compression.json").write_text(json.dumps(report, indent=1) + "\n")
    return BuildResult(manifest=manifest, ratios=ratios)


def _prepare_out(out: Path) -> None:
    if out.exists() and any(out.iterdir()) and not (out / "manifest.json").is_file():
        raise CorpusError(f"{out} is not empty and holds no corpus manifest; choose another -o directory")
    shutil.rmtree(out / "data", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)


def _manifest(data: Path, size: str, chosen: Sequence[pins.Pin]) -> dict[str, object]:
    files = [
        {"path": p.relative_to(data).as_posix(), "size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(data.rglob("*"), key=lambda p: p.relative_to(data).as_posix())
        if p.is_file()
    ]
    return {
        "format": MANIFEST_FORMAT,
        "size": size,
        "seed": SEED,
        "pins": [
            {"filename": p.filename, "url": p.url, "sha256": p.sha256, "extract": p.extract} for p in chosen
        ],
        "total_bytes": sum(int(f["size"]) for f in files),
        "files": files,
    }
