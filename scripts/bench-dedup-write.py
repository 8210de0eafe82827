#!/usr/bin/python3
"""Inline dedup write throughput (issue 27, design step 2b): what writing costs with dedup on against
dedup off, on data with 50 % duplicates and on data with none, and what it stores.

fio's nbd engine against `zbd serve` on a Unix socket (no filesystem, no kernel device; the ext4 case
below goes through both). Per run a
fresh volume (`zbd create --size 4G --metadata-pages --dedup on|off`, codec DEDUP_WRITE_CODEC),
served with `--dedup on|off`, then one fio job of DEDUP_WRITE_MB (1 GiB), then `zbd stat --json`
(through the server) and the server stopped (SIGTERM: flush, close). Writes:
- 4 KiB random writes at iodepth 16, offsets over the whole volume, each block written once;
- 128 KiB sequential writes at iodepth 4 from offset 0;
- as root (and by default where it can): 4 KiB random writes at iodepth 16 through ext4, the
  issue's second path: the export attached by nbdfuse + a loop device (`clonekit.attach_export`),
  mkfs.ext4, mounted, fio's libaio engine with O_DIRECT over a file of DEDUP_WRITE_MB, each block
  once; unmounted and detached before the server stops.
Data (fio, set explicitly): `refill_buffers=1`, `buffer_compress_percentage=50`,
`buffer_compress_chunk=4k` (about 2:1 per 4 KiB block) and `dedupe_percentage=50` (`dedupe_mode=repeat`:
half of fio's buffers, one per `bs`, repeat the last unique one) or `dedupe_percentage=0`. Every job
ends with `end_fsync=1` (an NBD FLUSH), counted in fio's runtime. MiB/s = bytes written / fio's
job_runtime. DEDUP_WRITE_RUNS rounds (3); in each, every case runs dedup off and on, the order
alternating from round to round; the figure is the median.

A zbd without the dedup flags (`zbd create --dedup`) runs the dedup off arms only (without the flag)
and says so in the notes.

Writes OUTDIR/summary.json and OUTDIR/summary.md (the lab draws OUTDIR/dedup-write.png from the JSON:
zbdlab.bench.scripts.dedup_write), and each run's fio job file and JSON output under OUTDIR/runs/.
Standard library only. Creates only its own volumes, servers, sockets, loop devices and mounts; undoes
them on exit or failure (SIGTERM too).

    scripts/bench-dedup-write.py OUTDIR

env: ZBD_BIN (default target/release/zbd), DEDUP_DIR where volumes go (/var/tmp), DEDUP_WRITE_MB (1024),
     DEDUP_WRITE_SIZE (volume size, 4G), DEDUP_WRITE_RUNS (3), DEDUP_WRITE_CODEC (lz4),
     DEDUP_WRITE_INDEX (`zbd serve --dedup-index`; empty: the server's default),
     DEDUP_WRITE_CASES ("rand4k seq128k", and "ext4-rand4k" as root), DEDUP_WRITE_DATA ("dup50 unique").
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import clonekit
from benchkit import Undo, missing_tools, run, say, stop, wait_for, work_dir

SCHEMA_VERSION = 1
MIB = 1 << 20
FIO_SEED = 20240229  # the lab's fixed randseed: same offsets and data in every run
COMPRESS_PERCENTAGE = 50
GOAL_DUP_RATIO = 1.0  # issue 27: with 50 % duplicates, dedup on writes at >= 1.0x dedup off


@dataclass(frozen=True)
class Case:
    key: str
    label: str
    rw: str
    bs: str
    iodepth: int
    ext4: bool = False  # through a file on ext4 on the served volume (root), not fio's nbd engine


CASES = {
    "rand4k": Case("rand4k", "4 KiB random write, iodepth 16", "randwrite", "4k", 16),
    "seq128k": Case("seq128k", "128 KiB sequential write, iodepth 4", "write", "128k", 4),
    "ext4-rand4k": Case(
        "ext4-rand4k", "4 KiB random write through ext4, O_DIRECT, iodepth 16", "randwrite", "4k", 16,
        ext4=True,
    ),
}
EXT4_TOOLS = ["mkfs.ext4", "losetup", "nbdfuse", "fusermount3", "mount", "umount"]
DATA = {"dup50": 50, "unique": 0}  # dedupe_percentage
DATA_LABELS = {"dup50": "50 % duplicates", "unique": "no duplicates"}

# `zbd stat --json` figures kept per run (top level unless dotted)
STAT_KEYS = (
    "logical_bytes_in_use",
    "physical_bytes_live",
    "physical_bytes_allocated",
    "data_blocks",
    "zero_blocks",
    "compression_ratio",
    "dedup_ratio",
    "write_amplification",
)


def pid_written(pidfile: Path) -> bool:
    try:
        return pidfile.read_text().strip().isdigit()
    except OSError:
        return False


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a running process (/proc/PID/stat), all its threads."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def has_dedup_flags(zbd: str) -> bool:
    """Whether this zbd has inline dedup: `create --dedup` and `serve --dedup`."""
    create = run([zbd, "create", "--help"], check=False).stdout
    serve = run([zbd, "serve", "--help"], check=False).stdout
    return "--dedup " in create and "--dedup " in serve


@dataclass
class Settings:
    zbd: str
    work: Path
    out: Path
    size: str
    data_mb: int
    runs: int
    codec: str
    index: str
    flags: bool  # the zbd has --dedup


def fio_job(st: Settings, case: Case, dedupe: int, sock: Path, file: Path | None = None) -> str:
    """One job writing st.data_mb over the st.size device: random offsets over all of it (each block
    once: fio's random map), or sequential from 0. With `file` (an ext4 case): over a file of
    st.data_mb on the mounted filesystem instead, with O_DIRECT (no page cache to flatter it)."""
    target: list[tuple[str, str | int]] = (
        [("ioengine", "nbd"), ("uri", f"nbd+unix:///?socket={sock}"), ("size", st.size)]
        if file is None
        else [("ioengine", "libaio"), ("direct", 1), ("filename", str(file)), ("size", f"{st.data_mb}M")]
    )
    options: list[tuple[str, str | int]] = [
        *target,
        ("rw", case.rw),
        ("bs", case.bs),
        ("iodepth", case.iodepth),
        ("io_size", f"{st.data_mb}M"),
        ("randrepeat", 1),
        ("randseed", FIO_SEED),
        ("refill_buffers", 1),
        ("buffer_compress_percentage", COMPRESS_PERCENTAGE),
        ("buffer_compress_chunk", "4k"),
        ("dedupe_percentage", dedupe),
    ]
    if dedupe:
        options.append(("dedupe_mode", "repeat"))
    options.append(("end_fsync", 1))  # an NBD FLUSH at the end, inside job_runtime
    lines = ["[global]", *(f"{k}={v}" for k, v in options), "", f"[{case.key}]", ""]
    return "\n".join(lines)


def fio_result(path: Path) -> dict[str, Any]:
    """Bytes written and fio's job runtime from its JSON output (notes may precede the object)."""
    text = path.read_text()
    doc = json.loads(text[text.find("{") :])
    job = doc["jobs"][0]
    if int(job.get("error", 0)):
        raise RuntimeError(f"fio reports error {job['error']} ({path})")
    written = int(job["write"]["io_bytes"])
    runtime_s = float(job["job_runtime"]) / 1000
    return {
        "io_bytes": written,
        "runtime_s": runtime_s,
        "mib_s": written / MIB / runtime_s if runtime_s else 0.0,
        "iops": int(job["write"]["total_ios"]) / runtime_s if runtime_s else 0.0,
        "lat_p99_us": job["write"].get("clat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1000,
    }


def pick_stat(stat: dict[str, Any]) -> dict[str, Any]:
    picked: dict[str, Any] = {k: stat.get(k) for k in STAT_KEYS}
    picked["shared"] = stat.get("shared")
    picked["dedup_index"] = stat.get("dedup_index")
    counters = stat.get("counters") or {}
    picked["host_bytes_written"] = counters.get("host_bytes_written")
    picked["data_bytes_written"] = counters.get("data_bytes_written")
    return picked


def measure(st: Settings, undo: Undo, case: Case, data: str, dedup: str, rnd: int) -> dict[str, Any]:
    """One run: fresh volume, served, fio, stat, server stopped, volume removed."""
    tag = f"{case.key}-{data}-dedup-{dedup}-r{rnd + 1}"
    vol_dir = Path(tempfile.mkdtemp(prefix="vol-", dir=st.work))
    removed = undo.push(f"remove {vol_dir}", lambda: run(["rm", "-rf", "--one-file-system", str(vol_dir)]))
    # Unix socket paths must stay under 108 bytes: a short directory of our own
    sock_dir = Path(tempfile.mkdtemp(prefix="zbd-dw-", dir="/run" if os.access("/run", os.W_OK) else None))
    sock_removed = undo.push(f"remove {sock_dir}", lambda: run(["rm", "-rf", str(sock_dir)]))
    vol, sock, pidfile = vol_dir / "vol.zbd", sock_dir / "nbd.sock", vol_dir / "zbd.pid"
    flag = ["--dedup", dedup] if st.flags else []
    create = [st.zbd, "create", str(vol), "--size", st.size, "--codec", st.codec, "--metadata-pages"]
    run([*create, *flag, "--force"])
    serve = [st.zbd, "serve", str(vol), "--socket", str(sock), "--pidfile", str(pidfile), *flag]
    if st.flags and dedup == "on" and st.index:
        serve += ["--dedup-index", st.index]
    log = (st.out / "runs" / f"{tag}-serve.log").open("wb")
    server: list[subprocess.Popen[bytes]] = []
    serving = undo.push("stop our zbd serve", lambda: [stop(p) for p in server])
    server.append(subprocess.Popen(serve, stdout=log, stderr=log, start_new_session=True))
    proc = server[0]
    wait_for(lambda: proc.poll() is not None or (sock.exists() and pid_written(pidfile)), "zbd serve")
    if proc.poll() is not None:
        raise RuntimeError(f"zbd serve exited at start ({proc.returncode}); log {log.name}")
    layers = clonekit.Layers(undo)
    file = None
    if case.ext4:
        device = clonekit.attach_export(layers, f"nbd+unix:///?socket={sock}", vol_dir / "fuse")
        # Inode tables and journal written now, not by ext4lazyinit beside fio.
        run(["mkfs.ext4", "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", device])
        clonekit.mount(layers, device, vol_dir / "mnt", "ext4")
        file = vol_dir / "mnt" / "data"
    job = st.out / "runs" / f"{tag}.fio"
    job.write_text(fio_job(st, case, DATA[data], sock, file))
    output = st.out / "runs" / f"{tag}.json"
    cpu_before = cpu_seconds(proc.pid)
    started = time.monotonic()
    fio = run(["fio", "--output-format=json", f"--output={output}", str(job)], check=False)
    wall_s = time.monotonic() - started
    if fio.returncode != 0:
        raise RuntimeError(
            f"fio exited {fio.returncode} on {job}: {(fio.stderr or fio.stdout).strip()[-400:]}"
        )
    cpu_after = cpu_seconds(proc.pid)
    got = fio_result(output)
    layers.close()  # unmounted and detached (ext4 cases) before the server stops
    stat = json.loads(run([st.zbd, "stat", str(vol), "--json"]).stdout)  # through the server
    undo.release(serving)
    log.close()
    if proc.returncode != 0:
        raise RuntimeError(f"zbd serve exited {proc.returncode} on SIGTERM; log {log.name}")
    row: dict[str, Any] = {
        "case": case.key,
        "data": data,
        "dedup": dedup,
        "run": rnd + 1,
        **got,
        "wall_s": round(wall_s, 3),
        "server_cpu_s": None if cpu_before is None or cpu_after is None else round(cpu_after - cpu_before, 2),
        "stat": pick_stat(stat),
        "volume_allocated_bytes": vol.stat().st_blocks * 512,  # after the clean close
    }
    undo.release(sock_removed)
    undo.release(removed)
    dr = row["stat"].get("dedup_ratio")
    shown = f", dedup {dr:.2f}:1" if isinstance(dr, int | float) else ""
    live = (row["stat"].get("physical_bytes_live") or 0) / MIB
    say(f"  {tag}: {got['mib_s']:.1f} MiB/s, live {live:.0f} MiB{shown}")
    return row


def median_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    return statistics.median(values) if values else None


def stat_median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r["stat"][key] for r in rows if isinstance(r["stat"].get(key), int | float)]
    return statistics.median(values) if values else None


def summarize(rows: list[dict[str, Any]], cases: list[str], datas: list[str]) -> list[dict[str, Any]]:
    """Per case and data set: each dedup setting's median MiB/s and stored bytes; on / off."""
    out: list[dict[str, Any]] = []
    for case in cases:
        for data in datas:
            entry: dict[str, Any] = {"case": case, "label": CASES[case].label, "data": data}
            for dedup in ("off", "on"):
                mine = [r for r in rows if (r["case"], r["data"], r["dedup"]) == (case, data, dedup)]
                if not mine:
                    continue
                index = [r["stat"].get("dedup_index") or {} for r in mine]
                hit_rates = [i["hit_rate"] for i in index if isinstance(i.get("hit_rate"), int | float)]
                entry[dedup] = {
                    "runs": len(mine),
                    "mib_s": [round(r["mib_s"], 2) for r in mine],
                    "mib_s_median": median_of(mine, "mib_s"),
                    "server_cpu_s_median": median_of(mine, "server_cpu_s"),
                    "live_bytes": stat_median(mine, "physical_bytes_live"),
                    "allocated_bytes": stat_median(mine, "physical_bytes_allocated"),
                    "logical_bytes": stat_median(mine, "logical_bytes_in_use"),
                    "dedup_ratio": stat_median(mine, "dedup_ratio"),
                    "compression_ratio": stat_median(mine, "compression_ratio"),
                    "index_hit_rate": statistics.median(hit_rates) if hit_rates else None,
                    "index_budget_bytes": index[-1].get("budget_bytes"),
                }
            off, on = entry.get("off"), entry.get("on")
            if off and on and off["mib_s_median"] and on["mib_s_median"]:
                entry["throughput_on_over_off"] = on["mib_s_median"] / off["mib_s_median"]
                if off["live_bytes"] and on["live_bytes"] is not None:
                    entry["live_on_over_off"] = on["live_bytes"] / off["live_bytes"]
                if data == "dup50":
                    entry["goal"] = f">= {GOAL_DUP_RATIO:.1f}"
                    entry["verdict"] = "pass" if entry["throughput_on_over_off"] >= GOAL_DUP_RATIO else "miss"
            out.append(entry)
    return out


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    lines = [
        "# Inline dedup: write throughput, dedup on against off",
        "",
        (
            f"fio `ioengine=nbd` against `zbd serve` on a Unix socket; per run a fresh {s['size']} volume "
            f"(`--metadata-pages`, {s['codec']}), {s['data_mb']} MiB written, ending with a flush; data "
            f"`buffer_compress_percentage={COMPRESS_PERCENTAGE}` (4 KiB chunks), `dedupe_percentage` 50 "
            f"or 0 (`dedupe_mode=repeat`). The ext4 rows write a file of the same size on ext4 on the "
            "served volume instead (nbdfuse + a loop device, fio libaio with O_DIRECT, then fsync). "
            f"MiB/s: median of {s['runs']} runs (each run's under runs); "
            "server CPU: `zbd serve`'s user + system seconds during fio (median); stored: `zbd stat "
            "--json` after the flush, physical bytes live (allocated); dedup ratio and index hit rate "
            "from the same stat."
        ),
        "",
        (
            "| write | data | dedup | MiB/s | runs | server CPU s | stored MiB | logical : stored "
            "| dedup ratio | index hit rate |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in doc["summary"]:
        for dedup in ("off", "on"):
            arm = e.get(dedup)
            if not arm:
                continue
            live, logical = arm["live_bytes"], arm["logical_bytes"]
            allocated = arm["allocated_bytes"]
            stored = f"{fmt(live and live / MIB, '.0f')} ({fmt(allocated and allocated / MIB, '.0f')})"
            ratio = f"{logical / live:.2f}:1" if live and logical else "-"
            hit = arm["index_hit_rate"]
            lines.append(
                f"| {e['label']} | {DATA_LABELS[e['data']]} | {dedup} | {fmt(arm['mib_s_median'])} | "
                f"{', '.join(f'{v:.1f}' for v in arm['mib_s'])} | {fmt(arm['server_cpu_s_median'])} | "
                f"{stored} | {ratio} | {fmt(arm['dedup_ratio'], '.2f')} | "
                f"{'-' if hit is None else f'{hit:.1%}'} |"
            )
    lines += [
        "",
        "| write | data | MiB/s on / off | stored on / off | target | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for e in doc["summary"]:
        if "throughput_on_over_off" not in e:
            continue
        verdict = e.get("verdict", "")
        lines.append(
            f"| {e['label']} | {DATA_LABELS[e['data']]} | {e['throughput_on_over_off']:.2f} | "
            f"{fmt(e.get('live_on_over_off'), '.2f')} | {e.get('goal', '')} | "
            f"{f'**{verdict}**' if verdict == 'miss' else verdict} |"
        )
    if doc.get("notes"):
        lines += ["", *(f"- {n}" for n in doc["notes"])]
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-6], file=sys.stderr)
        return 2
    out = Path(sys.argv[1]).resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    zbd = os.environ.get("ZBD_BIN", str(Path(__file__).resolve().parent.parent / "target/release/zbd"))
    missing = missing_tools(["fio"])
    if missing or not Path(zbd).exists():
        print(f"bench-dedup-write: missing {', '.join(missing) or zbd}", file=sys.stderr)
        return 1
    # The ext4 case needs root (a loop device, a mount, FUSE) and its tools; by default it runs
    # where it can and says so where it cannot.
    ext4_missing = missing_tools(EXT4_TOOLS) if os.geteuid() == 0 else ["root"]
    default_cases = "rand4k seq128k" + ("" if ext4_missing else " ext4-rand4k")
    cases = os.environ.get("DEDUP_WRITE_CASES", default_cases).split()
    datas = os.environ.get("DEDUP_WRITE_DATA", "dup50 unique").split()
    unknown = [c for c in cases if c not in CASES] + [d for d in datas if d not in DATA]
    if unknown:
        print(f"bench-dedup-write: unknown case or data set {unknown}", file=sys.stderr)
        return 2
    if ext4_missing and any(CASES[c].ext4 for c in cases):
        print(f"bench-dedup-write: the ext4 case needs {', '.join(ext4_missing)}", file=sys.stderr)
        return 1
    undo = Undo()
    work = work_dir(undo, "zbd-dedup-write.")
    st = Settings(
        zbd=zbd,
        work=work,
        out=out,
        size=os.environ.get("DEDUP_WRITE_SIZE", "4G"),
        data_mb=int(os.environ.get("DEDUP_WRITE_MB", "1024")),
        runs=int(os.environ.get("DEDUP_WRITE_RUNS", "3")),
        codec=os.environ.get("DEDUP_WRITE_CODEC", "lz4"),
        index=os.environ.get("DEDUP_WRITE_INDEX", ""),
        flags=has_dedup_flags(zbd),
    )
    notes: list[str] = []
    if ext4_missing and "DEDUP_WRITE_CASES" not in os.environ:
        notes.append(f"the ext4 case did not run: it needs {', '.join(ext4_missing)}")
    modes = ["off", "on"]
    if not st.flags:
        modes = ["off"]
        notes.append(f"{zbd} has no `--dedup` flag (no inline dedup): dedup off arms only, made without it")
    doc: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "settings": {
            "size": st.size,
            "data_mb": st.data_mb,
            "runs": st.runs,
            "codec": st.codec,
            "dedup_index": st.index or "server default",
            "cases": {c: CASES[c].label for c in cases},
            "data": {d: f"dedupe_percentage={DATA[d]}" for d in datas},
            "buffer_compress_percentage": COMPRESS_PERCENTAGE,
            "randseed": FIO_SEED,
        },
        "rows": [],
        "notes": notes,
    }
    try:
        doc["loadavg_start"] = [round(v, 2) for v in os.getloadavg()]
        for rnd in range(st.runs):
            say(f"== round {rnd + 1}/{st.runs}")
            for i, (case, data) in enumerate((c, d) for c in cases for d in datas):
                order = modes if (rnd + i) % 2 == 0 else modes[::-1]  # alternate which arm goes first
                for dedup in order:
                    doc["rows"].append(measure(st, undo, CASES[case], data, dedup, rnd))
        doc["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
        doc["summary"] = summarize(doc["rows"], cases, datas)
        doc["zbd_version"] = run([zbd, "--version"], check=False).stdout.strip()
        doc["fio_version"] = run(["fio", "--version"], check=False).stdout.strip()
        (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
        (out / "summary.md").write_text(markdown(doc))
    finally:
        undo.run_all()
    say(f"wrote {out / 'summary.json'} and {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
