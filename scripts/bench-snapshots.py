#!/usr/bin/python3
"""Snapshots and clones (issue 28, "Measure"), through `zbd serve` and fio's nbd engine, each arm on
a fresh volume (`zbd create --metadata-pages`, lz4) in DEDUP_DIR:

- load: 4 KiB random writes at iodepth 16 for SNAP_LOAD_S seconds on the default device of a
  SNAP_SIZE volume first filled with SNAP_FILL_MB, once with `zbd snapshot create` every
  SNAP_EVERY_S seconds through the control socket and once without; MiB/s and the p99.9 write
  latency of each, and their ratios (goals: p99.9 within 3x, throughput >= 0.9x);
- clones: one SNAP_IMAGE_SIZE ext4 image filled with SNAP_IMAGE_FILL_MB of labelled files
  (scripts/clonekit.py) through a loop mount, copied onto the default device (`nbdcopy`), a
  snapshot, SNAP_CLONES clones of it (`zbd clone`, served), each given SNAP_NEW_PCT % of the image
  in new files through its own ext4 (the export attached by nbdfuse + losetup, mounted, written,
  flushed, unmounted, detached); the bytes stored (the volume's live bytes) against one image's
  (goal <= 1.6, against 10x for copies) and the time taken; each clone read back (fsck, diff) and
  read at 128 KiB against the base device (goal >= 0.9x); then the same clone set on btrfs (a loop
  device over a sparse file of ours) for each of SNAP_BTRFS_COMPRESS ("none" or a compress-force
  value) x SNAP_BTRFS_CLONE ("reflink": `cp --reflink=always`, "snapshot": a subvolume snapshot),
  its data used (`btrfs filesystem df`) and time, side by side;
- retained: SNAP_HOLD_MB written to a SNAP_HOLD_SIZE volume, then SNAP_RETAINED snapshots or
  none, then the server killed (SIGKILL) and started again: the time until it serves, and its
  peak RSS after reading SNAP_READ_MB at random (goal: within 10 % of the arm without snapshots);
- first: the metadata bytes the first 4 KiB write into each map leaf after a snapshot costs, against
  the same writes without one and in a hot region that SNAP_HOT_ERAS retained snapshots each saw
  rewritten, and a second write into each such leaf (`first_write`);
- delete: a snapshot alone holding SNAP_DEL_MB (its origin rewrote it) deleted while 4 KiB random
  writes go to the origin for SNAP_DEL_S seconds, against the same writes with no delete: the
  delete's time and the writers' p99.9 and maximum latency;
- many: SNAP_MANY snapshots of a SNAP_MANY_SIZE volume filled with SNAP_MANY_MB, one 4 KiB write
  into a different map leaf before each (so each keeps pages of its own): the time of each
  `zbd snapshot create`, then `zbd snapshot list` and `zbd device list`, a restart after SIGKILL
  (time until it serves, RSS), `zbd check` offline, and SNAP_MANY_DELETES deletes in random
  order (the issue's "test at least 1,000"; RBD caps an image at a few hundred).

fio data is set explicitly (`refill_buffers`, `buffer_compress_percentage=50`). Writes
OUTDIR/summary.json and OUTDIR/summary.md; fio job files and outputs under OUTDIR/runs/. Standard
library only; creates only its own volumes, servers, sockets, files, loop devices and mounts and undoes
them on exit. The clones part needs root (loop devices, mounts, FUSE).

    scripts/bench-snapshots.py OUTDIR

env: ZBD_BIN (target/release/zbd), DEDUP_DIR (/var/tmp), SNAP_SIZE (4G), SNAP_CAPACITY (24G: the
     load arm's data area), SNAP_FILL_MB (1024),
     SNAP_LOAD_S (100), SNAP_EVERY_S (5), SNAP_IMAGE_SIZE (4G), SNAP_IMAGE_FILL_MB (2048),
     SNAP_NEW_PCT (5), SNAP_CLONES (10), SNAP_READ_ROUNDS (3), SNAP_READ_S (4),
     SNAP_BTRFS_COMPRESS ("none zstd:1"), SNAP_BTRFS_CLONE ("reflink snapshot"), SNAP_HOLD_SIZE (64G),
     SNAP_HOLD_MB (8192), SNAP_RETAINED (100), SNAP_READ_MB (256), SNAP_DEL_MB (2048), SNAP_DEL_S (40),
     SNAP_FW_SIZE (4G), SNAP_FW_MB (2048), SNAP_HOT_MB (256), SNAP_HOT_ERAS (30), SNAP_MANY (1000),
     SNAP_MANY_SIZE (1G), SNAP_MANY_MB (512), SNAP_MANY_DELETES (50),
     SNAP_PARTS ("load first clones retained delete many").
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import clonekit
from benchkit import Undo, missing_tools, run, say, stop, wait_for, work_dir

SCHEMA_VERSION = 2  # 2: clones on an ext4 image, beside btrfs
MIB = 1 << 20
FIO_SEED = 20240229
TREE_SEED = 2800  # the clone set's files (clonekit.write_tree)
CLONE_TOOLS = ["mkfs.ext4", "fsck.ext4", "losetup", "nbdfuse", "fusermount3", "nbdcopy", "mkfs.btrfs",
               "btrfs", "compsize"]


@dataclass
class Settings:
    zbd: str
    work: Path
    out: Path
    env: dict[str, str]

    def num(self, key: str, default: int) -> int:
        return int(self.env.get(key, default))

    def text(self, key: str, default: str) -> str:
        return self.env.get(key, default)


class Server:
    """One `zbd serve` of a fresh or existing volume on a Unix socket of its own."""

    def __init__(self, st: Settings, undo: Undo, vol: Path, tag: str) -> None:
        self.st, self.vol, self.tag = st, vol, tag
        self.sock_dir = Path(tempfile.mkdtemp(prefix="zbd-sn-", dir="/run" if os.access("/run", os.W_OK) else None))
        self.sock, self.pidfile = self.sock_dir / "nbd.sock", vol.parent / f"{tag}.pid"
        self.proc: subprocess.Popen[bytes] | None = None
        self.last_exit: int | None = None
        self.undo_entry = undo.push(f"stop zbd serve {tag}", self.stop)
        self.undo = undo

    def start(self) -> float:
        """Starts it; returns the seconds until it serves (socket and pidfile)."""
        self.pidfile.unlink(missing_ok=True)
        self.sock_dir.mkdir(mode=0o700, exist_ok=True)  # `stop` removes it
        log = (self.st.out / "runs" / f"{self.tag}-serve.log").open("ab")
        argv = [self.st.zbd, "serve", str(self.vol), "--socket", str(self.sock), "--pidfile", str(self.pidfile)]
        started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        proc = self.proc
        wait_for(
            lambda: proc.poll() is not None or (self.sock.exists() and self.pidfile.exists()),
            "zbd serve",
            timeout_s=600,
        )
        if proc.poll() is not None:
            raise RuntimeError(f"zbd serve exited ({proc.returncode}); log {log.name}")
        return time.monotonic() - started

    def uri(self, export: str = "") -> str:
        return f"nbd+unix:///{export}?socket={self.sock}"

    def kill(self) -> None:
        """SIGKILL: a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def hwm_kib(self) -> int | None:
        if not self.proc:
            return None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        return None

    def stop(self) -> None:
        if self.proc:
            stop(self.proc)
            self.last_exit = self.proc.returncode
            self.proc = None
        run(["rm", "-rf", str(self.sock_dir)], check=False)

    def stop_cleanly(self, what: str) -> None:
        """`stop`, failing unless the server exited 0: only a clean close writes its checkpoint."""
        self.stop()
        if self.last_exit != 0:
            raise RuntimeError(f"{what}: zbd serve exited {self.last_exit}")


