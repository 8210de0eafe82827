"""Groups `nbd-fast` and `nbd-slow`: fio's nbd engine against zbd and plain NBD servers, same disk.

Per round and arm: a fresh backing file on the profile's disk, its server started, then in order a
1 MiB sequential write over the whole device, a sequential read of it, 4 KiB random reads and random
writes at iodepth 1 and 16 (two jobs, each on its own half), the server stopped. Writes end with a
flush (`end_fsync=1`, an NBD FLUSH: checked once per run with nbdkit's log filter), so a server that
only buffers is not flattered. On the fast profile one more arm runs the same jobs through the
transport zbd uses on this machine (`zbd attach`: nbdfuse + loop device, fio on the loop device with
O_DIRECT), served by `nbdkit file`: the transport's cost for any NBD server, shown on its own.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from zbdlab.app import HostError
from zbdlab.bench.core import Figure, Goal, Metrics, Rounds, median, run_rounds
from zbdlab.bench.settings import BASE, Settings
from zbdlab.config import parse_size
from zbdlab.targets.cleanup import CleanupStack
from zbdlab.targets.commands import Commands, stop_process, wait_for
from zbdlab.targets.zbd import stat_numbers
from zbdlab.workloads.base import DataSpec
from zbdlab.workloads.fio import FIXED_SEED, JobFile, data_options, load_fio_json, summarize

ZBD_CODECS = {"zbd-lz4": "lz4", "zbd-zstd1": "zstd:1", "zbd-none": "none"}
BASELINES = ("nbdkit", "qemu-nbd")
TRANSPORT = "nbdkit-via-loop"


@dataclass(frozen=True)
class Test:
    key: str  # metric name
    label: str
    rw: str
    bs: str
    iodepth: int
    unit: str  # "MB/s" for sequential, "IOPS" for random


TESTS = (
    Test("seq_write", "1 MiB seq write", "write", "1M", 16, "MB/s"),
    Test("seq_read", "1 MiB seq read", "read", "1M", 16, "MB/s"),
    Test("randread_qd1", "4 KiB rand read qd1", "randread", "4k", 1, "IOPS"),
    Test("randread_qd16", "4 KiB rand read qd16", "randread", "4k", 16, "IOPS"),
    Test("randwrite_qd1", "4 KiB rand write qd1", "randwrite", "4k", 1, "IOPS"),
    Test("randwrite_qd16", "4 KiB rand write qd16", "randwrite", "4k", 16, "IOPS"),
)
TEST_BY_KEY = {t.key: t for t in TESTS}

# Targets of issue 13, per profile: (numerator arm, denominator arm, test) -> goal.
GOALS: dict[str, dict[tuple[str, str, str], Goal]] = {
    "nbd-fast": {
        ("zbd-lz4", "zbd-none", "seq_write"): Goal(at_least=0.8),
        ("zbd-lz4", "zbd-none", "seq_read"): Goal(at_least=0.8),
        ("zbd-none", "qemu-nbd", "seq_write"): Goal(at_least=0.9),
        ("zbd-none", "qemu-nbd", "seq_read"): Goal(at_least=0.9),
        ("zbd-lz4", "qemu-nbd", "randread_qd16"): Goal(at_least=0.6),
    },
    # "raw" on the slow disk = qemu-nbd --cache=none (O_DIRECT), as the issue asks for both sides
    "nbd-slow": {
        ("zbd-lz4", "qemu-nbd", "seq_write"): Goal(at_least=1.6),
        ("zbd-lz4", "qemu-nbd", "seq_read"): Goal(at_least=1.5),
        ("zbd-lz4", "qemu-nbd", "randwrite_qd16"): Goal(at_least=2.0),
        ("zbd-lz4", "qemu-nbd", "randread_qd16"): Goal(at_least=0.8),
    },
}


def fio_job(test: Test, device_bytes: int, runtime_s: int, target: dict[str, str | int]) -> JobFile:
    """Two jobs, each on its own half of the device; sequential tests cover it once, random ones run
    for `runtime_s`; data about 2:1 compressible, refilled for every write."""
    half = device_bytes // 2
    options: dict[str, str | int | bool] = {
        **target,
        "rw": test.rw,
        "bs": test.bs,
        "iodepth": test.iodepth,
        "numjobs": 2,
        "size": half,
        "offset_increment": half,
        "randrepeat": 1,
        "randseed": FIXED_SEED,
        **data_options(DataSpec(compress_percentage=50)),
    }
    if test.rw.startswith("rand"):
        options.update(time_based=True, runtime=runtime_s)
    if "write" in test.rw:
        options["end_fsync"] = 1  # an NBD FLUSH at the end, counted in the job's runtime
    job = JobFile(options)
    job.add(test.key, {})
    return job


def run_fio(job: JobFile, out_stem: Path, cmds: Commands) -> dict[str, float]:
    job_path = out_stem.with_suffix(".fio")
    json_path = out_stem.with_suffix(".json")
    job_path.write_text(job.render())
    proc = cmds.run(["fio", "--output-format=json", f"--output={json_path}", str(job_path)], check=False)
    if proc.returncode != 0:
        raise HostError(f"fio failed on {job_path}: {(proc.stderr or proc.stdout).strip()[-300:]}")
    summary = summarize(load_fio_json(json_path))
    seconds = max(summary.elapsed_s, 1e-9)
    return {"mb_s": summary.io_bytes / seconds / 1e6, "iops": summary.total_ios / seconds}


class Server:
    """One NBD server over a fresh backing file, listening on a Unix socket; stopped by its PID."""

    def __init__(self, arm: str, zbd: str, disk: Path, size: int, cmds: Commands, stack: CleanupStack):
        self.arm, self.zbd, self.size, self.cmds, self.stack = arm, zbd, size, cmds, stack
        self.dir = Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=disk))
        stack.push(f"remove {self.dir}", lambda: shutil.rmtree(self.dir, ignore_errors=True))
        # Unix socket paths must stay short: keep sockets in a directory of their own under /run
        self.sockdir = Path(
            tempfile.mkdtemp(prefix="zbdbench-", dir="/run" if os.access("/run", os.W_OK) else None)
        )
        stack.push(f"remove {self.sockdir}", lambda: shutil.rmtree(self.sockdir, ignore_errors=True))
        self.socket = self.sockdir / "nbd.sock"
        self.pidfile = self.dir / "pid"
        self.codec = ZBD_CODECS.get(arm.removesuffix(BASE))  # None: not a zbd arm
        self.image = self.dir / ("vol.zbd" if self.codec else "disk.img")
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        sock, img = str(self.socket), str(self.image)
        if self.codec:
            return [self.zbd, "serve", img, "--socket", sock, "--pidfile", str(self.pidfile)]
        if self.arm in ("nbdkit", TRANSPORT):
            return ["nbdkit", "-f", "-U", sock, "-P", str(self.pidfile), "file", f"file={img}"]
        if self.arm == "qemu-nbd":
            return [
                "qemu-nbd", "-f", "raw", "--cache=none", "--aio=native", "--persistent", "--shared=4",
                "-k", sock, "--pid-file", str(self.pidfile), img,
            ]  # fmt: skip
        raise ValueError(f"unknown arm {self.arm}")

    def start(self) -> None:
        if self.codec:
            size = f"{self.size >> 20}M"
            self.cmds.run([self.zbd, "create", str(self.image), "--size", size, "--codec", self.codec])
        else:
            self.cmds.run(["truncate", "-s", str(self.size), str(self.image)])
        self.stack.push(f"stop {self.arm}", self.stop)
        # adopted inside spawn, so the stop step pushed above finds it even if a signal cuts
        # spawn short
        proc = self.cmds.spawn(self.argv(), self.dir / "server.log", lambda p: setattr(self, "proc", p))

        def ready() -> bool:
            return proc.poll() is not None or (self.socket.exists() and self.pidfile.exists())

        wait_for(ready, 30, f"{self.arm} socket")
        if proc.poll() is not None:
            log = (self.dir / "server.log").read_text(errors="replace").strip()[-300:]
            raise HostError(f"{self.arm} exited at start: {log}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def drop_cache(self, device: str | None = None) -> None:
        """Evict the backing file from the page cache, so every server reads from the disk (qemu-nbd
        --cache=none always does); a server's own cache still counts. Through the transport, also
        the loop device's backing file (nbdfuse's FUSE file, which the kernel caches too)."""
        files = [self.image]
        if device:
            back = self.cmds.run(["losetup", "-n", "-O", "BACK-FILE", device]).stdout.strip()
            files.append(Path(back))
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def uri(self) -> str:
        return f"nbd+unix:///?socket={self.socket}"

    def zbd_ratio(self) -> float:
        """The compression ratio zbd achieved on the data it holds (`zbd stat --json`, served)."""
        if not self.codec:
            return math.nan
        proc = self.cmds.run([self.zbd, "stat", "--json", str(self.image)], check=False)
        try:
            _logical, _physical, ratio = stat_numbers(json.loads(proc.stdout))
        except json.JSONDecodeError:
            return math.nan
        return ratio if ratio is not None else math.nan


@contextmanager
def attached(zbd: str, server: Server, cmds: Commands, stack: CleanupStack) -> Iterator[str]:
    """The export as a block device through `zbd attach` (nbdfuse + loop on this machine)."""
    state = ["--state-dir", str(server.dir / "attach")]
    out = cmds.run([zbd, "attach", "--socket", str(server.socket), *state]).stdout
    device = [w for w in out.split() if w.startswith("/dev/")][-1]
    step = stack.push(f"zbd detach {device}", lambda: cmds.run([zbd, "detach", device, *state]))
    try:
        yield device
    finally:
        stack.release(step)


def measure_arm(
    arm: str, zbd: str, disk: Path, settings: Settings, raw: Path, tag: str, cmds: Commands, slow: bool
) -> Metrics:
    size = parse_size(settings.nbd_size) or 1 << 30
    if slow:
        size = parse_size(settings.slow_size) or 1 << 29
    stack = CleanupStack(f"bench {arm}")
    metrics: Metrics = {}
    try:
        server = Server(arm, zbd, disk, size, cmds, stack)
        server.start()
        with attached(zbd, server, cmds, stack) if arm == TRANSPORT else _no_device() as device:
            if device:
                target: dict[str, str | int] = {"ioengine": "libaio", "direct": 1, "filename": device}
            else:
                target = {"ioengine": "nbd", "uri": server.uri()}
            for test in TESTS:
                if "read" in test.rw:
                    server.drop_cache(device)
                got = run_fio(
                    fio_job(test, size, settings.nbd_runtime_s, target), raw / f"{tag}-{test.key}", cmds
                )
                metrics[test.key] = got["mb_s"] if test.unit == "MB/s" else got["iops"]
        metrics["zbd_ratio"] = server.zbd_ratio()
    finally:
        stack.close()
    return metrics


@contextmanager
def _no_device() -> Iterator[str | None]:
    yield None


def check_flush(cmds: Commands, raw: Path) -> str:
    """Runs a small write job with end_fsync=1 against nbdkit's log filter and counts NBD FLUSH."""
    with tempfile.TemporaryDirectory(
        prefix="zbdbench-flush-", dir="/run" if os.access("/run", os.W_OK) else None
    ) as d:
        sock, log, pid = Path(d) / "s", Path(d) / "log", Path(d) / "pid"
        argv = [
            "nbdkit",
            "-f",
            "-U",
            str(sock),
            "-P",
            str(pid),
            "--filter=log",
            "memory",
            "64M",
            f"logfile={log}",
        ]
        started: list[subprocess.Popen[bytes]] = []
        try:
            # adopted inside spawn, so the `finally` stops it even if a signal cuts spawn short
            proc = cmds.spawn(argv, raw / "flush-check-nbdkit.log", started.append)
            wait_for(lambda: pid.exists() or proc.poll() is not None, 30, "nbdkit (flush check)")
            job = fio_job(
                TEST_BY_KEY["seq_write"],
                8 << 20,
                1,
                {"ioengine": "nbd", "uri": f"nbd+unix:///?socket={sock}"},
            )
            run_fio(job, raw / "flush-check", cmds)
        finally:
            for p in started:
                stop_process(p)
        flushes = sum(
            1 for line in log.read_text().splitlines() if " Flush " in line and "return" not in line
        )
    if flushes == 0:
        raise HostError(
            "fio's end_fsync=1 issued no NBD FLUSH (nbdkit log filter): writes would not be flushed"
        )
    return f"fio `end_fsync=1` issues NBD FLUSH (nbdkit's log filter saw {flushes} for a 2-job write)"


