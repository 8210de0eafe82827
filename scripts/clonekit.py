"""The clone set of scripts/bench-snapshots.py (issue 28, "10 clones of one 4 GiB ext4 image") and
what it needs beside zbd: labelled data trees, one ext4 image filled through a mount, loop devices,
mounts and NBD exports as block devices (`nbdfuse` + `losetup`), and the btrfs side of the
comparison. Every step that sets something up pushes its undo on a benchkit.Undo first; loop devices
are found by the file behind them (`losetup -j`), so only the script's own are ever detached.
Standard library only.

Data: files of three labelled kinds, a third of the bytes each, every 4 KiB block of a file being
`random` bytes of a seeded generator followed by zeros: 4096 (incompressible, as media or archives),
2048 (half compressible) or 1024 (three quarters). The kinds compress alike with 4 KiB blocks and
128 KiB chunks, so the codec and its unit do not decide the comparison; sizes are log-uniform from
4 KiB to 32 MiB, 50 files a directory.
"""

from __future__ import annotations

import math
import random
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchkit import Undo, run, say, stop, wait_for

BLOCK = 4096
MIB = 1 << 20
KINDS = (("random", 4096), ("half", 2048), ("quarter", 1024))  # random bytes per 4 KiB block
FILE_MIN, FILE_MAX = 4096, 32 * MIB
PER_DIR = 50
CHUNK_BLOCKS = 256  # a file is written 1 MiB at a time
LOOP_OPTIONS = ["--sector-size", "4096", "--direct-io=on"]  # no second page cache under ext4


def size_bytes(text: str) -> int:
    """"4G", "512M", "64K" or a plain number of bytes."""
    m = re.fullmatch(r"(\d+)([KMGT]?)", text.strip().upper())
    if not m:
        raise ValueError(f"not a size: {text!r}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2)]


class Layers:
    """The undo steps of one thing set up in layers (a loop device, then a mount on it...), taken
    down newest first by `close`, or by Undo.run_all if the script fails before."""

    def __init__(self, undo: Undo) -> None:
        self.undo = undo
        self.entries: list[tuple[str, Callable[[], None]]] = []

    def push(self, name: str, step: Callable[[], None]) -> None:
        self.entries.append(self.undo.push(name, step))

    def close(self) -> None:
        while self.entries:
            self.undo.release(self.entries.pop())


# --- data ---------------------------------------------------------------------------------------


def write_tree(root: Path, total: int, seed: int) -> dict[str, int]:
    """Files of the three kinds under `root` until `total` bytes (the kind with the fewest bytes so
    far comes next, so each gets a third); returns the bytes of each kind."""
    rng = random.Random(seed)
    done = {name: 0 for name, _ in KINDS}
    written = n = 0
    while written < total:
        size = min(int(math.exp(rng.uniform(math.log(FILE_MIN), math.log(FILE_MAX)))), total - written)
        name, rand = min(KINDS, key=lambda k: done[k[0]])
        path = root / f"d{n // PER_DIR:03d}" / f"f{n:05d}.{name}"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, size, rand, rng)
        done[name] += size
        written += size
        n += 1
    return done


