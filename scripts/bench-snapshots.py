#!/usr/bin/python3
"""Snapshots and clones (issue 28, "Measure"), through `zbd serve` and fio's nbd engine, each arm on
a fresh volume (`zbd create --metadata-pages`, lz4) in DEDUP_DIR:

- load: 4 KiB random writes at iodepth 16 for SNAP_LOAD_S seconds on the default device of a
  SNAP_SIZE volume first filled with SNAP_FILL_MB, once with `zbd snapshot create` every
  SNAP_EVERY_S seconds through the control socket and once without; MiB/s and the p99.9 write
  latency of each, and their ratios (goals: p99.9 within 3x, throughput >= 0.9x);
- clones: SNAP_BASE_MB written to the default device, a snapshot, SNAP_CLONES clones of it, each
  given 5 % of the base in new 4 KiB random writes through its own export; the bytes stored (the
  volume's live bytes) against one image's (goal <= 1.6x, against 10x for copies), and 128 KiB
  sequential reads of each clone against the base device (goal >= 0.9x);
- retained: SNAP_HOLD_MB written to a SNAP_HOLD_SIZE volume, then SNAP_RETAINED snapshots or
  none, then the server killed (SIGKILL) and started again: the time until it serves, and its
  peak RSS after reading SNAP_READ_MB at random (goal: within 10 % of the arm without snapshots);
- delete: a snapshot alone holding SNAP_DEL_MB (its origin rewrote it) deleted while 4 KiB random
  writes go to the origin for SNAP_DEL_S seconds, against the same writes with no delete: the
  delete's time and the writers' p99.9 and maximum latency.

fio data is set explicitly (`refill_buffers`, `buffer_compress_percentage=50`). Writes
OUTDIR/summary.json and OUTDIR/summary.md; fio job files and outputs under OUTDIR/runs/. Standard
library only; creates only its own volumes, servers and sockets and undoes them on exit.

    scripts/bench-snapshots.py OUTDIR

env: ZBD_BIN (target/release/zbd), DEDUP_DIR (/var/tmp), SNAP_SIZE (4G), SNAP_CAPACITY (24G: the
     load arm's data area), SNAP_FILL_MB (1024),
     SNAP_LOAD_S (100), SNAP_EVERY_S (5), SNAP_BASE_MB (1024), SNAP_CLONES (10), SNAP_HOLD_SIZE (64G),
     SNAP_HOLD_MB (8192), SNAP_RETAINED (100), SNAP_READ_MB (256), SNAP_DEL_MB (2048), SNAP_DEL_S (40),
     SNAP_PARTS ("load clones retained delete").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchkit import Undo, missing_tools, run, say, stop, wait_for, work_dir

SCHEMA_VERSION = 1
MIB = 1 << 20
FIO_SEED = 20240229


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
        self.undo_entry = undo.push(f"stop zbd serve {tag}", self.stop)
        self.undo = undo

    def start(self) -> float:
        """Starts it; returns the seconds until it serves (socket and pidfile)."""
        self.pidfile.unlink(missing_ok=True)
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
            self.proc = None
        run(["rm", "-rf", str(self.sock_dir)], check=False)


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
    base_mb, count = st.num("SNAP_BASE_MB", 1024), st.num("SNAP_CLONES", 10)
    vol = fresh(st, undo, f"{base_mb}M", f"{base_mb * 4}M")
    server = Server(st, undo, vol, "clones")
    server.start()
    fio(st, "clones-base", server.uri(), {"rw": "write", "bs": "128k", "iodepth": 4, "end_fsync": 1})
    one = stat(st, vol)["physical_bytes_live"]
    run([st.zbd, "snapshot", "create", f"{vol}@base"])
    new_mb = max(base_mb * 5 // 100, 1)
    for i in range(count):
        run([st.zbd, "clone", f"{vol}@base", f"c{i}"])
        fio(st, f"clones-c{i}-new", server.uri(f"c{i}"), {
            "rw": "randwrite", "bs": "4k", "iodepth": 16, "io_size": f"{new_mb}M", "end_fsync": 1})
    stored = stat(st, vol)["physical_bytes_live"]
    reads = {}
    for name in ("", "c0", f"c{count - 1}"):
        reads[name or "base"] = fio(st, f"clones-read-{name or 'base'}", server.uri(name), {
            "rw": "read", "bs": "128k", "iodepth": 4, "time_based": 1, "runtime": 5})["mib_s"]
    server.stop()
    base_read = reads.pop("base")
    say(f"  clones: {stored / MIB:.0f} MiB stored for one image of {one / MIB:.0f} MiB")
    return {
        "image_bytes": one,
        "stored_bytes": stored,
        "stored_ratio": stored / one if one else None,
        "clones": count,
        "new_mb_each": new_mb,
        "read_mib_s": {"base": base_read, **reads},
        "read_ratio_min": min(reads.values()) / base_read if base_read else None,
    }


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
    if "clones" in doc:
        d = doc["clones"]
        reads = ", ".join(f"{k} {v:.0f}" for k, v in d["read_mib_s"].items())
        out += [
            (
                f"Clones: {d['clones']} clones of one {s['base_mb']} MiB image (50 % compressible), "
                f"{d['new_mb_each']} MiB of new 4 KiB random writes each."
            ),
            "",
            (
                f"- stored {d['stored_bytes'] / MIB:.0f} MiB for an image of {d['image_bytes'] / MIB:.0f} "
                f"MiB: **{d['stored_ratio']:.2f}x** one image (goal <= 1.6; copies: {d['clones']}x)"
            ),
            (
                f"- 128 KiB sequential reads, MiB/s: {reads}; slowest clone / base "
                f"**{d['read_ratio_min']:.2f}x** (goal >= 0.9)"
            ),
            "",
        ]
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
    return "\n".join(out)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-5], file=sys.stderr)
        return 2
    out = Path(sys.argv[1]).resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    zbd = os.environ.get("ZBD_BIN", str(Path(__file__).resolve().parent.parent / "target/release/zbd"))
    missing = missing_tools(["fio"])
    if missing or not Path(zbd).exists():
        print(f"bench-snapshots: missing {', '.join(missing) or zbd}", file=sys.stderr)
        return 1
    undo = Undo()
    st = Settings(zbd=zbd, work=work_dir(undo, "zbd-snapshots."), out=out, env=dict(os.environ))
    parts = st.text("SNAP_PARTS", "load clones retained delete").split()
    doc: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "settings": {
            "size": st.text("SNAP_SIZE", "4G"), "fill_mb": st.num("SNAP_FILL_MB", 1024),
            "load_s": st.num("SNAP_LOAD_S", 100), "every_s": st.num("SNAP_EVERY_S", 5),
            "base_mb": st.num("SNAP_BASE_MB", 1024), "clones": st.num("SNAP_CLONES", 10),
            "hold_size": st.text("SNAP_HOLD_SIZE", "64G"), "hold_mb": st.num("SNAP_HOLD_MB", 8192),
            "retained": st.num("SNAP_RETAINED", 100), "read_mb": st.num("SNAP_READ_MB", 256),
            "del_mb": st.num("SNAP_DEL_MB", 2048), "del_s": st.num("SNAP_DEL_S", 40),
        },
    }
    try:
        doc["loadavg_start"] = [round(v, 2) for v in os.getloadavg()]
        for part, measure in (("load", load), ("clones", clones), ("retained", retained), ("delete", delete)):
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