def figures(profile: str, rounds: Rounds, arms: list[str]) -> list[Figure]:
    goals = GOALS.get(profile, {})
    out: list[Figure] = []
    pairs = [(z, b) for z in ZBD_CODECS for b in BASELINES if z in arms and b in arms]
    pairs += [(z, "zbd-none") for z in ("zbd-lz4", "zbd-zstd1") if z in arms and "zbd-none" in arms]
    if "nbdkit" in arms and "qemu-nbd" in arms:
        pairs.append(("nbdkit", "qemu-nbd"))
    for test in TESTS:
        for num, den in pairs:
            ratio = median(rounds.get(num, "zbd_ratio"))
            out.append(
                Figure(
                    profile,
                    f"{test.label}: {num} / {den}",
                    rounds.get(num, test.key),
                    rounds.get(den, test.key),
                    unit=test.unit,
                    goal=goals.get((num, den, test.key)),
                    note=f"zbd ratio {ratio:.2f}:1" if math.isfinite(ratio) else "",
                )
            )
    for test in TESTS:
        for arm in ZBD_CODECS:
            if arm + BASE in arms:
                out.append(
                    Figure(
                        profile,
                        f"{test.label}: {arm} this zbd / base zbd",
                        rounds.get(arm, test.key),
                        rounds.get(arm + BASE, test.key),
                        unit=test.unit,
                    )
                )
    if TRANSPORT in arms and "nbdkit" in arms:
        for test in TESTS:
            out.append(
                Figure(
                    "transport",
                    f"{test.label}: nbdkit via nbdfuse + loop / nbdkit direct",
                    rounds.get(TRANSPORT, test.key),
                    rounds.get("nbdkit", test.key),
                    unit=test.unit,
                )
            )
    return out