def write_file(path: Path, size: int, rand: int, rng: random.Random) -> None:
    """`size` bytes, each 4 KiB block `rand` random bytes then zeros."""
    chunk = bytearray(BLOCK * CHUNK_BLOCKS)
    with path.open("wb") as f:
        left = size
        while left > 0:
            blocks = min(CHUNK_BLOCKS, -(-left // BLOCK))
            noise = rng.randbytes(rand * blocks)
            for b in range(blocks):
                chunk[b * BLOCK : b * BLOCK + rand] = noise[b * rand : (b + 1) * rand]
            part = min(left, blocks * BLOCK)
            f.write(memoryview(chunk)[:part])
            left -= part


# --- loop devices, mounts, NBD exports -----------------------------------------------------------


def loops_over(file: Path) -> list[str]:
    out = run(["losetup", "-j", str(file)], check=False).stdout
    return [line.split(":", 1)[0] for line in out.splitlines() if line.startswith("/dev/loop")]


def detach_loops(file: Path) -> None:
    """Detaches every loop device over `file` (a file of ours: nobody else's device is touched)."""
    for device in loops_over(file):
        run(["losetup", "-d", device])


def loop(layers: Layers, file: Path, options: list[str] | None = None) -> str:
    layers.push(f"detach loops over {file}", lambda: detach_loops(file))
    device = run(["losetup", "--find", "--show", *(options or []), str(file)]).stdout.strip()
    if not device.startswith("/dev/loop"):
        raise RuntimeError(f"losetup printed {device!r} for {file}")
    return device


def mounted(mnt: Path) -> bool:
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        return any(line.split()[1] == str(mnt) for line in mounts)


def umount(mnt: Path, argv0: str = "umount") -> None:
    """Unmounts `mnt` if mounted, trying again for a while when it is busy for a moment."""
    if mounted(mnt):
        wait_for(lambda: run([argv0, *(["-u"] if argv0 == "fusermount3" else []), str(mnt)],
                             check=False).returncode == 0 or not mounted(mnt), f"unmount {mnt}", 30)


def mount(layers: Layers, device: str, mnt: Path, fstype: str, options: str = "") -> None:
    mnt.mkdir(parents=True, exist_ok=True)
    layers.push(f"umount {mnt}", lambda: umount(mnt))
    run(["mount", "-t", fstype, *(["-o", options] if options else []), device, str(mnt)])


def attach_export(layers: Layers, uri: str, work: Path, read_only: bool = False) -> str:
    """An NBD export as a loop device, as `zbd attach --method fuse` makes it: nbdfuse serves it as
    the file work/mnt/disk (ready when it writes its pidfile), losetup makes a device of that file.
    Taken down by `layers`: the loop device first, then nbdfuse by unmounting its FUSE mount (its
    manual's way to stop it), then by SIGTERM to the PID we started if it lingers."""
    work.mkdir(parents=True, exist_ok=True)
    fuse_mnt, pidfile = work / "mnt", work / "nbdfuse.pid"
    fuse_mnt.mkdir(exist_ok=True)
    pidfile.unlink(missing_ok=True)
    procs: list[subprocess.Popen[bytes]] = []

    def stop_nbdfuse() -> None:
        umount(fuse_mnt, "fusermount3")
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                stop(proc)

    layers.push(f"stop nbdfuse on {fuse_mnt}", stop_nbdfuse)
    log = (work / "nbdfuse.log").open("ab")
    argv = ["nbdfuse", "-P", str(pidfile), *(["-r"] if read_only else []), str(fuse_mnt / "disk"), uri]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    procs.append(proc)
    wait_for(lambda: proc.poll() is not None or (pidfile.exists() and pidfile.read_text().strip().isdigit()),
             f"nbdfuse {uri}")
    if proc.poll() is not None:
        raise RuntimeError(f"nbdfuse exited ({proc.returncode}) for {uri}; log {log.name}")
    return loop(layers, fuse_mnt / "disk", [*LOOP_OPTIONS, *(["--read-only"] if read_only else [])])


def write_through_ext4(layers: Layers, device: str, mnt: Path, tree: Path) -> None:
    """Mounts the ext4 on `device`, copies `tree` into it (new/), flushes, unmounts."""
    mount(layers, device, mnt, "ext4")
    run(["cp", "-a", f"{tree}/.", str(mnt / "new")])
    run(["sync", "-f", str(mnt)])


# --- the image ------------------------------------------------------------------------------------


def build_image(undo: Undo, work: Path, size: int, fill: int, seed: int) -> dict[str, Any]:
    """work/image.ext4: a sparse file of `size` bytes, ext4 (4 KiB blocks, inode tables and journal
    written now, not lazily later), mounted through a loop device and filled with `fill` bytes of
    labelled files, unmounted and checked by fsck.ext4 -fn."""
    image = work / "image.ext4"
    run(["truncate", "-s", str(size), str(image)])
    run(["mkfs.ext4", "-F", "-q", "-b", "4096", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image)])
    layers = Layers(undo)
    device = loop(layers, image, LOOP_OPTIONS)
    mnt = work / "image-mnt"
    mount(layers, device, mnt, "ext4")
    t0 = time.monotonic()
    kinds = write_tree(mnt / "files", fill, seed)
    run(["sync", "-f", str(mnt)])
    fill_s = time.monotonic() - t0
    df = run(["df", "-B1", "--output=used,size", str(mnt)]).stdout.split()
    layers.close()
    run(["fsck.ext4", "-fn", str(image)])
    return {
        "path": str(image),
        "size_bytes": size,
        "files_bytes": sum(kinds.values()),
        "files_bytes_by_kind": kinds,
        "fs_used_bytes": int(df[-2]),
        "allocated_bytes": image.stat().st_blocks * 512,
        "fill_s": fill_s,
    }


# --- btrfs ----------------------------------------------------------------------------------------


def btrfs_df(mnt: Path) -> dict[str, int]:
    """`btrfs filesystem df -b`: the used bytes of Data, Metadata and System (one copy each)."""
    used = {}
    for line in run(["btrfs", "filesystem", "df", "-b", str(mnt)]).stdout.splitlines():
        m = re.match(r"(\w+), (\S+): total=(\d+), used=(\d+)", line.strip())
        if m:
            used[m.group(1).lower()] = int(m.group(4))
    return used


def compsize(mnt: Path) -> dict[str, int] | None:
    """compsize's TOTAL line: disk usage (each extent once, however many files or snapshots share
    it), uncompressed and referenced bytes; None without compsize."""
    done = run(["compsize", "-b", str(mnt)], check=False)
    for line in done.stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["TOTAL"] and len(parts) >= 5:
            return {"disk": int(parts[2]), "uncompressed": int(parts[3]), "referenced": int(parts[4])}
    return None


def btrfs_usage(mnt: Path) -> dict[str, Any]:
    """Flushed first (`sync -f`, `btrfs filesystem sync`: a transaction committed), then measured."""
    run(["sync", "-f", str(mnt)])
    run(["btrfs", "filesystem", "sync", str(mnt)])
    df = btrfs_df(mnt)
    return {"data": df.get("data", 0), "metadata": df.get("metadata", 0), "system": df.get("system", 0),
            "compsize": compsize(mnt)}


def btrfs_clones(
    undo: Undo, work: Path, image: Path, trees: list[Path], compress: str, method: str, room: int
) -> dict[str, Any]:
    """The clone set on btrfs: mkfs.btrfs (defaults: data single, metadata DUP) on a loop device
    over a sparse file of `room` bytes, mounted with compress-force=`compress` (or no compression
    for "none"); the image copied in (`cp --sparse=always`), then one clone per tree, by `cp
    --reflink=always` of the image file or by a writable snapshot of the subvolume holding it
    (`method`); each clone's ext4 mounted through a loop device, given its tree, flushed."""
    d = Path(tempfile.mkdtemp(prefix=f"btrfs-{method}-", dir=work))
    undo.push(f"remove {d}", lambda: run(["rm", "-rf", "--one-file-system", str(d)]))
    backing, mnt = d / "btrfs.img", d / "mnt"
    run(["truncate", "-s", str(room), str(backing)])
    layers = Layers(undo)
    device = loop(layers, backing)
    run(["mkfs.btrfs", "-q", "-f", device])
    mount(layers, device, mnt, "btrfs", "" if compress == "none" else f"compress-force={compress}")
    if method == "snapshot":
        run(["btrfs", "subvolume", "create", str(mnt / "base")])
        base, clone_path = mnt / "base" / "disk.img", (lambda i: mnt / f"c{i}" / "disk.img")
    else:
        base, clone_path = mnt / "base.img", (lambda i: mnt / f"c{i}.img")
    t0 = time.monotonic()
    run(["cp", "--sparse=always", str(image), str(base)])
    run(["sync", "-f", str(mnt)])
    import_s = time.monotonic() - t0
    one = btrfs_usage(mnt)
    clone_s = 0.0
    for i in range(len(trees)):
        t0 = time.monotonic()
        if method == "snapshot":
            run(["btrfs", "subvolume", "snapshot", str(mnt / "base"), str(mnt / f"c{i}")])
        else:
            run(["cp", "--reflink=always", str(base), str(clone_path(i))])
        clone_s += time.monotonic() - t0
    write_s: list[float] = []
    for i, tree in enumerate(trees):
        t0 = time.monotonic()
        clone_layers = Layers(undo)
        clone_dev = loop(clone_layers, clone_path(i), LOOP_OPTIONS)
        write_through_ext4(clone_layers, clone_dev, d / "clone-mnt", tree)
        clone_layers.close()
        run(["sync", "-f", str(mnt)])
        write_s.append(time.monotonic() - t0)
    stored = btrfs_usage(mnt)
    layers.close()
    result = {
        "compress": compress,
        "method": method,
        "one": one,
        "stored": stored,
        "backing_allocated_bytes": backing.stat().st_blocks * 512,
        "import_s": import_s,
        "clone_s": clone_s,
        "write_s": write_s,
    }
    run(["rm", "-f", str(backing)])
    say(f"  btrfs {compress} {method}: data {stored['data'] / MIB:.0f} MiB for one image of "
        f"{one['data'] / MIB:.0f} MiB; clones {clone_s:.2f} s, new data {sum(write_s):.1f} s")
    return result