def fio(st: Settings, tag: str, uri: str, options: dict[str, Any]) -> dict[str, Any]:
    job = ["[global]", "ioengine=nbd", f"uri={uri}", "randrepeat=1", f"randseed={FIO_SEED}",
           "refill_buffers=1", "buffer_compress_percentage=50", "buffer_compress_chunk=4k"]
    job += [f"{k}={v}" for k, v in options.items()] + ["", f"[{tag}]", ""]
    path = st.out / "runs" / f"{tag}.fio"
    path.write_text("\n".join(job))
    output = st.out / "runs" / f"{tag}.json"
    done = run(["fio", "--output-format=json", f"--output={output}", str(path)], check=False)
    if done.returncode != 0:
        raise RuntimeError(f"fio exited {done.returncode} on {path}: {(done.stderr or done.stdout)[-400:]}")
    text = output.read_text()
    j = json.loads(text[text.find("{") :])["jobs"][0]
    side = j["write"] if j["write"]["io_bytes"] else j["read"]
    runtime = float(j["job_runtime"]) / 1000
    pct = side.get("clat_ns", {}).get("percentile", {})
    return {
        "mib_s": side["io_bytes"] / MIB / runtime if runtime else 0.0,
        "p99_9_us": pct.get("99.900000", 0) / 1000,
        "p99_us": pct.get("99.000000", 0) / 1000,
        "max_us": side.get("clat_ns", {}).get("max", 0) / 1000,
    }


def fresh(st: Settings, undo: Undo, size: str, capacity: str | None = None) -> Path:
    """A new volume (a sparse file): `capacity` of data area when given (snapshots keep what the
    origin overwrites, so the load arm needs room for all of it)."""
    vol_dir = Path(tempfile.mkdtemp(prefix="vol-", dir=st.work))
    undo.push(f"remove {vol_dir}", lambda: run(["rm", "-rf", "--one-file-system", str(vol_dir)]))
    vol = vol_dir / "vol.zbd"
    room = ["--capacity", capacity] if capacity else []
    run([st.zbd, "create", str(vol), "--size", size, *room, "--codec", "lz4", "--metadata-pages", "--force"])
    return vol


def stat(st: Settings, vol: Path) -> dict[str, Any]:
    return json.loads(run([st.zbd, "stat", str(vol), "--json"]).stdout)


def load(st: Settings, undo: Undo) -> dict[str, Any]:
    size, fill_mb = st.text("SNAP_SIZE", "4G"), st.num("SNAP_FILL_MB", 1024)
    seconds, every = st.num("SNAP_LOAD_S", 100), st.num("SNAP_EVERY_S", 5)
    arms: dict[str, Any] = {}
    for arm in ("without", "with"):
        vol = fresh(st, undo, size, st.text("SNAP_CAPACITY", "24G"))
        server = Server(st, undo, vol, f"load-{arm}")
        server.start()
        fio(st, f"load-{arm}-fill", server.uri(), {"rw": "write", "bs": "128k", "iodepth": 4,
                                                  "size": f"{fill_mb}M", "end_fsync": 1})
        taken = 0
        snapshots: list[float] = []
        options = {"rw": "randwrite", "bs": "4k", "iodepth": 16, "size": size, "time_based": 1,
                   "runtime": seconds, "norandommap": 1}
        with ThreadPoolExecutor(max_workers=1) as pool:
            writes = pool.submit(fio, st, f"load-{arm}", server.uri(), options)
            if arm == "with":
                deadline = time.monotonic() + seconds - every / 2
                while time.monotonic() < deadline:
                    time.sleep(every)  # the snapshots' pace, not a synchronisation
                    t0 = time.monotonic()
                    run([st.zbd, "snapshot", "create", f"{vol}@s{taken}"])
                    snapshots.append(time.monotonic() - t0)
                    taken += 1
            result = writes.result()
        arms[arm] = {**result, "snapshots": taken,
                     "snapshot_s_max": max(snapshots) if snapshots else None}
        server.stop()
        say(f"  load {arm} snapshots: {result['mib_s']:.1f} MiB/s, p99.9 {result['p99_9_us']:.0f} us, {taken} taken")
    w, wo = arms["with"], arms["without"]
    return {
        "arms": arms,
        "throughput_ratio": w["mib_s"] / wo["mib_s"] if wo["mib_s"] else None,
        "p99_9_ratio": w["p99_9_us"] / wo["p99_9_us"] if wo["p99_9_us"] else None,
    }


