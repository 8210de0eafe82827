"""Group `engine`: `zbd bench engine` per codec and thread count, over the codec's own speed.

One arm is one (codec, threads) pair; each `zbd bench engine` call measures the codec alone on one
core on the same data in the same process, so "engine / codec" is a same-run ratio within every
round, and "2 threads / 1 thread" compares arms of the same rounds.

"Threads" are cores: an arm of N client threads runs pinned to N cores (taskset), since one client
thread on unpinned cores already compresses on all of them (zbd-core's par.rs), and "2 threads / 1
thread" would then compare two cores with two cores. Its volume is in the process's RAM (`--ram`: no
file, no system call below the engine), so that the figure is the engine's own CPU cost per byte:
the nbd and fs groups measure the kernel and the disks. (A volume file in tmpfs, as in stop 21,
also counts the kernel's page allocation for every byte written: a sixth of a 1-thread lz4 write.)
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from zbdlab.app import HostError
from zbdlab.bench.core import Figure, Goal, Metrics, Rounds, run_rounds
from zbdlab.bench.settings import BASE, Settings

CODECS = ("lz4", "zstd:1")
THREADS = (1, 2)
GOAL_SCALING = Goal(at_least=1.7)  # 2 threads >= 1.7x one thread
GOAL_CODEC = Goal(at_least=0.8)  # >= 0.8x (codec speed x threads)


def arm_name(codec: str, threads: int) -> str:
    return f"{codec}/{threads}t"


def pinned(threads: int) -> list[str]:
    """A taskset prefix giving the process the first `threads` CPUs it may use."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < threads:
        raise HostError(
            f"engine group: {threads} threads need {threads} cores, this process may use {len(cpus)}"
        )
    return ["taskset", "--cpu-list", ",".join(str(c) for c in cpus[:threads])]


def measure(zbd: str, codec: str, threads: int, settings: Settings, raw: Path, tag: str) -> Metrics:
    argv = [
        zbd,
        "bench",
        "engine",
        "--codec",
        codec,
        "--threads",
        str(threads),
        "--size",
        settings.engine_size,
    ]
    argv += ["--ram", "--no-wa", "--json"]
    proc = subprocess.run(pinned(threads) + argv, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        line = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise HostError(f"{' '.join(argv[:3])} failed: {line} (a zbd without --ram is too old)")
    (raw / f"engine-{tag}.json").write_text(proc.stdout)
    doc = json.loads(proc.stdout)
    run = doc["runs"][0]
    return {
        "write_mb_s": run["write_mb_s"],
        "read_mb_s": run["read_mb_s"],
        "codec_compress_mb_s": doc["raw_compress_mb_s"],
        "codec_decompress_mb_s": doc["raw_decompress_mb_s"],
        "savings_pct": doc["savings_pct"],
    }


def figures(rounds: Rounds) -> list[Figure]:
    out: list[Figure] = []
    for codec in CODECS:
        for threads in THREADS:
            arm = arm_name(codec, threads)
            for op, codec_metric in (("write", "codec_compress_mb_s"), ("read", "codec_decompress_mb_s")):
                out.append(
                    Figure(
                        "engine",
                        f"{codec} {op}, {threads} thread(s) / ({codec} alone x {threads})",
                        rounds.get(arm, f"{op}_mb_s"),
                        rounds.get(arm, codec_metric),
                        scale=threads,
                        goal=GOAL_CODEC,
                    )
                )
            if arm + BASE in rounds.arms:
                for op in ("write", "read"):
                    out.append(
                        Figure(
                            "engine",
                            f"{codec} {op}, {threads} thread(s): this zbd / base zbd",
                            rounds.get(arm, f"{op}_mb_s"),
                            rounds.get(arm + BASE, f"{op}_mb_s"),
                        )
                    )
        one, two = arm_name(codec, 1), arm_name(codec, 2)
        for op in ("write", "read"):
            out.append(
                Figure(
                    "engine",
                    f"{codec} {op}, 2 threads / 1 thread",
                    rounds.get(two, f"{op}_mb_s"),
                    rounds.get(one, f"{op}_mb_s"),
                    goal=GOAL_SCALING,
                )
            )
    return out


def run(zbd: str, settings: Settings, raw: Path, notes: list[str]) -> list[Figure]:
    notes.append(
        "engine: N threads = N client threads pinned to N cores (taskset); volumes in the process's RAM"
        " (`zbd bench engine --ram`: the engine's own CPU cost, no file or kernel below it)"
    )
    arms = {arm_name(c, t): (zbd, c, t) for c in CODECS for t in THREADS}
    if settings.base_zbd:
        arms |= {arm + BASE: (settings.base_zbd, c, t) for arm, (_, c, t) in list(arms.items())}

    def one(arm: str, r: int) -> Metrics:
        binary, codec, threads = arms[arm]
        return measure(
            binary,
            codec,
            threads,
            settings,
            raw,
            f"{arm.replace('/', '-').replace(':', '')}-r{r + 1}",
        )

    rounds = run_rounds(list(arms), settings.rounds, one, settings.progress)
    return figures(rounds)
