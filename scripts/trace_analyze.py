#!/usr/bin/env python3
"""Issue 30 diagnosis: per PostMark run, what the throttled disk and zbd's front did.

    trace_analyze.py SAMPLES.jsonl TRACE_DIR [--json OUT]

SAMPLES.jsonl comes from trace_sample.py, TRACE_DIR holds nbdkit log-filter files (ZBDLAB_TRACE_DIR).
A run is a stretch of samples with postmark running. For each run: wall time; at the throttled disk
(nbdkit's log, outermost filter: a request's time includes its 2 ms delay and rate wait) the
requests by kind, their mean service time, the time-weighted mean and the maximum number in flight,
and the share of wall time with none in flight; the same from the kernel's view (the loop devices'
stat: io_ticks and time_in_queue) for the disk and for zbd's front; CPU seconds of zbd, nbdfuse,
nbdkit and the machine.
"""

import json
import re
import sys
from datetime import datetime
from pathlib import Path

LINE = re.compile(r"^(\S+ \S+) connection=(\d+) (\.\.\.)?(\w+) id=(\d+)(.*)$")


def parse_trace(path: Path) -> list[tuple[float, float, str, int]]:
    """(start, end, kind, bytes) of every request in one nbdkit log."""
    open_: dict[tuple[str, str], tuple[float, str, int]] = {}
    done = []
    for line in path.open(errors="replace"):
        m = LINE.match(line)
        if not m:
            continue
        ts = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        key = (m.group(2), m.group(5))
        if m.group(3):
            if key in open_:
                start, kind, count = open_.pop(key)
                done.append((start, ts, kind, count))
        else:
            c = re.search(r"count=(0x[0-9a-f]+)", m.group(6))
            open_[key] = (ts, m.group(4), int(c.group(1), 16) if c else 0)
    return done


def concurrency(reqs, t0, t1):
    """time-weighted mean in flight, max in flight, share of [t0,t1] with none in flight."""
    events = []
    for s, e, _, _ in reqs:
        s, e = max(s, t0), min(e, t1)
        if e > s:
            events += [(s, 1), (e, -1)]
    events.sort()
    level = mx = 0
    area = idle = 0.0
    last = t0
    for t, d in events:
        area += level * (t - last)
        if level == 0:
            idle += t - last
        last = t
        level += d
        mx = max(mx, level)
    idle += t1 - last
    span = t1 - t0
    return area / span, mx, idle / span


def main() -> None:
    with open(sys.argv[1]) as f:
        samples = [json.loads(line) for line in f]
    traces = []
    for p in sorted(Path(sys.argv[2]).glob("*.log")):
        if "overhead" in p.name:
            continue
        reqs = parse_trace(p)
        if reqs:
            traces.append((p.name, reqs))
    runs = []
    i = 0
    while i < len(samples):
        if samples[i]["postmark"]:
            j = i
            while j + 1 < len(samples) and samples[j + 1]["postmark"]:
                j += 1
            runs.append((samples[max(i - 1, 0)], samples[j]))
            i = j + 1
        else:
            i += 1
    out = []
    for a, b in runs:
        t0, t1 = a["t"], b["t"]
        wall = t1 - t0
        row = {"start": t0, "wall_s": round(wall, 2)}
        for name, reqs in traces:
            inside = [r for r in reqs if r[1] > t0 and r[0] < t1]
            if not inside:
                continue
            row["trace"] = name
            for kind in ("Read", "Write", "Flush", "Trim", "Zero"):
                ks = [r for r in inside if r[2] == kind]
                if ks:
                    row[f"disk_{kind.lower()}s"] = len(ks)
                    row[f"disk_{kind.lower()}_ms"] = round(
                        1000 * sum(e - s for s, e, _, _ in ks) / len(ks), 2
                    )
                    row[f"disk_{kind.lower()}_MiB"] = round(sum(c for *_, c in ks) / 2**20, 1)
            mean, mx, idle = concurrency(inside, t0, t1)
            row.update(
                disk_inflight_mean=round(mean, 2), disk_inflight_max=mx, disk_idle_share=round(idle, 3)
            )
            for kind in ("Read", "Write"):
                ks = [r for r in inside if r[2] == kind]
                m2, _, _ = concurrency(ks, t0, t1)
                row[f"disk_{kind.lower()}_inflight_mean"] = round(m2, 2)
        for loop, la in a["loops"].items():
            lb = b["loops"].get(loop)
            if not lb:
                continue
            role = "disk" if "/thr-" in la["backing"] else "front"
            d = [y - x for x, y in zip(la["stat"], lb["stat"], strict=False)]
            row[f"k_{role}_reads"], row[f"k_{role}_writes"] = d[0], d[4]
            row[f"k_{role}_read_ms"] = round(d[3] / d[0], 2) if d[0] else None
            row[f"k_{role}_write_ms"] = round(d[7] / d[4], 2) if d[4] else None
            row[f"k_{role}_flushes"] = d[15] if len(d) > 15 else None
            row[f"k_{role}_busy_share"] = round(d[9] / 1000 / wall, 3)
            row[f"k_{role}_inflight_mean"] = round(d[10] / 1000 / wall, 2)
        cpu = {}
        for pid, pb in b["procs"].items():
            pa = a["procs"].get(pid)
            base = (pa["utime"] + pa["stime"]) if pa else 0
            name = pb["argv"][0].rsplit("/", 1)[-1]
            if pb["argv"][1:2] == ["serve"]:
                name = "zbd"
            if name == "nbdfuse":
                name = "nbdfuse_front" if "attach" in " ".join(pb["argv"]) else "nbdfuse_disk"
            cpu[name] = cpu.get(name, 0) + (pb["utime"] + pb["stime"] - base) / 100
        row["cpu_s"] = {k: round(v, 2) for k, v in cpu.items()}
        ca, cb = [int(x) for x in a["cpu"]], [int(x) for x in b["cpu"]]
        dc = [y - x for x, y in zip(ca, cb, strict=False)]
        row["machine_busy_share"] = round(1 - (dc[3] + dc[4]) / sum(dc), 3)
        row["machine_iowait_share"] = round(dc[4] / sum(dc), 3)
        out.append(row)
    for row in out:
        print(json.dumps(row))
    if "--json" in sys.argv:
        Path(sys.argv[sys.argv.index("--json") + 1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
