#!/usr/bin/python3
"""Summary of scripts/bench-savings.sh: filesystems measured, codec schemes, and the projection of
ext4 on zbd with each scheme against btrfs (issue 10's targets). Standard library only.

Projection: ext4 on zbd with today's per-block scheme is measured (image bytes after fstrim);
a scheme changes only how the file data is stored, so its projected bytes are the measured bytes
minus the engine bytes of per-block storage plus the engine bytes of the scheme, both from
`zbd bench codec --dir` (payload + records + segments + extent packing) and scaled from the
measured 7/8 of the files (the other 1/8 trains the dictionary) to the whole tree.
"""

import json
import os
import sys
from pathlib import Path

TARGETS = [
    ("zstd:1", "btrfs compress=zstd:1", 0.85),
    ("zstd:1", "btrfs compress-force=zstd:1", 0.90),
    ("lz4", "btrfs compress=lzo", 0.85),
]


def padded_bytes(root: str) -> int:
    total = 0
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            if os.path.isfile(p) and not os.path.islink(p):
                total += -(-os.path.getsize(p) // 4096) * 4096
    return total


def mib(b: float) -> str:
    return f"{b / 2**20:.1f}"


def target_cells(
    space: dict[str, list[str]], codec: str, zbd_bytes: float
) -> list[str]:
    """zbd bytes against each btrfs target of `codec` (empty cells for the other codec's)."""
    cells = []
    for tc, tname, goal in TARGETS:
        t = space.get(tname)
        if tc != codec or not t or not t[3]:
            cells.append("")
            continue
        x = zbd_bytes / int(t[3])
        cells.append(f"{x:.3f} ({'meets' if x <= goal else 'misses'} <= {goal})")
    return cells


def measured_targets(space: dict[str, list[str]]) -> None:
    """ext4 on zbd as measured (every unit size the run used) against the issue's targets."""
    print("\nMeasured ext4 on zbd vs the targets (bytes allocated after fstrim):\n")
    print("| ext4 on zbd | " + " | ".join(t[1] for t in TARGETS) + " |")
    print("|---|" + "---|" * len(TARGETS))
    for name, r in space.items():
        if not name.startswith("ext4 on zbd ") or not r[3]:
            continue
        cells = target_cells(space, name.split()[3], int(r[3]))
        print(f"| {name[len('ext4 on zbd ') :]} | " + " | ".join(cells) + " |")


def read_table(out: Path, tree: str) -> None:
    """4 KiB random reads per scheme (median of the rounds) and the ratio to per-block."""
    path = out / "read.tsv"
    if not path.exists():
        return
    rows = [ln.split("\t") for ln in path.read_text().splitlines()[1:]]
    by: dict[str, list[float]] = {}
    for r in rows:
        if r[0] == tree:
            by.setdefault(r[1], []).append(float(r[3]))
    if not by:
        return
    med = {k: sorted(v)[len(v) // 2] for k, v in by.items()}
    base = med.get("zstd:1 (per block)")
    print(
        "\n4 KiB random reads, fio nbd engine, iodepth 16, a tar of the tree on zbd (median of rounds):\n"
    )
    print("| scheme | IOPS (rounds) | x per block (target >= 0.8) |")
    print("|---|---|---|")
    for k, v in by.items():
        x = f"{med[k] / base:.3f}" if base else "-"
        print(f"| {k} | {med[k]:.0f} ({', '.join(f'{i:.0f}' for i in v)}) | {x} |")


def main(out: Path) -> None:
    space_tsv = out / "space.tsv"
    rows = (
        [ln.split("\t") for ln in space_tsv.read_text().splitlines()[1:]]
        if space_tsv.exists()
        else []
    )
    reads = out / "read.tsv"
    read_trees = (
        [ln.split("\t")[0] for ln in reads.read_text().splitlines()[1:]]
        if reads.exists()
        else []
    )
    names = [r[0] for r in rows] + read_trees
    for tree in sorted(set(names), key=names.index):
        space = {r[1]: r for r in rows if r[0] == tree}
        if not space:
            print(f"## {tree}")
            read_table(out, tree)
            print()
            continue
        files = int(next(iter(space.values()))[2])
        print(f"## {tree}\n")
        print(f"Files: {mib(files)} MiB (apparent size).\n")
        print("| target | allocated MiB | x files | x btrfs zstd:1 | note |")
        print("|---|---|---|---|---|")
        base = space.get("btrfs compress=zstd:1")
        base_b = int(base[3]) if base and base[3] else None
        for name, r in space.items():
            if not r[3]:
                print(f"| {name} | - | - | - | {r[4]} |")
                continue
            b = int(r[3])
            vs = f"{b / base_b:.3f}" if base_b else "-"
            print(f"| {name} | {mib(b)} | {b / files:.3f} | {vs} | {r[4]} |")
        measured_targets(space)
        read_table(out, tree)
        codec_json = out / f"codec-{tree}.json"
        if not codec_json.exists():
            print()
            continue
        rep = json.loads(codec_json.read_text())["units"]
        measured_padded = (
            sum(x["input_bytes"] for x in rep["rows"][:1]) + rep["zero_blocks"] * 4096
        )
        scale = (
            padded_bytes(rep["source"]) / measured_padded
            if os.path.isdir(rep["source"])
            else 8 / 7
        )
        print(
            f"\nCodec schemes ({rep['files_measured']} files measured, dictionary trained on "
            f"{rep['files_training']} others, {mib(rep['training_bytes'])} MiB; engine projection at "
            f"{rep['extent_bytes'] >> 10} KiB extents; timings on a shared, loaded machine):\n"
        )
        print(
            "| codec | unit | dict | savings % | engine savings % | comp MB/s | dec MB/s | 4K read us |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for x in rep["rows"]:
            d = f"{x['dict_bytes'] >> 10}K" if x["dict_bytes"] else "-"
            eng = 100 * (1 - x["projected_engine_bytes"] / x["input_bytes"])
            print(
                f"| {x['codec']} | {x['unit_bytes'] >> 10}K | {d} | {x['savings_pct']:.1f} | {eng:.1f} | "
                f"{x['compress_mb_s']:.0f} | {x['decompress_mb_s']:.0f} | {x['random_4k_read_us']:.1f} |"
            )
        print(
            "\nProjected ext4 on zbd per scheme vs btrfs (same files, bytes allocated after fstrim):\n"
        )
        print(
            "| codec | unit | dict | projected MiB | "
            + " | ".join(t[1] for t in TARGETS)
            + " |"
        )
        print("|---|---|---|---|" + "---|" * len(TARGETS))
        for codec in ("lz4", "zstd:1"):
            real = space.get(f"ext4 on zbd {codec} (per block)")
            if not real or not real[3]:
                continue
            per_block = next(
                x
                for x in rep["rows"]
                if x["codec"] == codec
                and x["unit_bytes"] == 4096
                and not x["dict_bytes"]
            )
            for x in (x for x in rep["rows"] if x["codec"] == codec):
                proj = int(real[3]) - scale * (
                    per_block["projected_engine_bytes"] - x["projected_engine_bytes"]
                )
                cells = target_cells(space, codec, proj)
                d = f"{x['dict_bytes'] >> 10}K" if x["dict_bytes"] else "-"
                print(
                    f"| {codec} | {x['unit_bytes'] >> 10}K | {d} | {mib(proj)} | "
                    + " | ".join(cells)
                    + " |"
                )
        print()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