def clones(st: Settings, undo: Undo) -> dict[str, Any]:
    """One ext4 image on the default device, a snapshot, SNAP_CLONES clones, each given its own
    tree of new files through its own ext4 (nbdfuse + loop device, mounted); then the same clone set
    on btrfs for each SNAP_BTRFS_COMPRESS x SNAP_BTRFS_CLONE."""
    size = clonekit.size_bytes(st.text("SNAP_IMAGE_SIZE", "4G"))
    fill, count = st.num("SNAP_IMAGE_FILL_MB", 2048) * MIB, st.num("SNAP_CLONES", 10)
    new_bytes = size * st.num("SNAP_NEW_PCT", 5) // 100
    data = st.work / "clone-data"
    data.mkdir()
    t0 = time.monotonic()
    image = clonekit.build_image(undo, data, size, fill, TREE_SEED)
    trees = [data / f"new-c{i}" for i in range(count)]
    for i, tree in enumerate(trees):
        clonekit.write_tree(tree, new_bytes, TREE_SEED + 1 + i)
    say(f"  image: {image['files_bytes'] / MIB:.0f} MiB of files in a {size / MIB:.0f} MiB ext4 "
        f"({image['fs_used_bytes'] / MIB:.0f} MiB used), {count} trees of {new_bytes / MIB:.0f} MiB; "
        f"{time.monotonic() - t0:.0f} s")
    result: dict[str, Any] = {"image": image, "clones": count, "new_bytes_each": new_bytes,
                              "zbd": zbd_clones(st, undo, Path(image["path"]), trees)}
    result["btrfs"] = []
    if "btrfs" not in Path("/proc/filesystems").read_text():
        result["btrfs_skipped"] = "the kernel has no btrfs (/proc/filesystems)"
        return result
    for compress in st.text("SNAP_BTRFS_COMPRESS", "none zstd:1").split():
        for method in st.text("SNAP_BTRFS_CLONE", "reflink snapshot").split():
            result["btrfs"].append(clonekit.btrfs_clones(
                undo, st.work, Path(image["path"]), trees, compress, method, 4 * size))
    return result


def zbd_clones(st: Settings, undo: Undo, image: Path, trees: list[Path]) -> dict[str, Any]:
    size = image.stat().st_size
    vol = fresh(st, undo, f"{size // MIB}M", f"{2 * size // MIB}M")
    server = Server(st, undo, vol, "clones")
    server.start()
    t0 = time.monotonic()
    run(["nbdcopy", "--flush", str(image), server.uri()])
    import_s = time.monotonic() - t0
    one = stat(st, vol)
    t0 = time.monotonic()
    run([st.zbd, "snapshot", "create", f"{vol}@base"])
    snapshot_s = time.monotonic() - t0
    clone_s = 0.0
    for i in range(len(trees)):
        t0 = time.monotonic()
        run([st.zbd, "clone", f"{vol}@base", f"c{i}"])
        clone_s += time.monotonic() - t0
    write_s: list[float] = []
    for i, tree in enumerate(trees):
        t0 = time.monotonic()
        layers = clonekit.Layers(undo)
        device = clonekit.attach_export(layers, server.uri(f"c{i}"), st.work / f"fuse-c{i}")
        clonekit.write_through_ext4(layers, device, st.work / "clone-mnt", tree)
        layers.close()
        write_s.append(time.monotonic() - t0)
    stored = stat(st, vol)
    # the image's own files beside, for the first clone (every other clone wrote after it) and the last
    image_layers = clonekit.Layers(undo)
    reference = st.work / "image-ro"
    image_dev = clonekit.loop(image_layers, image, ["--read-only"])
    clonekit.mount(image_layers, image_dev, reference, "ext4", "ro,noload")
    ends = {0, len(trees) - 1}
    checked = [verify_clone(st, undo, server, f"c{i}", tree, reference if i in ends else None)
               for i, tree in enumerate(trees)]
    image_layers.close()
    reads = read_speeds(st, server, ["", *(f"c{i}" for i in range(len(trees)))])
    server.stop()
    offline = stat(st, vol)
    base_read = reads.pop("base")
    fields = ("physical_bytes_live", "physical_bytes_allocated", "data_logical_bytes", "data_stored_bytes",
              "dead_bytes")
    say(f"  zbd: {stored['physical_bytes_live'] / MIB:.0f} MiB live for one image of "
        f"{one['physical_bytes_live'] / MIB:.0f} MiB; clones {clone_s:.2f} s, new data {sum(write_s):.1f} s")
    return {
        "one": {k: one.get(k) for k in fields},
        "stored": {k: stored.get(k) for k in fields},
        "offline": {k: offline.get(k) for k in fields},
        "devices": len(stored.get("devices", [])),
        "backing_allocated_bytes": vol.stat().st_blocks * 512,
        "import_s": import_s,
        "snapshot_s": snapshot_s,
        "clone_s": clone_s,
        "write_s": write_s,
        "verified": checked,
        "read_mib_s": {"base": base_read, **reads},
        "read_ratio_min": min(reads.values()) / base_read if base_read else None,
    }