def run(
    profile: str,
    zbd: str,
    settings: Settings,
    raw: Path,
    disk: Path,
    notes: list[str],
    progress: Callable[[str], None] | None = None,
) -> list[Figure]:
    for tool in ("fio", "nbdkit", "qemu-nbd", "nbdfuse", "losetup"):
        if shutil.which(tool) is None:
            raise HostError(f"{tool} not found (run scripts/install-deps.sh)")
    cmds = Commands(raw / "commands.jsonl")
    try:
        if profile == "nbd-fast":
            notes.append(check_flush(cmds, raw))
        notes.append(f"{profile}: {IO_MODES}")
        arms = [*ZBD_CODECS, *BASELINES]
        if settings.base_zbd:
            arms += [arm + BASE for arm in ZBD_CODECS]
        if profile == "nbd-fast":
            arms.append(TRANSPORT)

        def one(arm: str, r: int) -> Metrics:
            binary = settings.base_zbd if arm.endswith(BASE) and settings.base_zbd else zbd
            tag = f"{arm.replace(BASE, '-base')}-r{r + 1}"
            return measure_arm(arm, binary, disk, settings, raw, tag, cmds, profile == "nbd-slow")

        rounds = run_rounds(arms, settings.rounds, one, progress)
    finally:
        cmds.close()
    return figures(profile, rounds, arms)


