#!/usr/bin/python3
"""Dedup space anchors (issue 27, "Measure"): bytes each system stores for the same data, same run,
with a real filesystem on top, beside the logical bytes written.

Data sets (scripts/dedup_sets.py, from this machine's files):
- clone set: 8 sparse ext4 images of one base tree, 2-10 % of used blocks changed each, copied
  onto the target one after another;
- system tree: a mixed tree of this machine's files;
- seed 003's case: fio files declared 3:1 duplicate (`dedupe_percentage=67`, `dedupe_mode=repeat`,
  `buffer_compress_percentage=0`, bs 128K, 10 files as the seed's vdbench run), written once
  here and copied onto every target.
Systems, each on a sparse image file of its own:
- btrfs `compress=zstd:1` on a loop device, then `duperemove -d` on the same filesystem;
- ZFS (zfs-fuse) with `dedup=on`, for each of DEDUP_SPACE_ZFS's compression/recordsize pairs:
  gzip-1 and lzjb at the default 128K records, and gzip-1 at 4K records, where ZFS can share
  every 4 KiB block as zbd will (pool v23 has no lz4);
- ext4 on a zbd volume (lz4, zstd:1; zbd's defaults otherwise), served by `zbd serve` and
  attached with `zbd attach` (nbdfuse + loop); and once more with zstd:1 on a volume with metadata
  pages, given `zbd dedup` and `zbd compact` offline after the copy (post-process dedup);
- the same zstd:1 volume made with `--dedup on` (inline dedup: the server shares duplicates as they
  are written), measured as written, then once more after `zbd compact` offline. A zbd without
  `zbd create --dedup` skips these two rows (and says so in the notes).
Stored bytes: btrfs and zbd, bytes the image (backing file) holds after sync + fstrim; ZFS, the
pool's ALLOC after export/import (zfs-fuse has no TRIM; the image's own bytes are kept too).
`zbd estimate` adds, per set, the exact 4 KiB duplicate ratio and what dedup + zstd:1 would store.

Writes OUTDIR/dedup-space.json (the lab renders the table: zbdlab.bench.scripts.dedup_space).
Needs root. Creates only its own images, loop devices, mounts and pools; starts zfs-fuse only
when no daemon runs (and then stops that one, by PID); undoes everything on exit or failure.

    scripts/bench-dedup-space.py OUTDIR

env: ZBD_BIN (default target/release/zbd), DEDUP_DIR where images go (/var/tmp), DEDUP_BASE_MB
     (256), DEDUP_TREE_MB (400), DEDUP_SEED_MB (640), DEDUP_SPACE_ZFS (COMPRESSION[/RECORDSIZE] ...,
     default "gzip-1 lzjb gzip-1/4K"; empty: no ZFS),
     DEDUP_SPACE_SETS ("clone tree seed").
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit import Undo, missing_tools, run, say, stop, wait_for, work_dir
from dedup_sets import BLOCK, CLONES, build_clone_set, build_system_tree, used_blocks

SCHEMA_VERSION = 1
ZBD_CODECS = ("lz4", "zstd:1")
# The codec of the arm given `zbd dedup` (post-process deduplication, design.md build order 2a).
ZBD_DEDUP_CODEC = "zstd:1"
BTRFS_COMPRESS = "zstd:1"
ZFS_VARIANTS = "gzip-1 lzjb gzip-1/4K"  # compression[/recordsize], recordsize 128K (ZFS's) if not given
ZFS_RECORDSIZE = "128K"
ZFS_SOCKET = Path("/var/run/zfs/zfs_socket")
SEED_FILES = 10  # seed 003's vdbench run: files=10 (of 20m each; scaled up here)
SEED_DEDUPE_PERCENTAGE = 67  # fio: 67 % of the 128 KiB buffers repeat an earlier one: 3.03:1
SEED_BS = 128 << 10


def allocated(path: Path) -> int:
    """Bytes a (sparse) file really occupies."""
    return path.stat().st_blocks * 512


def mounted(mnt: Path) -> bool:
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        return any(line.split()[1] == str(mnt) for line in mounts)


def umount(mnt: Path) -> None:
    if not mounted(mnt):
        return

    def attempt() -> bool:
        return run(["umount", str(mnt)], check=False).returncode == 0 or not mounted(mnt)

    wait_for(attempt, f"umount {mnt}", 30)


def detach_loops(image: Path) -> None:
    """Detaches the loop devices over our own image file (never anyone else's)."""
    for line in run(["losetup", "-j", str(image)], check=False).stdout.splitlines():
        device = line.split(":", 1)[0]
        if device.startswith("/dev/loop"):
            run(["losetup", "-d", device])


@dataclass
class DataSet:
    key: str  # clone, tree, seed
    name: str
    paths: list[Path]  # copied onto each target in this order (files, or directories' contents)
    logical_bytes: int  # data bytes written (non-zero blocks of the images, file bytes of trees)
    description: str
    declared_ratio: float | None = None
    facts: dict[str, Any] = field(default_factory=dict)

    def image_bytes(self) -> int:
        """Size of each target's image or volume: the data twice over plus room for metadata."""
        return (self.logical_bytes * 2 + (1 << 30)) // (1 << 20) * (1 << 20)


def copy_set(data: DataSet, mnt: Path) -> None:
    """The set onto a mounted target, one path after another (each flushed before the next)."""
    for i, src in enumerate(data.paths):
        if len(data.paths) > 1:
            say(f"    copying {src.name} ({i + 1}/{len(data.paths)})")
        if src.is_dir():
            dest = mnt / f"{i:02d}-{src.name}"
            dest.mkdir()
            run(["cp", "-a", "--sparse=always", f"{src}/.", str(dest)])
        else:
            run(["cp", "--sparse=always", str(src), str(mnt)])
        run(["sync", "-f", str(mnt)])


def trim(mnt: Path) -> None:
    run(["sync", "-f", str(mnt)])
    run(["fstrim", str(mnt)], check=False)  # where the filesystem or device cannot, stored stays as is
    run(["sync", "-f", str(mnt)])


# ---- data sets ----------------------------------------------------------------------------------


def exact_dedup_ratio(paths: list[Path], unit: int) -> float:
    """Non-zero units / distinct non-zero units over files (tails padded with zeros), by SHA-256."""
    seen: set[bytes] = set()
    total = 0
    zero = bytes(unit)
    files = [p for path in paths for p in (sorted(path.rglob("*")) if path.is_dir() else [path])]
    for p in files:
        if not p.is_file():
            continue
        with p.open("rb") as f:
            while chunk := f.read(unit):
                chunk = chunk.ljust(unit, b"\0")
                if chunk != zero:
                    total += 1
                    seen.add(hashlib.sha256(chunk).digest())
    return total / len(seen) if seen else 1.0


def seed_set(work: Path, total_mb: int) -> DataSet:
    """Seed 003's case: fio files declared 3:1 duplicate, written once into work/seed003."""
    dest = work / "seed003"
    dest.mkdir()
    per_file = total_mb // SEED_FILES
    argv = [
        "fio",
        "--name=seed003",
        f"--directory={dest}",
        f"--nrfiles={SEED_FILES}",
        f"--filesize={per_file}M",
        f"--size={per_file * SEED_FILES}M",
        f"--bs={SEED_BS}",
        "--rw=write",
        "--ioengine=psync",
        "--refill_buffers=1",
        "--buffer_compress_percentage=0",
        "--buffer_compress_chunk=4k",
        f"--dedupe_percentage={SEED_DEDUPE_PERCENTAGE}",
        "--dedupe_mode=repeat",
        "--fallocate=none",
        "--randseed=20240229",
        "--end_fsync=1",
    ]
    run(argv)
    declared = 100 / (100 - SEED_DEDUPE_PERCENTAGE)
    files = sorted(dest.iterdir())
    logical = sum(p.stat().st_size for p in files)
    facts = {
        "fio": " ".join(argv[1:]).replace(str(dest), "DIR"),
        "exact_dedup_128k": round(exact_dedup_ratio([dest], SEED_BS), 4),
        "exact_dedup_4k": round(exact_dedup_ratio([dest], BLOCK), 4),
    }
    description = (
        f"{SEED_FILES} fio files of {per_file} MiB, dedupe_percentage={SEED_DEDUPE_PERCENTAGE} "
        f"(declared {declared:.2f}:1), buffer_compress_percentage=0, bs 128K"
    )
    return DataSet("seed", "seed 003's case", [dest], logical, description, declared, facts)


def clone_set(work: Path, base_mb: int) -> DataSet:
    built = build_clone_set(work, base_mb, say=say)
    logical = sum(len(used_blocks(img)) for img in built.images) * BLOCK
    description = (
        f"{CLONES} ext4 images ({built.image_bytes >> 20} MiB each, sparse) of one "
        f"{built.base_tree_bytes >> 20} MiB base tree, 2-10 % of the {built.used_blocks} used blocks "
        "changed in each"
    )
    facts = {"changed_blocks": built.changed_blocks, "used_blocks": built.used_blocks}
    return DataSet("clone", "clone set", built.images, logical, description, facts=facts)


def tree_set(work: Path, tree_mb: int) -> DataSet:
    tree = work / "tree"
    logical = build_system_tree(tree, tree_mb)
    files = sum(1 for p in tree.rglob("*") if p.is_file())
    description = f"{files} files of this machine (docs, headers, Python, Perl, shared libraries)"
    return DataSet("tree", "system tree", [tree], logical, description)


def estimate(zbd: str, data: DataSet) -> dict[str, Any]:
    """`zbd estimate` of the set: exact 4 KiB duplicates and a projection of dedup + zstd:1."""
    argv = [zbd, "estimate", "--json", "--codec", "zstd:1", "--dedup-index", "64M", *map(str, data.paths)]
    doc = json.loads(run(argv).stdout)
    keep = ("nonzero_blocks", "duplicate_blocks", "dedup_ratio", "compression_ratio", "stored_bytes")
    return {k: doc.get(k) for k in keep} | {"codec": doc.get("codec"), "unit_bytes": doc.get("unit_bytes")}


# ---- systems ------------------------------------------------------------------------------------


@dataclass
class Context:
    zbd: str
    work: Path
    mnt: Path
    undo: Undo
    zfs: ZfsDaemon | None = None
    inline_dedup: bool = False  # this zbd has `zbd create --dedup on` (inline dedup)


def btrfs(ctx: Context, data: DataSet) -> list[dict[str, Any]]:
    """btrfs compress=zstd:1, then duperemove -d on the same filesystem."""
    image = ctx.work / "btrfs.img"
    ctx.undo.push(f"remove {image}", lambda: image.unlink(missing_ok=True))
    run(["truncate", "-s", str(data.image_bytes()), str(image)])
    loops = ctx.undo.push("detach our loop device", lambda: detach_loops(image))
    loop = run(["losetup", "--find", "--show", str(image)]).stdout.strip()
    run(["mkfs.btrfs", "-q", "-f", loop])
    mount = ctx.undo.push(f"umount {ctx.mnt}", lambda: umount(ctx.mnt))
    run(["mount", "-t", "btrfs", "-o", f"compress={BTRFS_COMPRESS}", loop, str(ctx.mnt)])
    trim(ctx.mnt)
    empty = allocated(image)
    copy_set(data, ctx.mnt)
    trim(ctx.mnt)
    rows = [_btrfs_row(ctx, data, f"btrfs compress={BTRFS_COMPRESS}", image)]
    rows[0]["base"] = True  # the "x btrfs" column divides by this row
    say(f"  {rows[-1]['system']}: {rows[-1]['stored_bytes'] >> 20} MiB")
    hashes = ctx.work / "duperemove.hash"
    ctx.undo.push(f"remove {hashes}", lambda: hashes.unlink(missing_ok=True))
    # same: also within one file (fio's repeats are); partial: ranges inside extents too (by default
    # 0.11 compares whole extents, and an incompressible file is one large extent). btrfs frees an
    # extent only when no range of it is referenced any more: compsize's Referenced shows what was
    # shared, its Disk Usage what that saved. 128K blocks (the default): a compressed extent holds at
    # most 128 KiB of data, so smaller blocks could free nothing more.
    argv = ["duperemove", "-d", "-r", "-q", "--dedupe-options=same,partial", f"--hashfile={hashes}"]
    argv.append(str(ctx.mnt))
    started = time.monotonic()
    proc = run(argv, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"duperemove exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    trim(ctx.mnt)
    row = _btrfs_row(ctx, data, f"btrfs compress={BTRFS_COMPRESS} + duperemove -d", image)
    row["extra"]["duperemove_s"] = round(time.monotonic() - started, 1)
    for r in (*rows, row):
        r["extra"]["empty_bytes"] = empty
    row["extra"]["duperemove"] = " ".join(argv[1:-1]).replace(str(hashes), "FILE")
    rows.append(row)
    say(f"  {row['system']}: {row['stored_bytes'] >> 20} MiB")
    ctx.undo.release(mount)
    ctx.undo.release(loops)
    image.unlink()
    hashes.unlink(missing_ok=True)
    return rows


def _btrfs_row(ctx: Context, data: DataSet, system: str, image: Path) -> dict[str, Any]:
    compsize = run(["compsize", "-b", str(ctx.mnt)], check=False).stdout
    usage = run(["btrfs", "filesystem", "df", "-b", str(ctx.mnt)], check=False).stdout
    extra = {"image_allocated_bytes": allocated(image), "compsize": compsize_total(compsize)}
    extra["btrfs_df"] = {
        line.split(":")[0].strip(): line.split(":", 1)[1].strip() for line in usage.splitlines()
    }
    return row_of(data, system, allocated(image), "image allocated after fstrim", extra)


def compsize_total(text: str) -> dict[str, int]:
    """compsize -b's TOTAL line: Disk Usage, Uncompressed, Referenced (bytes)."""
    for line in text.splitlines():
        cols = line.split()
        if cols[:1] == ["TOTAL"] and len(cols) >= 5:
            return {"disk_usage": int(cols[2]), "uncompressed": int(cols[3]), "referenced": int(cols[4])}
    return {}


class ZfsDaemon:
    """zfs-fuse: someone else's daemon when one answers (never stopped here), else one started here
    with a pidfile of its own and stopped by its PID at the end."""

    def __init__(self, work: Path, undo: Undo) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        if socket_alive(ZFS_SOCKET):
            say("  zfs-fuse already running: using it")
            return
        if run(["pgrep", "-x", "zfs-fuse"], check=False).returncode == 0:
            raise RuntimeError("a zfs-fuse process runs but its socket does not answer: not touching it")
        undo.push("stop the zfs-fuse this script started", self.stop)
        log = (work / "zfs-fuse.log").open("wb")
        argv = ["zfs-fuse", "--no-daemon", "--pidfile", str(work / "zfs-fuse.pid")]
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        proc = self.proc
        wait_for(lambda: proc.poll() is not None or socket_alive(ZFS_SOCKET), "the zfs-fuse socket")
        if proc.poll() is not None:
            raise RuntimeError(f"zfs-fuse exited at start ({proc.returncode}); log {work / 'zfs-fuse.log'}")
        say(f"  started zfs-fuse (pid {proc.pid})")

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None

    @staticmethod
    def versions() -> dict[str, Any]:
        """Pool versions this zfs-fuse supports, and the one that brought dedup (expected: 21)."""
        text = run(["zpool", "upgrade", "-v"], check=False).stdout
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()[:1].isdigit()]
        dedup = [ln for ln in lines if "dedup" in ln.lower()]
        return {"max_pool_version": lines[-1].split()[0] if lines else None, "dedup_version": dedup}


def socket_alive(path: Path) -> bool:
    if not path.is_socket():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def zfs(ctx: Context, data: DataSet, variant: str) -> dict[str, Any]:
    """A zfs-fuse pool on a sparse image, dedup=on and `variant` (compression[/recordsize]); its ALLOC
    after export/import."""
    compression, _, recordsize = variant.partition("/")
    recordsize = recordsize or ZFS_RECORDSIZE
    if ctx.zfs is None:
        ctx.zfs = ZfsDaemon(ctx.work, ctx.undo)
    image = ctx.work / "zfs" / "pool.img"
    image.parent.mkdir(exist_ok=True)
    ctx.undo.push(f"remove {image}", lambda: image.unlink(missing_ok=True))
    run(["truncate", "-s", str(data.image_bytes()), str(image)])
    pool = f"zbddedup{os.getpid()}"
    entry = ctx.undo.push(f"zpool export {pool}", lambda: release_pool(pool))
    props = ["-O", f"compression={compression}", "-O", "dedup=on", "-O", f"recordsize={recordsize}"]
    run(["zpool", "create", "-f", "-o", "cachefile=none", "-m", str(ctx.mnt), *props, pool, str(image)])
    set_props = run(["zfs", "get", "-H", "-o", "property,value", "dedup,compression,recordsize", pool]).stdout
    empty = run(["zpool", "list", "-H", "-o", "allocated", pool]).stdout.strip()
    copy_set(data, ctx.mnt)
    run(["sync", "-f", str(ctx.mnt)])
    # zfs-fuse accounts written data at transaction-group commit: export + import forces it
    export_pool(pool)
    run(["zpool", "import", "-o", "cachefile=none", "-d", str(image.parent), pool])
    alloc, dedupratio, size = run(
        ["zpool", "list", "-H", "-o", "allocated,dedupratio,size", pool]
    ).stdout.split()
    fs = run(["zfs", "get", "-H", "-p", "-o", "property,value", "used,compressratio", pool]).stdout
    version = run(["zpool", "get", "version", pool], check=False).stdout.split()[-2:-1]
    ctx.undo.release(entry)
    extra: dict[str, Any] = {
        "zpool_alloc": alloc,
        "dedupratio": dedupratio,
        "pool_size": size,
        "pool_version": version[0] if version else None,
        "empty_bytes": zfs_size(empty),
        "properties": dict(line.split("\t", 1) for line in set_props.splitlines() if "\t" in line),
        "image_allocated_bytes": allocated(image),
    }
    extra |= {line.split("\t")[0]: line.split("\t")[1] for line in fs.splitlines() if "\t" in line}
    system = f"ZFS (zfs-fuse) {compression}, dedup=on, recordsize={recordsize}"
    row = row_of(data, system, zfs_size(alloc), "zpool ALLOC after export/import", extra)
    image.unlink()
    say(f"  {system}: {row['stored_bytes'] >> 20} MiB (dedupratio {dedupratio})")
    return row


def export_pool(pool: str) -> None:
    """zpool export; zfs-fuse answers "busy" for a moment after an unmount, so it is tried again."""

    def attempt() -> bool:
        proc = run(["zpool", "export", pool], check=False)
        if proc.returncode != 0 and "busy" not in proc.stderr + proc.stdout:
            raise RuntimeError(f"zpool export {pool}: {proc.stderr.strip()}")
        return proc.returncode == 0

    wait_for(attempt, f"zpool export {pool}", 30)


def release_pool(pool: str) -> None:
    """Our pool gone from the daemon: exported, else destroyed; nothing when it is not imported."""
    if run(["zpool", "list", "-H", "-o", "name", pool], check=False).returncode != 0:
        return
    try:
        export_pool(pool)
    except (RuntimeError, TimeoutError):
        run(["zpool", "destroy", "-f", pool])


def zfs_size(text: str) -> int:
    """zpool list's sizes (no -p in pool v23): 616K, 1.21G -> bytes (3 significant digits)."""
    units = {"B": 0, "K": 10, "M": 20, "G": 30, "T": 40}
    if text[-1:] in units:
        return round(float(text[:-1]) * (1 << units[text[-1]]))
    return int(text)


def zbd_volume(ctx: Context, data: DataSet, codec: str, dedup: str = "") -> list[dict[str, Any]]:
    """ext4 on a zbd volume (zbd serve + zbd attach: nbdfuse + loop), as the lab's zbd targets; one
    row, or two for inline dedup.
    `dedup` "post": a volume with metadata pages, given `zbd dedup` (offline, post-process) and
    `zbd compact` once the server stopped, before the backing file is measured.
    `dedup` "inline": a volume with metadata pages made with `--dedup on` (the server dedups as it
    writes): measured once the server stopped, and again after `zbd compact` (offline)."""
    vol = ctx.work / "vol.zbd"
    state = ctx.work / "attach"
    # Unix socket paths must stay under 108 bytes: a short directory of our own
    sock = Path(tempfile.mkdtemp(prefix="zbd-dedup-", dir="/run")) / "nbd.sock"
    ctx.undo.push(f"remove {sock.parent}", lambda: run(["rm", "-rf", str(sock.parent)]))
    index = vol.with_name(vol.name + ".dedup-index")  # kept by a clean close with dedup on
    ctx.undo.push(f"remove {vol}", lambda: [p.unlink(missing_ok=True) for p in (vol, index)])
    pages = ["--metadata-pages"] if dedup else []
    pages += ["--dedup", "on"] if dedup == "inline" else []
    size = f"{data.image_bytes() >> 20}M"
    run([ctx.zbd, "create", str(vol), "--size", size, "--codec", codec, "--force", *pages])
    log = (ctx.work / "zbd-serve.log").open("ab")
    pidfile = ctx.work / "zbd.pid"
    pidfile.unlink(missing_ok=True)
    server: list[subprocess.Popen[bytes]] = []
    serving = ctx.undo.push("stop our zbd serve", lambda: [stop(p) for p in server])
    argv = [ctx.zbd, "serve", str(vol), "--socket", str(sock), "--pidfile", str(pidfile)]
    server.append(subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True))
    wait_for(lambda: server[0].poll() is not None or (sock.exists() and pid_written(pidfile)), "zbd serve")
    if server[0].poll() is not None:
        raise RuntimeError(f"zbd serve exited at start ({server[0].returncode}); log {log.name}")
    device: list[str] = []
    attached = ctx.undo.push("zbd detach our device", lambda: detach_zbd(ctx, state, device))
    out = run([ctx.zbd, "attach", "--socket", str(sock), "--state-dir", str(state)]).stdout
    device += [w for w in out.split() if w.startswith("/dev/")][-1:]
    if not device:
        raise RuntimeError(f"zbd attach printed no device: {out.strip()!r}")
    run(["mkfs.ext4", "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", device[0]])
    mount = ctx.undo.push(f"umount {ctx.mnt}", lambda: umount(ctx.mnt))
    run(["mount", "-t", "ext4", device[0], str(ctx.mnt)])
    trim(ctx.mnt)
    empty = allocated(vol)  # while served: what the server has written back by now
    started = time.monotonic()
    copy_set(data, ctx.mnt)
    trim(ctx.mnt)
    extra: dict[str, Any] = {"empty_bytes": empty, "copy_s": round(time.monotonic() - started, 1)}
    if dedup == "inline":
        # through the server (its control socket): the index's own counters and the bytes written
        served = json.loads(run([ctx.zbd, "stat", str(vol), "--json"]).stdout)
        counters = served.get("counters") or {}
        extra["served"] = {
            "dedup_index": served.get("dedup_index"),
            "dedup_ratio": served.get("dedup_ratio"),
            "host_bytes_written": counters.get("host_bytes_written"),
            "data_bytes_written": counters.get("data_bytes_written"),
        }
    ctx.undo.release(mount)
    ctx.undo.release(attached)
    ctx.undo.release(serving)
    if dedup == "post":
        extra["before_dedup_bytes"] = allocated(vol)
        started = time.monotonic()
        run([ctx.zbd, "dedup", str(vol)])
        extra["zbd_dedup_s"] = time.monotonic() - started
        run([ctx.zbd, "compact", str(vol)])
    system = f"ext4 on zbd {codec}" + {"": "", "post": " + zbd dedup", "inline": " + inline dedup"}[dedup]
    rows = [zbd_row(ctx, data, vol, system, extra)]
    if dedup == "inline":
        extra = {"before_compact_bytes": allocated(vol)}
        started = time.monotonic()
        run([ctx.zbd, "compact", str(vol)])
        extra["zbd_compact_s"] = round(time.monotonic() - started, 1)
        rows.append(zbd_row(ctx, data, vol, f"{system}, then zbd compact", extra))
    vol.unlink()
    index.unlink(missing_ok=True)
    return rows