def verify_clone(
    st: Settings, undo: Undo, server: Server, export: str, tree: Path, image: Path | None
) -> str:
    """The clone read back through a read-only attachment: `fsck.ext4 -fn` clean, its new/ equal to
    the tree it was given and, when `image` (the image mounted) is given, its files/ equal to the
    image's (`diff -r`); returns what was compared."""
    layers = clonekit.Layers(undo)
    device = clonekit.attach_export(layers, server.uri(export), st.work / f"verify-{export}", read_only=True)
    fsck = run(["fsck.ext4", "-fn", device], check=False)
    if fsck.returncode != 0:
        raise RuntimeError(f"fsck.ext4 -fn on clone {export} exited {fsck.returncode}: {fsck.stdout[-600:]}")
    mnt = st.work / "verify-mnt"
    clonekit.mount(layers, device, mnt, "ext4", "ro,noload")
    pairs = [(tree, mnt / "new"), *([(image / "files", mnt / "files")] if image else [])]
    for want, got in pairs:
        diff = run(["diff", "-r", "-q", str(want), str(got)], check=False)
        if diff.returncode != 0:
            why = (diff.stdout + diff.stderr)[-600:]
            raise RuntimeError(f"clone {export}: {got} differs from {want}: {why}")
    layers.close()
    return f"{export}: fsck, new/" + (", files/" if image else "")


def read_speeds(st: Settings, server: Server, exports: list[str]) -> dict[str, float]:
    """128 KiB sequential reads of each whole export (fio nbd engine, SNAP_READ_S seconds), in
    SNAP_READ_ROUNDS rounds whose order rotates; the median MiB/s of each ("" is "base")."""
    rounds, seconds = st.num("SNAP_READ_ROUNDS", 3), st.num("SNAP_READ_S", 4)
    got: dict[str, list[float]] = {name or "base": [] for name in exports}
    for r in range(rounds):
        for name in exports[r % len(exports) :] + exports[: r % len(exports)]:
            got[name or "base"].append(fio(st, f"clones-read-{name or 'base'}-{r}", server.uri(name), {
                "rw": "read", "bs": "128k", "iodepth": 4, "time_based": 1, "runtime": seconds})["mib_s"])
    return {name: statistics.median(v) for name, v in got.items()}


def retained(st: Settings, undo: Undo) -> dict[str, Any]:
    size, hold_mb = st.text("SNAP_HOLD_SIZE", "64G"), st.num("SNAP_HOLD_MB", 8192)
    count, read_mb = st.num("SNAP_RETAINED", 100), st.num("SNAP_READ_MB", 256)
    arms: dict[str, Any] = {}
    for arm, snaps in (("none", 0), ("snapshots", count)):
        vol = fresh(st, undo, size)
        server = Server(st, undo, vol, f"retained-{arm}")
        server.start()
        fio(st, f"retained-{arm}-fill", server.uri(), {"rw": "write", "bs": "128k", "iodepth": 4,
                                                      "size": f"{hold_mb}M", "end_fsync": 1})
        for i in range(snaps):
            run([st.zbd, "snapshot", "create", f"{vol}@s{i}"])
        server.kill()
        reopen_s = server.start()
        fio(st, f"retained-{arm}-read", server.uri(), {"rw": "randread", "bs": "4k", "iodepth": 16,
                                                      "size": f"{hold_mb}M", "io_size": f"{read_mb}M"})
        arms[arm] = {"snapshots": snaps, "reopen_s": reopen_s, "rss_kib": server.hwm_kib()}
        server.stop()
        say(f"  retained {arm}: reopen {reopen_s:.2f} s, RSS {arms[arm]['rss_kib']} KiB")
    a, b = arms["snapshots"], arms["none"]
    return {
        "arms": arms,
        "reopen_ratio": a["reopen_s"] / b["reopen_s"] if b["reopen_s"] else None,
        "rss_ratio": a["rss_kib"] / b["rss_kib"] if a["rss_kib"] and b["rss_kib"] else None,
    }


def delete(st: Settings, undo: Undo) -> dict[str, Any]:
    """A snapshot that alone holds SNAP_DEL_MB (its origin rewrote it all) deleted through the
    control socket while 4 KiB random writes at iodepth 16 go to the origin; against the same
    writes with no delete: how long the delete took and what it did to the writers' latency."""
    size, del_mb, seconds = st.text("SNAP_SIZE", "4G"), st.num("SNAP_DEL_MB", 2048), st.num("SNAP_DEL_S", 40)
    arms: dict[str, Any] = {}
    for arm in ("without", "with"):
        vol = fresh(st, undo, size, st.text("SNAP_CAPACITY", "24G"))
        server = Server(st, undo, vol, f"delete-{arm}")
        server.start()
        fill = {"rw": "write", "bs": "128k", "iodepth": 4, "size": f"{del_mb}M", "end_fsync": 1}
        fio(st, f"delete-{arm}-fill", server.uri(), fill)
        run([st.zbd, "snapshot", "create", f"{vol}@old"])
        fio(st, f"delete-{arm}-rewrite", server.uri(), {**fill, "randseed": FIO_SEED + 1})
        options = {"rw": "randwrite", "bs": "4k", "iodepth": 16, "size": size, "time_based": 1,
                   "runtime": seconds, "norandommap": 1}
        took = None
        with ThreadPoolExecutor(max_workers=1) as pool:
            writes = pool.submit(fio, st, f"delete-{arm}", server.uri(), options)
            time.sleep(seconds / 4)  # let the writers settle first; a pace, not a synchronisation
            if arm == "with":
                t0 = time.monotonic()
                run([st.zbd, "snapshot", "delete", f"{vol}@old"])
                took = time.monotonic() - t0
            result = writes.result()
        arms[arm] = {**result, "delete_s": took}
        server.stop()
        say(f"  delete {arm}: {result['mib_s']:.1f} MiB/s, p99.9 {result['p99_9_us']:.0f} us, "
            f"max {result['max_us']:.0f} us" + (f", delete {took:.1f} s" if took else ""))
    w, wo = arms["with"], arms["without"]
    return {
        "arms": arms,
        "delete_s": w["delete_s"],
        "p99_9_ratio": w["p99_9_us"] / wo["p99_9_us"] if wo["p99_9_us"] else None,
        "max_ratio": w["max_us"] / wo["max_us"] if wo["max_us"] else None,
    }