SLOW_RATE, SLOW_LATENCY = "100M", "2ms"

# How each server reaches its backing file (said in every summary: issue 13). zbd stays buffered on
# the slow disk too: `zbd serve --direct` refuses its 4 KiB-sector throttled device, since the engine
# writes 512-byte sectors; reads still come from the disk (the cache is dropped before each) and
# writes are flushed (end_fsync).
IO_MODES = (
    "I/O modes: zbd serve buffered (page cache, its default; backing file evicted before each read "
    "test, writes end with a flush), qemu-nbd O_DIRECT (--cache=none --aio=native), nbdkit file buffered"
)


@contextmanager
def slow_disk(settings: Settings, raw: Path) -> Iterator[Path]:
    """A directory on a slow disk: ext4 on the lab's throttled device (nbdkit rate + delay filters,
    nbdfuse, loop), its image in the work directory."""
    from zbdlab.targets.devices import umount
    from zbdlab.throttle import ThrottledDevice

    cmds = Commands(raw / "slow-disk-commands.jsonl")
    size = 4 * (parse_size(settings.slow_size) or 1 << 29) + (512 << 20)
    with (
        tempfile.TemporaryDirectory(prefix="zbd-bench-slow-", dir=settings.work_dir) as base,
        ThrottledDevice(
            Path(base) / "slow.img", size, rate=SLOW_RATE, latency=SLOW_LATENCY, cmds=cmds
        ) as dev,
    ):
        mnt = Path(base) / "mnt"
        mnt.mkdir()
        cmds.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", dev])
        cmds.run(["mount", dev, str(mnt)])
        try:
            yield mnt
        finally:
            umount(cmds, mnt)
            cmds.close()
