"""A throttled block device: an image file behind a bandwidth limit and a per-request latency.

The seeds measured 2009-2015 disks (the ZBD paper: 100 MB/s and 12.6 ms seeks); this machine's disk is
far faster, so compression can never pay here unless the disk is slowed down. The chain is

    image file -> `nbdkit -f` (file plugin, `delay` + `rate` filters, Unix socket)
               -> `nbdfuse` (the export as a file in a FUSE mount)
               -> `losetup --direct-io=on` -> /dev/loopN

Each process is started by zbdlab, stopped by the PID it started (after what depends on it is gone),
and every step's undo is pushed on a `CleanupStack` before the step runs, so a failure at any point
leaves nothing behind.

Units: `rate` is bytes per second with the lab's size units (powers of 1024: "100M" = 100 MiB/s);
nbdkit's rate filter takes bits per second, so it gets `rate * 8`. Reads and writes are limited
separately (nbdkit keeps one bucket per direction), and the bucket holds two seconds of traffic, so a
transfer after idle time bursts for up to two seconds before the limit holds. `latency` is added to
every read, write, zero and trim request (nbdkit's delay filter, whole milliseconds): a stand-in for
seek plus rotation, not a model of a disk's head.

    with ThrottledDevice("/scratch/disk.img", "1G", rate="100M", latency="2ms") as dev:
        subprocess.run(["mkfs.ext4", dev])
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbdlab.app import HostError
from zbdlab.config import parse_size
from zbdlab.targets.cleanup import CleanupStack
from zbdlab.targets.commands import Commands, stop_process, wait_for
from zbdlab.targets.devices import create_loop, detach_loops

_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?(?:/s)?\s*$", re.IGNORECASE)
_LATENCY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s)\s*$")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_READY_TIMEOUT_S = 30
MAX_LATENCY_MS = 10_000


class ThrottleError(ValueError):
    """A rate or latency that cannot be used: `key` ("rate", "latency") and a one-line problem."""

    def __init__(self, key: str, problem: str) -> None:
        self.key, self.problem = key, problem
        super().__init__(f"{key}: {problem}")


@dataclass(frozen=True)
class Throttle:
    """What a throttled device imposes: bytes/s per direction (None: unlimited) and ms per request."""

    rate_bytes: int | None = None
    latency_ms: int = 0

    @property
    def label(self) -> str:
        rate = f"{self.rate_bytes / (1 << 20):g} MiB/s" if self.rate_bytes else "unlimited"
        return f"{rate}, {self.latency_ms} ms/request"

    def nbdkit_args(self) -> list[str]:
        args: list[str] = []
        if self.rate_bytes:
            args.append(f"rate={self.rate_bytes * 8}")
        if self.latency_ms:
            args += [f"rdelay={self.latency_ms}ms", f"wdelay={self.latency_ms}ms"]
        return args

    def as_dict(self) -> dict[str, Any]:
        return {"rate_bytes_per_s": self.rate_bytes, "latency_ms": self.latency_ms, "label": self.label}


def parse_rate(value: Any) -> int | None:
    """ "100M" / "100MiB/s" / 104857600 -> bytes per second; None or "off" -> unlimited."""
    if value is None or value == "off":
        return None
    if isinstance(value, bool):
        raise ThrottleError("rate", f"expected bytes per second such as '100M', got {value!r}")
    if isinstance(value, int):
        rate = value
    else:
        m = _RATE_RE.match(value) if isinstance(value, str) else None
        if not m:
            raise ThrottleError("rate", f"expected bytes per second such as '100M', got {value!r}")
        rate = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if rate < 64 << 10:
        raise ThrottleError("rate", f"at least 64K (bytes per second), got {value!r}")
    return rate


def parse_latency(value: Any) -> int:
    """ "2ms" / "1s" / "2000us" -> whole milliseconds (nbdkit's delay filter has no finer unit)."""
    if value is None:
        return 0
    m = _LATENCY_RE.match(value) if isinstance(value, str) else None
    if not m:
        raise ThrottleError("latency", f"expected a duration such as '2ms', got {value!r}")
    number, unit = float(m.group(1)), m.group(2)
    ms = number * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    if ms != int(ms):
        raise ThrottleError("latency", f"nbdkit delays by whole milliseconds, got {value!r}")
    if ms > MAX_LATENCY_MS:
        raise ThrottleError("latency", f"at most {MAX_LATENCY_MS // 1000}s, got {value!r}")
    return int(ms)


def parse_throttle(rate: Any = None, latency: Any = None) -> Throttle:
    return Throttle(rate_bytes=parse_rate(rate), latency_ms=parse_latency(latency))


def throttle_problem() -> str | None:
    """Why throttled devices cannot be made here, or None."""
    for tool, package in (("nbdkit", "nbdkit"), ("nbdfuse", "libnbd-bin"), ("fusermount3", "fuse3")):
        if shutil.which(tool) is None:
            return f"{tool} not found (install {package}; needed for throttled devices)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (throttled devices go through nbdfuse)"
    return None


class ThrottledDevice:
    """An image file served through nbdkit's rate and delay filters, as a loop device.

    `size` (bytes or "1G") creates a sparse image when `backing` does not exist yet (and removes it
    again at the end); an existing image is used as it is and left in place. Use as a context manager
    (returns the /dev/loopN path) or call `start(stack)` with a `CleanupStack` that owns the teardown.
    """

    def __init__(
        self,
        backing: Path | str,
        size: int | str | None = None,
        *,
        rate: Any = None,
        latency: Any = None,
        throttle: Throttle | None = None,
        workdir: Path | None = None,
        cmds: Commands | None = None,
    ) -> None:
        self.backing = Path(backing).resolve()
        self.size = _size_bytes(size)
        self.throttle = throttle if throttle is not None else parse_throttle(rate, latency)
        self.cmds = cmds or Commands()
        self._workdir_given = workdir
        self.workdir: Path | None = None
        self.device: str | None = None
        self.nbdkit: subprocess.Popen[bytes] | None = None
        self.nbdfuse: subprocess.Popen[bytes] | None = None
        self._own_stack: CleanupStack | None = None

    # --- context manager --------------------------------------------------------------------------

    def __enter__(self) -> str:
        self._own_stack = CleanupStack(f"throttled {self.backing.name}")
        try:
            return self.start(self._own_stack)
        except BaseException:
            self._own_stack.close()
            raise

    def __exit__(self, *exc: object) -> None:
        if self._own_stack is not None:
            stack, self._own_stack = self._own_stack, None
            stack.close()

    # --- life cycle -------------------------------------------------------------------------------

    def start(self, stack: CleanupStack) -> str:
        """Create (if asked), serve, mount and loop the image; every undo goes on `stack`."""
        problem = throttle_problem()
        if problem:
            raise HostError(problem)
        if not self.backing.exists():
            if self.size is None:
                raise HostError(f"{self.backing} does not exist and no size was given to create it")
            image = self.backing
            stack.push(f"remove {image}", lambda: image.unlink(missing_ok=True))
            self.cmds.run(["truncate", "-s", str(self.size), str(image)])
        workdir = Path(tempfile.mkdtemp(prefix="thr-", dir=_socket_parent(self._workdir_given)))
        self.workdir = workdir
        stack.push(f"remove {workdir}", lambda: shutil.rmtree(workdir, ignore_errors=True))
        socket, mnt = workdir / "nbd.sock", workdir / "mnt"
        mnt.mkdir()

        stack.push("stop nbdkit", self._stop_nbdkit)
        argv = [
            "nbdkit",
            "-f",
            "-U",
            str(socket),
            "-P",
            str(workdir / "nbdkit.pid"),
            *_trace_filter(),
            "--filter=delay",
            "--filter=rate",
            "file",
            str(self.backing),
            *self.throttle.nbdkit_args(),
            *_trace_args(self.backing),
        ]
        self.nbdkit = self.cmds.spawn(argv, workdir / "nbdkit.log", self._adopt_nbdkit)
        self._wait_ready(self.nbdkit, workdir / "nbdkit.pid", "nbdkit", workdir / "nbdkit.log")

        # nbdfuse is stopped by unmounting (its manual says so); the PID is a last resort.
        stack.push("stop nbdfuse", self._stop_nbdfuse)
        stack.push(f"fusermount3 -u {mnt}", lambda: self._unmount(mnt))
        argv = [
            "nbdfuse",
            "-P",
            str(workdir / "nbdfuse.pid"),
            str(mnt / "disk"),
            f"nbd+unix:///?socket={socket}",
        ]
        self.nbdfuse = self.cmds.spawn(argv, workdir / "nbdfuse.log", self._adopt_nbdfuse)
        self._wait_ready(self.nbdfuse, workdir / "nbdfuse.pid", "nbdfuse", workdir / "nbdfuse.log")

        disk = mnt / "disk"
        stack.push(f"detach the loop device over {disk}", lambda: _detach(self.cmds, disk))
        # direct I/O: the loop device must not cache what the throttle is meant to slow down
        out = self.cmds.run(
            ["losetup", "--find", "--show", "--direct-io=on", "--sector-size", "4096", str(disk)]
        )
        device = out.stdout.strip()
        if not device.startswith("/dev/loop"):
            raise HostError(f"losetup printed {device!r} for {disk}")
        self.device = device
        return device

    def _wait_ready(self, proc: subprocess.Popen[bytes], pidfile: Path, what: str, log: Path) -> None:
        def ready() -> bool:
            if proc.poll() is not None:
                return True
            try:
                return pidfile.read_text().strip().isdigit()
            except OSError:
                return False

        wait_for(ready, _READY_TIMEOUT_S, f"{what} to write {pidfile}")
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise HostError(f"{what} exited at start (exit {proc.returncode}): {tail[0]}")

    def _adopt_nbdkit(self, proc: subprocess.Popen[bytes]) -> None:
        self.nbdkit = proc

    def _adopt_nbdfuse(self, proc: subprocess.Popen[bytes]) -> None:
        self.nbdfuse = proc

    def _unmount(self, mnt: Path) -> None:
        if _is_mountpoint(mnt):
            self.cmds.run(["fusermount3", "-u", str(mnt)])

    def _stop_nbdfuse(self) -> None:
        if self.nbdfuse is not None:
            try:
                self.nbdfuse.wait(timeout=10)  # unmounting ends it
            except subprocess.TimeoutExpired:
                stop_process(self.nbdfuse)
            self.nbdfuse = None

    def _stop_nbdkit(self) -> None:
        if self.nbdkit is not None:
            stop_process(self.nbdkit)
            self.nbdkit = None


def _trace_dir() -> Path | None:
    """$ZBDLAB_TRACE_DIR: log every request the throttled disk serves (nbdkit's log filter, outermost,
    so a request's two lines bracket its delay and rate wait) to a file there. Diagnosis only."""
    wanted = os.environ.get("ZBDLAB_TRACE_DIR")
    return Path(wanted) if wanted else None


def _trace_filter() -> list[str]:
    return ["--filter=log"] if _trace_dir() is not None else []


def _trace_args(backing: Path) -> list[str]:
    trace = _trace_dir()
    if trace is None:
        return []
    trace.mkdir(parents=True, exist_ok=True)
    return [f"logfile={trace / f'{backing.parent.name}-{backing.stem}-{os.getpid()}-{time.time_ns()}.log'}"]


def _size_bytes(size: int | str | None) -> int | None:
    if size is None or isinstance(size, int):
        return size
    parsed = parse_size(size)
    if parsed is None:
        raise ThrottleError("size", f"expected e.g. '1G' or a byte count, got {size!r}")
    return parsed


def _socket_parent(wanted: Path | None) -> Path | None:
    """Where the device's own directory goes: `wanted` (a run's scratch directory, where `--resume`
    finds leftovers) unless its socket path would pass the 108-byte limit of Unix sockets; then /run."""
    if wanted is not None and len(str(wanted.resolve())) + len("/thr-xxxxxxxx/nbd.sock") < 100:
        wanted.mkdir(parents=True, exist_ok=True)
        return wanted
    return Path("/run") if os.access("/run", os.W_OK) else None


def _is_mountpoint(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        return any(len(f := line.split()) > 1 and f[1] == target for line in mounts)


def _detach(cmds: Commands, backing_file: Path) -> None:
    """Detach the loop devices over our own FUSE file, while its mount (and so the file) exists."""
    if backing_file.parent.exists() and _is_mountpoint(backing_file.parent):
        detach_loops(cmds, backing_file)


# --- measuring the device ---------------------------------------------------------------------------

FIO_PROBES: dict[str, dict[str, Any]] = {
    # name: fio options; sequential 1 MiB at depth 4, random 4 KiB at depth 1 (latency-bound)
    "seq_write_MiBps": {"rw": "write", "bs": "1M", "iodepth": 4},
    "seq_read_MiBps": {"rw": "read", "bs": "1M", "iodepth": 4},
    "rand_read_4k_iops": {"rw": "randread", "bs": "4k", "iodepth": 1},
}


def fio_probe(
    device: str, rw: str, bs: str, iodepth: int, runtime_s: float, ramp_s: float, size: str = "128M"
) -> dict[str, float]:
    """One direct-I/O fio job on `device`: MiB/s, IOPS and mean completion latency (ms).

    `ramp_s` is left out of the numbers (fio's ramp_time), which drains the rate filter's burst bucket.
    Data is incompressible and refilled for every write (fio's default buffers compress ~11:1).
    """
    argv = [
        "fio",
        "--name=probe",
        f"--filename={device}",
        f"--rw={rw}",
        f"--bs={bs}",
        f"--size={size}",
        f"--iodepth={iodepth}",
        "--ioengine=libaio",
        "--direct=1",
        "--time_based",
        f"--runtime={runtime_s:g}s",
        f"--ramp_time={ramp_s:g}s",
        "--refill_buffers",
        "--buffer_compress_percentage=0",
        "--randseed=20240229",
        "--output-format=json",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=runtime_s + ramp_s + 120, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise HostError(f"fio on {device} failed (exit {proc.returncode}): {tail}")
    job = json.loads(proc.stdout[proc.stdout.index("{") :])["jobs"][0]
    side = job["write" if "write" in rw else "read"]
    return {
        "MiBps": side["bw_bytes"] / (1 << 20),
        "iops": side["iops"],
        "clat_ms": side["clat_ns"]["mean"] / 1e6,
    }


def measure_overhead(parent: Path, runtime_s: float = 3, size_bytes: int = 256 << 20) -> dict[str, Any]:
    """What the nbdkit + nbdfuse + loop chain costs by itself: the same fio probes on a plain loop
    device over an image (as unthrottled targets have) and on an unthrottled ThrottledDevice over the
    same image.

    Returns {"plain": {probe: value}, "passthrough": {...}, "overhead_pct": {...}, "probe": ...};
    overhead_pct is how much slower the chain is (positive: slower)."""
    cmds = Commands()
    parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="overhead-", dir=parent))
    image = workdir / "overhead.img"
    stack = CleanupStack("throttle overhead")
    results: dict[str, dict[str, float]] = {}
    try:
        stack.push(f"remove {workdir}", lambda: shutil.rmtree(workdir, ignore_errors=True))
        # a plain loop device made the way every unthrottled target's is (buffered, over the image)
        plain_scope = stack.scope(f"plain loop over {image}")
        plain = create_loop(cmds, plain_scope, image, size_bytes)
        results["plain"] = _probe_all(plain, runtime_s)
        plain_scope.close_scope(stack)
        with ThrottledDevice(image, size_bytes, throttle=Throttle(), workdir=workdir, cmds=cmds) as dev:
            results["passthrough"] = _probe_all(dev, runtime_s)
    finally:
        stack.close()
    overhead = {
        name: 100.0 * (1 - results["passthrough"][name] / results["plain"][name])
        for name in FIO_PROBES
        if results["plain"][name]
    }
    return {
        **results,
        "overhead_pct": overhead,
        "probe": f"fio direct libaio, {runtime_s:g}s per probe after a 1s ramp, incompressible data",
    }


def _probe_all(device: str, runtime_s: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, opts in FIO_PROBES.items():
        numbers = fio_probe(device, opts["rw"], opts["bs"], opts["iodepth"], runtime_s, ramp_s=1)
        out[name] = numbers["iops"] if name.endswith("iops") else numbers["MiBps"]
    return out