LEAF_BLOCKS = 255  # map entries per leaf page (4 KiB page, 16-byte header and entries)


def many(st: Settings, undo: Undo) -> dict[str, Any]:
    """SNAP_MANY snapshots kept at once, each after one 4 KiB write into a leaf of its own: what
    creating, listing, restarting, checking and deleting cost with that many (medians and the
    slowest, in seconds)."""
    size, fill_mb = st.text("SNAP_MANY_SIZE", "1G"), st.num("SNAP_MANY_MB", 512)
    count, deletes = st.num("SNAP_MANY", 1000), st.num("SNAP_MANY_DELETES", 50)
    vol = fresh(st, undo, size)
    server = Server(st, undo, vol, "many")
    server.start()
    fio(st, "many-fill", server.uri(), {"rw": "write", "bs": "128k", "iodepth": 4, "size": f"{fill_mb}M",
                                        "end_fsync": 1})
    leaves = fill_mb * MIB // (LEAF_BLOCKS * 4096)

    def timed(argv: list[str]) -> float:
        t0 = time.monotonic()
        run(argv)
        return time.monotonic() - t0

    create_s = []
    for i in range(count):
        # One block in leaf i (mod the filled leaves), written and flushed before the snapshot.
        fio(st, "many-write", server.uri(), {"rw": "write", "bs": "4k", "size": "4k", "number_ios": 1,
                                             "offset": f"{(i % leaves) * LEAF_BLOCKS * 4}k", "end_fsync": 1})
        create_s.append(timed([st.zbd, "snapshot", "create", f"{vol}@s{i}"]))
        if (i + 1) % 100 == 0:
            say(f"  many: {i + 1} snapshots, the last took {create_s[-1]:.3f} s")
    snapshot_list_s = timed([st.zbd, "snapshot", "list", str(vol), "--json"])
    device_list_s = timed([st.zbd, "device", "list", str(vol), "--json"])
    server.kill()
    reopen_s = server.start()
    fio(st, "many-read", server.uri(), {"rw": "randread", "bs": "4k", "iodepth": 16, "size": f"{fill_mb}M",
                                        "io_size": "64M"})
    rss_kib = server.hwm_kib()
    server.stop_cleanly("many, before the check")
    check_s = timed([st.zbd, "check", str(vol)])
    server.start()
    order = list(range(count))
    random.Random(FIO_SEED).shuffle(order)
    delete_s = [timed([st.zbd, "snapshot", "delete", f"{vol}@s{i}"]) for i in order[:deletes]]
    server.stop_cleanly("many, after the deletes")
    run([st.zbd, "check", str(vol)])
    out = {
        "snapshots": count,
        "create_s": {"first": create_s[0], "median": statistics.median(create_s), "max": max(create_s),
                     "last_100_median": statistics.median(create_s[-100:])},
        "snapshot_list_s": snapshot_list_s,
        "device_list_s": device_list_s,
        "reopen_s": reopen_s,
        "rss_kib": rss_kib,
        "check_s": check_s,
        "deletes": deletes,
        "delete_s": {"median": statistics.median(delete_s), "max": max(delete_s)},
    }
    say(f"  many: list {snapshot_list_s:.2f} s, reopen {reopen_s:.2f} s, check {check_s:.1f} s, "
        f"delete median {out['delete_s']['median']:.3f} s")
    return out


