#!/usr/bin/python3
"""Dedup index: share of the duplicates found against the RAM budget (issue 27, "hit rate
against budget"), by `zbd estimate` on two data sets built here from this machine's files:

- clone set: one ext4 image of a base tree (`mkfs.ext4 -d`, no mount), copied 8 times, each copy
  with 2-10 % of its used blocks overwritten by other real data (blocks of /usr/lib files at
  random offsets), as VM images diverge;
- system tree: a mixed tree of this machine's files (docs, headers, Python, shared libraries).

Writes OUTDIR/summary.md and OUTDIR/index.tsv. Standard library only.

    scripts/bench-dedup-index.py OUTDIR

env: ZBD_BIN (default target/release/zbd), DEDUP_DIR where images go (/var/tmp),
     DEDUP_BASE_MB (256), DEDUP_TREE_MB (400), DEDUP_BUDGETS (64K,256K,1M,4M,16M,64M).
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
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
        if 0 < size < 64 << 20 and os.access(p, os.R_OK):
            chosen.append(p)
            total += size
            if total >= limit:
                break
    return chosen


def copy_tree(files: list[Path], dest: Path) -> int:
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


def diverge(
    image: Path, used: list[int], share: float, donors: list[Path], rng: random.Random
) -> int:
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


def estimate(zbd: str, paths: list[Path], budgets: str) -> dict:
    out = subprocess.run(
        [zbd, "estimate", "--json", "--dedup-index", budgets, *map(str, paths)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-5], file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    zbd = os.environ.get(
        "ZBD_BIN", str(Path(__file__).resolve().parent.parent / "target/release/zbd")
    )
    budgets = os.environ.get("DEDUP_BUDGETS", "64K,256K,1M,4M,16M,64M")
    base_mb = int(os.environ.get("DEDUP_BASE_MB", "256"))
    tree_mb = int(os.environ.get("DEDUP_TREE_MB", "400"))
    if shutil.which("mkfs.ext4") is None:
        print("bench-dedup-index: mkfs.ext4 missing (e2fsprogs)", file=sys.stderr)
        return 1
    rows = []
    with tempfile.TemporaryDirectory(
        prefix="zbd-dedup.", dir=os.environ.get("DEDUP_DIR", "/var/tmp")
    ) as work:
        work_dir = Path(work)
        base_tree = work_dir / "base"
        base_bytes = copy_tree(pick_files(base_mb << 20, 1), base_tree)
        image = work_dir / "base.img"
        size_mb = base_mb * 2 + 64
        subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-d", str(base_tree), str(image), f"{size_mb}M"],
            check=True,
            capture_output=True,
        )
        shutil.rmtree(base_tree)
        used = used_blocks(image)
        donors = pick_files(64 << 20, 2)
        rng = random.Random(3)
        clones = []
        for c in range(CLONES):
            clone = work_dir / f"clone{c}.img"
            shutil.copyfile(image, clone)
            share = 0.02 + 0.08 * c / (CLONES - 1)
            changed = diverge(clone, used, share, donors, rng)
            print(
                f"clone {c}: {changed} of {len(used)} used blocks changed ({100 * share:.0f} %)",
                flush=True,
            )
            clones.append(clone)
        image.unlink()
        sets = {"clone set": clones}
        tree = work_dir / "tree"
        tree_bytes = copy_tree(pick_files(tree_mb << 20, 4), tree)
        sets["system tree"] = [tree]
        for name, paths in sets.items():
            print(f"estimating {name}", flush=True)
            doc = estimate(zbd, paths, budgets)
            for ix in doc["indexes"]:
                rows.append(
                    {
                        "set": name,
                        "nonzero_blocks": doc["nonzero_blocks"],
                        "duplicate_blocks": doc["duplicate_blocks"],
                        "dedup_ratio": round(doc["dedup_ratio"], 3),
                        "budget_bytes": ix["budget_bytes"],
                        "bytes_per_block": round(ix["bytes_per_block"], 3),
                        "found": round(ix["found"], 4),
                        "hook_level": ix["stats"]["hook_level"],
                        "manifest_loads_per_gib": round(
                            ix["manifest_loads_per_gib"], 1
                        ),
                    }
                )
    with (out / "index.tsv").open("w") as f:
        keys = list(rows[0])
        f.write("\t".join(keys) + "\n")
        for r in rows:
            f.write("\t".join(str(r[k]) for k in keys) + "\n")
    lines = [
        (
            f"Clone set: {CLONES} ext4 images of a {base_bytes / 2**20:.0f} MiB base tree, 2-10 % of used blocks "
            f"changed each; system tree: {tree_bytes / 2**20:.0f} MiB of this machine's files. "
            "`found` = share of the exact duplicates (xxh3-128) the index finds; B/block = budget / non-zero "
            "blocks written. Anchor: dm-vdo's UDS, ~4 B/block dense, ~0.4 B/block sparse finding 97-99 % of "
            "what dense finds."
        ),
        "",
        "| set | dedup (exact) | budget | B/block | found | sample 1 in | manifest reads/GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['set']} | {r['dedup_ratio']:.2f}:1 | {r['budget_bytes'] >> 10} KiB | {r['bytes_per_block']:.2f} "
            f"| {100 * r['found']:.1f} % | {2 ** r['hook_level']} | {r['manifest_loads_per_gib']:.0f} |"
        )
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
