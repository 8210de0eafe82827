"""The dedup data sets of issue 27, built from this machine's files, shared by the dedup benchmarks
(scripts/bench-dedup-index.py, scripts/bench-dedup-space.py). Standard library only (Debian's
/usr/bin/python3 runs the scripts):

- clone set: one ext4 image of a base tree (`mkfs.ext4 -d`, no mount), copied `CLONES` times, each
  copy with 2-10 % of its used blocks overwritten by other real data (blocks of /usr/lib files at
  random offsets), as VM images diverge. The images are sparse: all-zero blocks are holes;
- system tree: a mixed tree of this machine's files (docs, headers, Python, Perl, shared libraries).

Same seeds, same files on the same machine: both benchmarks see the same data.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BLOCK = 4096
CLONES = 8
SOURCES = [
    "/usr/share/doc",
    "/usr/include",
    "/usr/lib/python3",
    "/usr/share/perl",
    "/usr/lib/x86_64-linux-gnu",
]
FILE_BYTES_MAX = 64 << 20  # larger files are left out of the trees
SEED_BASE, SEED_DONORS, SEED_DIVERGE, SEED_TREE = 1, 2, 3, 4
SHARE_MIN, SHARE_SPAN = 0.02, 0.08  # share of used blocks changed: 2 % (first clone) to 10 % (last)


def pick_files(limit: int, seed: int) -> list[Path]:
    """Regular files of SOURCES, in a seeded shuffle, until `limit` bytes."""
    files = []
    for src in SOURCES:
        for d, _, names in os.walk(src):
            for n in names:
                p = Path(d, n)
                if p.is_file() and not p.is_symlink():
                    files.append(p)
    files.sort()
    random.Random(seed).shuffle(files)
    chosen, total = [], 0
    for p in files:
        size = p.stat().st_size
        if 0 < size < FILE_BYTES_MAX and os.access(p, os.R_OK):
            chosen.append(p)
            total += size
            if total >= limit:
                break
    return chosen


def copy_tree(files: list[Path], dest: Path) -> int:
    """Copies `files` under `dest` (spread over 64 directories); returns their bytes."""
    total = 0
    for i, p in enumerate(files):
        target = dest / f"{i % 64:02d}" / p.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, target)
        total += p.stat().st_size
    return total


def used_blocks(image: Path) -> list[int]:
    """Indexes of the image's non-zero blocks."""
    out = []
    with image.open("rb") as f:
        i = 0
        while chunk := f.read(BLOCK * 256):
            for k in range(0, len(chunk), BLOCK):
                if chunk[k : k + BLOCK].count(0) != len(chunk[k : k + BLOCK]):
                    out.append(i + k // BLOCK)
            i += len(chunk) // BLOCK
    return out


def diverge(image: Path, used: list[int], share: float, donors: list[Path], rng: random.Random) -> int:
    """Overwrites `share` of the used blocks with blocks of donor files at random offsets."""
    picked = rng.sample(used, int(len(used) * share))
    with image.open("r+b") as f:
        for b in picked:
            donor = rng.choice(donors)
            size = donor.stat().st_size
            with donor.open("rb") as d:
                d.seek(rng.randrange(0, max(1, size - BLOCK)))
                data = d.read(BLOCK).ljust(BLOCK, b"\x01")
            f.seek(b * BLOCK)
            f.write(data)
    return len(picked)


def clone_share(index: int, clones: int = CLONES) -> float:
    """Share of used blocks clone `index` changes, from SHARE_MIN (first) to SHARE_MIN + SHARE_SPAN."""
    return SHARE_MIN + SHARE_SPAN * index / max(1, clones - 1)


@dataclass
class CloneSet:
    images: list[Path]
    base_tree_bytes: int  # bytes of the files in the base tree
    image_bytes: int  # apparent size of each image
    used_blocks: int  # non-zero blocks of the base image
    changed_blocks: list[int]  # per clone


def build_clone_set(
    work: Path, base_mb: int, clones: int = CLONES, say: Callable[[str], None] = print
) -> CloneSet:
    """`clones` sparse ext4 images in `work` (clone0.img ...), diverged from one base image."""
    base_tree = work / "base"
    base_bytes = copy_tree(pick_files(base_mb << 20, SEED_BASE), base_tree)
    image = work / "base.img"
    size_mb = base_mb * 2 + 64
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-d", str(base_tree), str(image), f"{size_mb}M"],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(base_tree)
    used = used_blocks(image)
    donors = pick_files(64 << 20, SEED_DONORS)
    rng = random.Random(SEED_DIVERGE)
    images, changed = [], []
    for c in range(clones):
        clone = work / f"clone{c}.img"
        # --sparse=always: all-zero blocks stay holes in every copy, as in a thin VM image
        subprocess.run(["cp", "--sparse=always", str(image), str(clone)], check=True)
        share = clone_share(c, clones)
        changed.append(diverge(clone, used, share, donors, rng))
        say(f"clone {c}: {changed[-1]} of {len(used)} used blocks changed ({100 * share:.0f} %)")
        images.append(clone)
    image.unlink()
    return CloneSet(images, base_bytes, size_mb << 20, len(used), changed)


def build_system_tree(dest: Path, tree_mb: int) -> int:
    """The system tree in `dest`; returns its files' bytes."""
    return copy_tree(pick_files(tree_mb << 20, SEED_TREE), dest)