def zbd_row(ctx: Context, data: DataSet, vol: Path, system: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The row of a zbd volume whose server stopped: `zbd stat` and the backing file's bytes."""
    stat = json.loads(run([ctx.zbd, "stat", str(vol), "--json"]).stdout)
    extra |= {"zbd_stat": pick_stat(stat), "image_allocated_bytes": allocated(vol)}
    row = row_of(data, system, allocated(vol), "backing file allocated after fstrim", extra)
    say(f"  {system}: {row['stored_bytes'] >> 20} MiB")
    return row


def pid_written(pidfile: Path) -> bool:
    try:
        return pidfile.read_text().strip().isdigit()
    except OSError:
        return False


def detach_zbd(ctx: Context, state: Path, device: list[str]) -> None:
    if not device:
        # interrupted between attach and reading its output: a loop device over a file in our state dir
        listed = run(["losetup", "-a"], check=False).stdout
        device += [ln.split(":", 1)[0] for ln in listed.splitlines() if str(state) in ln][:1]
    if device:
        run([ctx.zbd, "detach", device[0], "--state-dir", str(state)])
        device.clear()


def pick_stat(stat: dict[str, Any]) -> dict[str, Any]:
    """The numbers of `zbd stat --json` a reader of the space table wants (found at any depth)."""
    wanted = {
        "logical_bytes_in_use",
        "physical_bytes_allocated",
        "physical_bytes_live",
        "data_blocks",
        "compression_ratio",
        "dedup_ratio",
        "codec",
        "unit_bytes",
        "extent_bytes",
    }
    found: dict[str, Any] = {}

    def walk(obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                if k in wanted and not isinstance(v, dict | list):
                    found.setdefault(k, v)
                walk(v)

    walk(stat)
    return found


def row_of(data: DataSet, system: str, stored: int, measure: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "set": data.name,
        "system": system,
        "logical_bytes": data.logical_bytes,
        "stored_bytes": stored,
        "measure": measure,
        "extra": extra,
    }


# ---- main ---------------------------------------------------------------------------------------


def measure(ctx: Context, data: DataSet, zfs_variants: list[str]) -> list[dict[str, Any]]:
    rows = btrfs(ctx, data)
    for variant in zfs_variants:
        rows.append(zfs(ctx, data, variant))
    for codec in ZBD_CODECS:
        rows += zbd_volume(ctx, data, codec)
    rows += zbd_volume(ctx, data, ZBD_DEDUP_CODEC, dedup="post")
    if ctx.inline_dedup:
        rows += zbd_volume(ctx, data, ZBD_DEDUP_CODEC, dedup="inline")
    return rows


def has_inline_dedup(zbd: str) -> bool:
    """Whether this zbd has inline dedup: `zbd create --dedup on|off`."""
    return "--dedup " in run([zbd, "create", "--help"], check=False).stdout


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-6], file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench-dedup-space: needs root (loop devices, mounts, zfs-fuse)", file=sys.stderr)
        return 1
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    zbd = os.environ.get("ZBD_BIN", str(Path(__file__).resolve().parent.parent / "target/release/zbd"))
    zfs_variants = os.environ.get("DEDUP_SPACE_ZFS", ZFS_VARIANTS).split()
    tools = ["mkfs.ext4", "mkfs.btrfs", "compsize", "duperemove", "fio", "fstrim", "losetup", "nbdfuse"]
    tools += ["zfs-fuse", "zpool"] if zfs_variants else []
    missing = missing_tools(tools)
    if missing:
        print(f"bench-dedup-space: missing {', '.join(missing)} (scripts/install-deps.sh)", file=sys.stderr)
        return 1
    undo = Undo()
    work = work_dir(undo, "zbd-dedup-space.")
    doc: dict[str, Any] = {"version": SCHEMA_VERSION, "sets": [], "rows": [], "notes": []}
    try:
        mnt = work / "mnt"
        mnt.mkdir()
        ctx = Context(zbd, work, mnt, undo, inline_dedup=has_inline_dedup(zbd))
        if not ctx.inline_dedup:
            doc["notes"].append(f"{zbd} has no `zbd create --dedup`: no inline dedup rows")
        builders = {
            "clone": lambda: clone_set(work / "clone", int(os.environ.get("DEDUP_BASE_MB", "256"))),
            "tree": lambda: tree_set(work, int(os.environ.get("DEDUP_TREE_MB", "400"))),
            "seed": lambda: seed_set(work, int(os.environ.get("DEDUP_SEED_MB", "640"))),
        }
        for key in os.environ.get("DEDUP_SPACE_SETS", "clone tree seed").split():
            if key == "clone":
                (work / "clone").mkdir()
            say(f"== building {key}")
            data = builders[key]()
            say(f"== {data.name}: {data.logical_bytes >> 20} MiB logical; {data.description}")
            data.facts["estimate"] = estimate(zbd, data)
            doc["sets"].append(
                {
                    "key": data.key,
                    "name": data.name,
                    "logical_bytes": data.logical_bytes,
                    "description": data.description,
                    "declared_ratio": data.declared_ratio,
                    "facts": data.facts,
                }
            )
            doc["rows"] += measure(ctx, data, zfs_variants)
            for path in data.paths:
                run(["rm", "-rf", "--one-file-system", str(path)])
            (out / "dedup-space.json").write_text(json.dumps(doc, indent=2) + "\n")
        if ctx.zfs is not None:
            doc["zfs"] = ZfsDaemon.versions() | {"variants": zfs_variants}
        doc["zbd_version"] = run([zbd, "--version"], check=False).stdout.strip()
        doc["duperemove_version"] = run(["duperemove", "--version"], check=False).stdout.strip()
        (out / "dedup-space.json").write_text(json.dumps(doc, indent=2) + "\n")
    finally:
        undo.run_all()
    say(f"wrote {out / 'dedup-space.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
