"""Compression ratio of each corpus part under lz4, zstd and zlib, per unit of 4 KiB and 128 KiB.

Every file is cut into units (the last one shorter) and each unit is compressed on its own, as a
compressing block device (4 KiB) or btrfs (128 KiB chunks) would; a unit that does not shrink counts
as stored raw. Ratio = original bytes / stored bytes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lz4.block
import zstandard

UNITS = (4096, 131072)
ZSTD_LEVEL = 3
ZLIB_LEVEL = 6


def _codecs() -> dict[str, Callable[[bytes], bytes]]:
    zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=False, write_checksum=False)
    return {
        "lz4": lambda b: lz4.block.compress(b, store_size=False),
        f"zstd-{ZSTD_LEVEL}": zstd.compress,
        f"zlib-{ZLIB_LEVEL}": lambda b: zlib.compress(b, ZLIB_LEVEL),
    }


CODECS = tuple(_codecs())


@dataclass
class PartRatios:
    part: str
    files: int
    original_bytes: int
    stored_bytes: dict[str, int]  # "<codec>@<unit>" -> bytes

    def ratio(self, codec: str, unit: int) -> float:
        stored = self.stored_bytes[f"{codec}@{unit}"]
        return self.original_bytes / stored if stored else 1.0

    def to_json(self) -> dict[str, object]:
        return {
            "part": self.part,
            "files": self.files,
            "original_bytes": self.original_bytes,
            "stored_bytes": self.stored_bytes,
            "ratio": {
                key: round(self.original_bytes / v, 4) if v else 1.0 for key, v in self.stored_bytes.items()
            },
        }


def measure_files(part: str, files: list[Path]) -> PartRatios:
    codecs = _codecs()
    stored = {f"{name}@{unit}": 0 for name in codecs for unit in UNITS}
    original = 0
    for path in files:
        data = path.read_bytes()
        original += len(data)
        for unit in UNITS:
            for offset in range(0, len(data), unit):
                chunk = data[offset : offset + unit]
                for name, compress in codecs.items():
                    stored[f"{name}@{unit}"] += min(len(chunk), len(compress(chunk)))
    return PartRatios(part=part, files=len(files), original_bytes=original, stored_bytes=stored)


def measure_part(root: Path, part_dir: Path) -> PartRatios:
    files = sorted(p for p in part_dir.rglob("*") if p.is_file())
    return measure_files(part_dir.relative_to(root).as_posix(), files)