def first_write(st: Settings, undo: Undo) -> dict[str, Any]:
    """What the first write into a map leaf after a snapshot costs in metadata (the issue's "write
    amplification of the first write to a block after a snapshot"), against the same write with no
    snapshot, and in a hot region that every retained snapshot's era rewrote (design.md, "Cost of
    the first write after a snapshot": an ext4 journal, bitmaps, a WAL). Arms: plain (a SNAP_FW_SIZE
    volume filled with SNAP_FW_MB), snapshot (the same, then `zbd snapshot create`), hot (SNAP_HOT_MB
    written SNAP_HOT_ERAS times, each time with new data and a snapshot after it). Then, with the
    server stopped between passes so that each pass ends in the close's checkpoint and the counters
    persisted in it (`zbd stat`) hold everything the pass wrote: an idle pass (serve, stop: the
    constant), pass 1 (one 4 KiB write at the first block of every leaf of the region: `rw=write:`
    with a one-leaf stride) and pass 2 (the second block of every leaf: leaves already copied, slots
    still shared)."""
    size, fill_mb = st.text("SNAP_FW_SIZE", "4G"), st.num("SNAP_FW_MB", 2048)
    hot_mb, eras = st.num("SNAP_HOT_MB", 256), st.num("SNAP_HOT_ERAS", 30)
    stride_k = LEAF_BLOCKS * 4 - 4

    def counters(vol: Path) -> dict[str, int]:
        return stat(st, vol)["counters"]

    arms: dict[str, Any] = {}
    for arm, region_mb, snapshots in (("plain", fill_mb, 0), ("snapshot", fill_mb, 1), ("hot", hot_mb, eras)):
        # Each era keeps its own copy of the region (compressed about 2:1).
        vol = fresh(st, undo, size, f"{max(4096, region_mb * (snapshots + 2)) // 1024 + 1}G")
        server = Server(st, undo, vol, f"first-{arm}")
        server.start()
        for era in range(max(1, snapshots)):
            fio(st, f"first-{arm}-fill{era}", server.uri(), {
                "rw": "write", "bs": "128k", "iodepth": 4, "size": f"{region_mb}M", "end_fsync": 1,
                "randseed": FIO_SEED + era})
            if snapshots:
                run([st.zbd, "snapshot", "create", f"{vol}@s{era}"])
        server.stop_cleanly(f"first-write {arm}, after the fill")
        passes: dict[str, Any] = {"snapshots": snapshots, "region_mb": region_mb}
        for name, offset_k in (("idle", None), ("pass1", 0), ("pass2", 4)):
            before = counters(vol)
            server.start()
            writes = 0
            if offset_k is not None:
                writes = region_mb * MIB // (LEAF_BLOCKS * 4096)
                fio(st, f"first-{arm}-{name}", server.uri(), {
                    "rw": f"write:{stride_k}k", "bs": "4k", "iodepth": 16, "offset": f"{offset_k}k",
                    "size": f"{region_mb}M", "number_ios": writes, "end_fsync": 1})
            server.stop_cleanly(f"first-write {arm} {name}")  # the checkpoint whose counters it reads
            after = counters(vol)
            passes[name] = {"writes": writes, **{k: after[k] - before[k] for k in (
                "metadata_bytes_written", "data_bytes_written", "checkpoints", "host_bytes_written")}}
        idle = passes["idle"]["metadata_bytes_written"]
        for name in ("pass1", "pass2"):
            p = passes[name]
            if p["host_bytes_written"] != p["writes"] * 4096:
                raise RuntimeError(f"first-write {arm} {name}: host wrote {p['host_bytes_written']} bytes, "
                                   f"expected {p['writes']} writes of 4 KiB")
            p["metadata_per_write"] = (p["metadata_bytes_written"] - idle) / p["writes"]
        arms[arm] = passes
        say(f"  first-write {arm}: " + ", ".join(
            f"{n} {arms[arm][n]['metadata_per_write'] / 1024:.1f} KiB/write" for n in ("pass1", "pass2")))
    return {"arms": arms, "fill_mb": fill_mb, "size": size, "hot_mb": hot_mb, "eras": eras}


