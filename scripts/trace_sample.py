#!/usr/bin/env python3
"""Issue 30 diagnosis: sample the block devices, processes and zbd metrics of one `zbdlab run`.

    trace_sample.py OUTDIR SAMPLES.jsonl [ZBD_BIN]

Every 0.1 s (until killed) writes one JSON line: wall time, /proc/stat's cpu line, the stat line
of every loop device whose backing file lies under OUTDIR or under a zbd attach made from it (the
throttled disk and the device the filesystem sits on), CPU ticks of the zbd, nbdkit and nbdfuse
processes serving it, and whether postmark runs. Every 2 s while a zbd server serves, also the
server's Prometheus text (request latency histograms).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def cmdline(pid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def main() -> None:
    outdir, samples = os.path.realpath(sys.argv[1]), sys.argv[2]
    zbd_bin = sys.argv[3] if len(sys.argv) > 3 else None
    last_metrics = 0.0
    with open(samples, "a", encoding="utf-8") as out:
        while True:
            now = time.time()
            loops: dict[str, dict] = {}
            for entry in Path("/sys/block").glob("loop*"):
                try:
                    backing = (entry / "loop" / "backing_file").read_text().strip()
                    stat = (entry / "stat").read_text().split()
                except OSError:
                    continue
                if outdir in backing:
                    loops[entry.name] = {"backing": backing, "stat": [int(v) for v in stat]}
            procs: dict[str, dict] = {}
            postmark = False
            throttled = {f"/dev/{n}" for n, v in loops.items() if "/thr-" in v["backing"]}
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                argv = cmdline(pid)
                if not argv or not argv[0]:
                    continue
                name = os.path.basename(argv[0])
                if name.startswith("zbd") and argv[1:2] == ["serve"]:
                    name = "zbd"  # a copy of the binary under another name (A/B builds)
                if name == "postmark":
                    postmark = True
                    continue
                mine = outdir in " ".join(argv) or any(d in argv for d in throttled)
                if name in ("zbd", "nbdkit", "nbdfuse") and mine:
                    try:
                        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    except OSError:
                        continue
                    procs[pid] = {
                        "argv": argv[:4],
                        "utime": int(f[11]),
                        "stime": int(f[12]),
                        "threads": int(f[17]),
                    }
            rec = {
                "t": now,
                "cpu": Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9],
                "loops": loops,
                "procs": procs,
                "postmark": postmark,
            }
            servers = [
                p
                for p in procs.values()
                if p["argv"][1:2] == ["serve"]
            ]
            if zbd_bin and servers and now - last_metrics >= 2.0:
                last_metrics = now
                try:
                    rec["metrics"] = subprocess.run(
                        [zbd_bin, "stat", servers[0]["argv"][2], "--prometheus"],
                        capture_output=True,
                        text=True,
                        timeout=5,
                        check=False,
                    ).stdout
                except (OSError, subprocess.TimeoutExpired):
                    pass
            out.write(json.dumps(rec) + "\n")
            out.flush()
            time.sleep(0.1)


if __name__ == "__main__":
    main()