def markdown(doc: dict[str, Any]) -> str:
    out = ["## Snapshots and clones (scripts/bench-snapshots.py)", ""]
    s = doc["settings"]
    if "load" in doc:
        d = doc["load"]
        out += [
            (
                f"Under load: 4 KiB random writes, iodepth 16, {s['load_s']} s on a {s['size']} volume "
                f"filled with {s['fill_mb']} MiB; a snapshot every {s['every_s']} s in one arm."
            ),
            "",
            "| arm | MiB/s | p99.9 (us) | snapshots |",
            "|---|---|---|---|",
        ]
        for arm in ("without", "with"):
            a = d["arms"][arm]
            out.append(f"| {arm} snapshots | {a['mib_s']:.1f} | {a['p99_9_us']:.0f} | {a['snapshots']} |")
        ratios = (
            f"Throughput with / without: **{d['throughput_ratio']:.2f}x** (goal >= 0.9); "
            f"p99.9 with / without: **{d['p99_9_ratio']:.2f}x** (goal <= 3)."
        )
        out += ["", ratios, ""]
    if "first" in doc:
        d = doc["first"]
        out += [
            (
                f"First write after a snapshot: a {d['size']} volume holding {d['fill_mb']} MiB; one 4 KiB "
                "write at the first block of every map leaf (pass 1), then at the second (pass 2), each "
                "pass ended by a stop of the server; metadata bytes written (map pages both copies, "
                "checkpoints) per write, less an idle serve and stop."
            ),
            "",
            "| arm | pass | writes | metadata per write (KiB) | checkpoints | data per write (KiB) |",
            "|---|---|---|---|---|---|",
        ]
        for arm, a in d["arms"].items():
            for name in ("pass1", "pass2"):
                p = a[name]
                out.append(
                    f"| {arm} | {name} | {p['writes']} | {p['metadata_per_write'] / 1024:.1f} | "
                    f"{p['checkpoints']} | {p['data_bytes_written'] / p['writes'] / 1024:.1f} |"
                )
        plain, snap = d["arms"]["plain"]["pass1"], d["arms"]["snapshot"]["pass1"]
        out += ["", (
            f"First write into a leaf after a snapshot: **{snap['metadata_per_write'] / 1024:.1f} KiB** of "
            f"metadata against {plain['metadata_per_write'] / 1024:.1f} KiB without a snapshot "
            f"({snap['metadata_per_write'] / plain['metadata_per_write']:.1f}x)."
        )]
        if "hot" in d["arms"]:
            hot = d["arms"]["hot"]["pass1"]
            out += [(
                f"In a hot region ({d['hot_mb']} MiB written {d['eras']} times, a snapshot after each, all "
                f"retained): **{hot['metadata_per_write'] / 1024:.1f} KiB** "
                f"({hot['metadata_per_write'] / plain['metadata_per_write']:.1f}x)."
            )]
        out += [""]
    if "clones" in doc:
        out += clones_markdown(doc["clones"])
    if "retained" in doc:
        d = doc["retained"]
        out += [
            (
                f"Retained: a {s['hold_size']} volume holding {s['hold_mb']} MiB, {s['retained']} "
                "snapshots or none, then SIGKILL and a restart."
            ),
            "",
            "| arm | reopen (s) | peak RSS (MiB) |",
            "|---|---|---|",
        ]
        for arm in ("none", "snapshots"):
            a = d["arms"][arm]
            out.append(f"| {arm} | {a['reopen_s']:.2f} | {(a['rss_kib'] or 0) / 1024:.0f} |")
        out += ["", f"Reopen **{d['reopen_ratio']:.2f}x**, RSS **{d['rss_ratio']:.2f}x** (goal: within 1.10).", ""]
    if "delete" in doc:
        d = doc["delete"]
        out += [
            (
                f"Delete under load: a snapshot alone holding {s['del_mb']} MiB (its origin rewrote "
                f"it) deleted while 4 KiB random writes (iodepth 16, {s['del_s']} s) go to the origin."
            ),
            "",
            "| arm | MiB/s | p99.9 (us) | max (us) | delete (s) |",
            "|---|---|---|---|---|",
        ]
        for arm in ("without", "with"):
            a = d["arms"][arm]
            took = f"{a['delete_s']:.1f}" if a["delete_s"] is not None else "-"
            out.append(f"| {arm} delete | {a['mib_s']:.1f} | {a['p99_9_us']:.0f} | {a['max_us']:.0f} | {took} |")
        out += ["", f"p99.9 with / without: **{d['p99_9_ratio']:.2f}x**; max: **{d['max_ratio']:.2f}x**.", ""]
    if "many" in doc:
        d = doc["many"]
        c, dl = d["create_s"], d["delete_s"]
        out += [
            f"Many: {d['snapshots']} snapshots of a {s['many_size']} volume holding {s['many_mb']} MiB, one "
            "4 KiB write into a leaf of its own before each.",
            "",
            "| measure | seconds |",
            "|---|---|",
            f"| `zbd snapshot create`: first / median / last 100 median / slowest | {c['first']:.3f} / "
            f"{c['median']:.3f} / {c['last_100_median']:.3f} / {c['max']:.3f} |",
            f"| `zbd snapshot list --json` / `zbd device list --json` (served) | {d['snapshot_list_s']:.2f} / "
            f"{d['device_list_s']:.2f} |",
            f"| restart after SIGKILL until it serves (peak RSS {d['rss_kib'] / 1024:.0f} MiB after 64 MiB of "
            f"random reads) | {d['reopen_s']:.2f} |",
            f"| `zbd check` offline | {d['check_s']:.1f} |",
            f"| `zbd snapshot delete` ({d['deletes']}, random order, served): median / slowest | "
            f"{dl['median']:.3f} / {dl['max']:.3f} |",
            "",
        ]
    return "\n".join(out)


def clones_markdown(d: dict[str, Any]) -> list[str]:
    """The clone set: what it is, zbd beside btrfs (bytes and time), the reads of zbd's clones."""
    img, z, n = d["image"], d["zbd"], d["clones"]
    kinds = ", ".join(f"{k} {v / MIB:.0f}" for k, v in img["files_bytes_by_kind"].items())
    floor = 1 + n * d["new_bytes_each"] / img["files_bytes"]
    out = [
        (
            f"Clones: one {img['size_bytes'] / MIB / 1024:g} GiB ext4 image holding "
            f"{img['files_bytes'] / MIB:.0f} MiB of files (MiB by kind: {kinds}; each 4 KiB block "
            f"{', '.join(str(r) for _, r in clonekit.KINDS)} random bytes by kind, then zeros), "
            f"then {n} clones, each given {d['new_bytes_each'] / MIB:.0f} MiB of new files (5 % of the "
            "image) through its own ext4, mounted over a loop device, flushed and unmounted. zbd: "
            "`nbdcopy` into the default device, `zbd snapshot create`, `zbd clone` (served), each clone "
            "attached by nbdfuse + losetup. btrfs: a loop device over a sparse file, the image copied "
            "in (`cp --sparse=always`), each clone a `cp --reflink=always` of it or a writable "
            "snapshot of the subvolume holding it, loop-mounted."
        ),
        "",
        (
            "Stored: zbd's live bytes (`zbd stat`, data after compression), btrfs's data used "
            "(`btrfs filesystem df`, after `btrfs filesystem sync`); metadata apart (btrfs: one copy of "
            "its DUP metadata); backing file: the blocks allocated to the volume's or the btrfs loop "
            "device's file at the end (data and metadata, never punched back: a high-water mark). "
            "x one image: "
            f"stored after the clones / stored for the image alone (the issue's goal <= 1.6; {n} full "
            f"copies: {n}x); x {n} copies: stored / {n} times one image. With this fill the new data "
            f"alone makes {floor:.2f}x (1 + {n} x new / files); the goal assumes a full image "
            f"(1 + {n} x 5 % = 1.5x). Times: the import of the image, the {n} clone commands, and "
            f"the {n} clones' new data (attach, mount, copy, sync, unmount, detach)."
        ),
        "",
        (
            f"| system | one image (MiB) | image + {n} clones (MiB) | x one image | x {n} copies "
            f"| metadata (MiB) | backing file (MiB) | import (s) | {n} clones (s) | new data (s) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    zl, zone = z["stored"]["physical_bytes_live"], z["one"]["physical_bytes_live"]
    out.append(
        f"| zbd lz4, `zbd clone` | {zone / MIB:.0f} | {zl / MIB:.0f} | **{zl / zone:.2f}x** | "
        f"{zl / (n * zone):.2f}x | - | {z['backing_allocated_bytes'] / MIB:.0f} | {z['import_s']:.1f} | "
        f"{z['clone_s']:.2f} | {sum(z['write_s']):.1f} |"
    )
    for b in d["btrfs"]:
        one, got = b["one"]["data"], b["stored"]["data"]
        codec = "no compression" if b["compress"] == "none" else f"compress-force={b['compress']}"
        how = "`cp --reflink`" if b["method"] == "reflink" else "subvolume snapshot"
        out.append(
            f"| btrfs {codec}, {how} | {one / MIB:.0f} | {got / MIB:.0f} | **{got / one:.2f}x** | "
            f"{got / (n * one):.2f}x | {b['stored']['metadata'] / MIB:.0f} | "
            f"{b['backing_allocated_bytes'] / MIB:.0f} | {b['import_s']:.1f} | "
            f"{b['clone_s']:.2f} | {sum(b['write_s']):.1f} |"
        )
    if d.get("btrfs_skipped"):
        out += ["", f"btrfs not run: {d['btrfs_skipped']}."]
    reads = ", ".join(f"{k} {v:.0f}" for k, v in z["read_mib_s"].items())
    out += [
        "",
        (
            f"zbd's clones read back: `fsck.ext4 -fn` clean and new/ equal to its tree on "
            f"{len(z['verified'])} of {n}; the image's files equal on "
            f"{sum('files/' in v for v in z['verified'])} (the first clone and the last). "
            "128 KiB sequential reads of each whole device (fio nbd "
            f"engine, median of rounds), MiB/s: {reads}; slowest clone / base "
            f"**{z['read_ratio_min']:.2f}x** (goal >= 0.9)."
        ),
        "",
    ]
    return out


def main() -> int:
    if len(sys.argv) != 2:
        usage = next(ln for ln in __doc__.splitlines() if "OUTDIR" in ln and ".py" in ln)
        print(usage.strip(), file=sys.stderr)
        return 2
    out = Path(sys.argv[1]).resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    zbd = os.environ.get("ZBD_BIN", str(Path(__file__).resolve().parent.parent / "target/release/zbd"))
    parts = os.environ.get("SNAP_PARTS", "load first clones retained delete many").split()
    missing = missing_tools(["fio", *(CLONE_TOOLS if "clones" in parts else [])])
    if missing or not Path(zbd).exists():
        print(f"bench-snapshots: missing {', '.join(missing) or zbd}", file=sys.stderr)
        return 1
    if "clones" in parts and os.geteuid() != 0:
        print("bench-snapshots: the clones part needs root (loop devices, mounts, FUSE)", file=sys.stderr)
        return 1
    undo = Undo()
    st = Settings(zbd=zbd, work=work_dir(undo, "zbd-snapshots."), out=out, env=dict(os.environ))
    doc: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "settings": {
            "parts": parts,
            "size": st.text("SNAP_SIZE", "4G"), "fill_mb": st.num("SNAP_FILL_MB", 1024),
            "load_s": st.num("SNAP_LOAD_S", 100), "every_s": st.num("SNAP_EVERY_S", 5),
            "image_size": st.text("SNAP_IMAGE_SIZE", "4G"),
            "image_fill_mb": st.num("SNAP_IMAGE_FILL_MB", 2048),
            "new_pct": st.num("SNAP_NEW_PCT", 5), "clones": st.num("SNAP_CLONES", 10),
            "read_rounds": st.num("SNAP_READ_ROUNDS", 3), "read_s": st.num("SNAP_READ_S", 4),
            "btrfs_compress": st.text("SNAP_BTRFS_COMPRESS", "none zstd:1"),
            "btrfs_clone": st.text("SNAP_BTRFS_CLONE", "reflink snapshot"),
            "hold_size": st.text("SNAP_HOLD_SIZE", "64G"), "hold_mb": st.num("SNAP_HOLD_MB", 8192),
            "retained": st.num("SNAP_RETAINED", 100), "read_mb": st.num("SNAP_READ_MB", 256),
            "del_mb": st.num("SNAP_DEL_MB", 2048), "del_s": st.num("SNAP_DEL_S", 40),
            "fw_size": st.text("SNAP_FW_SIZE", "4G"), "fw_mb": st.num("SNAP_FW_MB", 2048),
            "hot_mb": st.num("SNAP_HOT_MB", 256), "hot_eras": st.num("SNAP_HOT_ERAS", 30),
            "many": st.num("SNAP_MANY", 1000), "many_size": st.text("SNAP_MANY_SIZE", "1G"),
            "many_mb": st.num("SNAP_MANY_MB", 512), "many_deletes": st.num("SNAP_MANY_DELETES", 50),
        },
    }
    try:
        doc["loadavg_start"] = [round(v, 2) for v in os.getloadavg()]
        parts_in_order = (("load", load), ("first", first_write), ("clones", clones), ("retained", retained),
                          ("delete", delete), ("many", many))
        for part, measure in parts_in_order:
            if part in parts:
                say(f"== {part}")
                doc[part] = measure(st, undo)
        doc["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
        doc["zbd_version"] = run([zbd, "--version"], check=False).stdout.strip()
        (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
        (out / "summary.md").write_text(markdown(doc))
    finally:
        undo.run_all()
    say(f"wrote {out / 'summary.json'} and {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
