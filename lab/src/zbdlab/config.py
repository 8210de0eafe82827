"""The study file: a versioned, validated TOML description of targets, workloads and policy.

Every problem is reported as `<file>: <key>: <problem>` (one line, exit code 2), e.g.
`study.toml: targets[2].fs: unknown filesystem 'ext5' (expected ext4, xfs, btrfs, zfs)`.
The reference for every key is docs/lab.md.

Version history of the study file `version`:
  1  first version
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zbdlab.app import UserError

if TYPE_CHECKING:
    from zbdlab.throttle import Throttle
from zbdlab.workloads.base import DataSpec

STUDY_VERSION = 1

FILESYSTEMS = ("ext4", "xfs", "btrfs", "zfs")
TRANSPORTS = ("nbdkit",)
SERVER_CACHES = ("host", "none")
WORKLOAD_KINDS = ("iozone", "throughput", "postmark", "fileserver", "varmail", "webserver", "oltp", "copy")
CACHE_POLICIES = ("cold", "warm")
FORMAT_POLICIES = ("repetition", "run", "once")
# smallest device each mkfs accepts (mkfs.xfs refuses < 300M, mkfs.btrfs < 109M, ZFS vdevs < 64M)
SIZE_MIN_BYTES = {"ext4": 64 << 20, "xfs": 300 << 20, "btrfs": 128 << 20, "zfs": 64 << 20}
BTRFS_RAID_MIN_DEVICES = {"single": 1, "dup": 1, "raid0": 2, "raid1": 2, "raid10": 4, "raid5": 3}
ZFS_LAYOUT_MIN_DEVICES = {"single": 1, "mirror": 2, "raidz": 3, "raid10": 4}
# zfs-fuse is pool version 23: lzjb, gzip[-N], zle; lz4 arrived later (kernel ZFS only).
ZFS_COMPRESSION = ("off", "on", "lzjb", "gzip", "zle", "lz4") + tuple(f"gzip-{n}" for n in range(1, 10))
ZFS_DEDUP = ("on", "off", "verify")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class ConfigError(UserError):
    """A study file problem: names the file, the key and what is wrong."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source, self.key, self.problem = source, key, problem
        super().__init__(f"{source}: {key}: {problem}" if key else f"{source}: {problem}")


@dataclass(frozen=True)
class ZbdSpec:
    codec: str = "lz4"
    extent_size_bytes: int = 512 << 10  # `zbd create`'s default on a file (issue 30)
    logical_size_bytes: int | None = None  # default: the backing size


@dataclass(frozen=True)
class TargetSpec:
    name: str
    fs: str
    size_bytes: int = 1 << 30  # per backing device
    devices: int = 1
    mkfs_options: tuple[str, ...] = ()
    mount_options: tuple[str, ...] = ()
    # btrfs
    compress: str | None = None  # lzo | zstd[:N] | zlib[:N]
    compress_force: bool = False
    raid: str | None = None  # btrfs data (and metadata) profile
    metadata_raid: str | None = None
    # zfs
    layout: str = "single"
    compression: str = "off"
    dedup: str = "off"
    recordsize_bytes: int | None = None
    # any fs on a zbd volume
    zbd: ZbdSpec | None = None
    # any fs on `nbdkit file` through the same NBD transport as zbd (`zbd attach`: nbdfuse + loop on a
    # machine without the nbd module): the transport baseline, which shows what zbd's path costs
    transport: str | None = None  # "nbdkit"
    # zbd and transport targets: "host" lets the NBD server read and write its backing device through
    # the host's page cache (outside any memory limit); "none" keeps it out (zbd serve --direct,
    # nbdkit file cache=none), so the only caches are the filesystem's and the server's own
    server_cache: str = "host"
    # a real device instead of loop images, only with allow_real_device = true
    real_devices: tuple[str, ...] = ()
    # images on a device limited in bandwidth and latency (zbdlab.throttle)
    throttle: Throttle | None = None

    @property
    def kind(self) -> str:
        if self.transport:
            return f"{self.fs}-on-{self.transport}"
        return f"{self.fs}-on-zbd" if self.zbd else self.fs

    @property
    def compression_label(self) -> str:
        """What compresses the data on this target, e.g. "btrfs:zstd:3", "zfs:gzip", "zbd:lz4", "off"."""
        if self.zbd and self.zbd.codec != "none":
            return f"zbd:{self.zbd.codec}"
        if self.fs == "btrfs" and self.compress:
            return f"btrfs:{self.compress}{' force' if self.compress_force else ''}"
        if self.fs == "zfs" and self.compression != "off":
            return f"zfs:{self.compression}"
        return "off"

    @property
    def compression_under_test(self) -> bool:
        return self.compression_label != "off"

    @property
    def is_raid(self) -> bool:
        return self.devices > 1


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    kind: str
    table: dict[str, Any]  # the workload's own keys (kind included), handed to the factory
    data: DataSpec
    key: str  # "workloads.<name>", for messages


@dataclass(frozen=True)
class Study:
    source: str  # file name used in messages
    path: Path
    text: str
    name: str
    description: str
    version: int
    repetitions: int
    cache: str
    format: str
    seed: int | None
    measures: str
    realistic_ratio: float
    scratch_dir: Path | None
    targets: tuple[TargetSpec, ...]
    workloads: tuple[WorkloadSpec, ...]
    # each workload tool runs in a cgroup of this many bytes, page cache included (zbdlab.memlimit)
    memory_limit: int | None = None
    # warm studies: sync and drop the host's page cache before each run (no remount), recorded per run
    drop_caches: bool = False
    extra_checks: dict[str, Any] = field(default_factory=dict)


def parse_size(value: Any) -> int | None:
    """ "32K" -> 32768; ints pass through; None if unparseable. Units are powers of 1024."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if not isinstance(value, str):
        return None
    m = _SIZE_RE.match(value)
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


class _Table:
    """Reads one TOML table, naming every problem by its full key, and rejects unknown keys."""

    def __init__(self, source: str, prefix: str, data: dict[str, Any]) -> None:
        self.source, self.prefix, self.data = source, prefix, data
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def fail(self, name: str, problem: str) -> ConfigError:
        return ConfigError(self.source, self.key(name), problem)

    def has(self, name: str) -> bool:
        return name in self.data

    def raw(self, name: str, default: Any = None) -> Any:
        self.used.add(name)
        return self.data.get(name, default)

    def string(self, name: str, default: str | None = None, choices: Iterable[str] | None = None) -> Any:
        value = self.raw(name, default)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(name, f"expected a string, got {_show(value)}")
        if choices is not None:
            options = tuple(choices)
            if value not in options:
                raise self.fail(name, f"unknown value {value!r} (expected {', '.join(options)})")
        return value

    def required_string(self, name: str, what: str = "a string") -> str:
        if name not in self.data:
            raise self.fail(name, f"missing (expected {what})")
        return self.string(name)

    def integer(self, name: str, default: int | None, lo: int | None = None, hi: int | None = None) -> Any:
        value = self.raw(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, f"expected an integer, got {_show(value)}")
        if lo is not None and value < lo:
            raise self.fail(name, f"must be at least {lo}, got {value}")
        if hi is not None and value > hi:
            raise self.fail(name, f"must be at most {hi}, got {value}")
        return value

    def number(self, name: str, default: float, lo: float) -> float:
        value = self.raw(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(name, f"expected a number, got {_show(value)}")
        if value < lo:
            raise self.fail(name, f"must be at least {lo}, got {value}")
        return float(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.raw(name, default)
        if not isinstance(value, bool):
            raise self.fail(name, f"expected true or false, got {_show(value)}")
        return value

    def size(self, name: str, default: int | None) -> Any:
        value = self.raw(name, default)
        if value is None:
            return None
        size = parse_size(value)
        if size is None:
            raise self.fail(name, f"not a size: {_show(value)} (expected e.g. 512M, 2G or a byte count)")
        return size

    def options(self, name: str) -> tuple[str, ...]:
        """A list of strings, or one comma-separated string (mount options)."""
        value = self.raw(name, [])
        if isinstance(value, str):
            return (
                tuple(v for v in value.split(",") if v) if name == "mount_options" else tuple(value.split())
            )
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(name, f"expected a list of strings, got {_show(value)}")
        return tuple(value)

    def table(self, name: str) -> dict[str, Any] | None:
        value = self.raw(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(name, f"expected a table, got {_show(value)}")
        return value

    def reject_unknown(self, allowed_hint: Iterable[str] | None = None) -> None:
        unknown = [k for k in self.data if k not in self.used]
        if unknown:
            hint = sorted(self.used if allowed_hint is None else allowed_hint)
            raise self.fail(unknown[0], f"unknown key (expected one of {', '.join(hint)})")


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def load_study(path: Path) -> Study:
    source = path.name
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read: {exc.strerror or exc}") from None
    return parse_study(text, source=source, path=path)


def parse_study(text: str, source: str = "study.toml", path: Path | None = None) -> Study:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, "", f"not valid TOML: {exc}") from None
    top = _Table(source, "", doc)
    version = top.integer("version", None)
    if version is None:
        raise top.fail("version", f"missing (expected version = {STUDY_VERSION})")
    if version != STUDY_VERSION:
        raise top.fail("version", f"unsupported study version {version} (this zbdlab reads {STUDY_VERSION})")
    base_dir = path.parent if path else Path.cwd()
    name = top.string("name", Path(source).stem)
    description = top.string("description", "")
    repetitions = top.integer("repetitions", 5, lo=1, hi=1000)
    cache = top.string("cache", "cold", CACHE_POLICIES)
    fmt = top.string("format", "repetition", FORMAT_POLICIES)
    seed = top.integer("seed", None, lo=0)
    measures = top.string("measures", "disk", ("disk", "cache"))
    realistic_ratio = top.number("realistic_ratio", 2.1, lo=1.0)
    scratch = top.string("scratch_dir", None)
    memory_limit = top.size("memory_limit", None)
    if memory_limit is not None and memory_limit < 16 << 20:
        raise top.fail("memory_limit", f"{memory_limit} bytes is too small for a tool to run (at least 16M)")
    drop_caches = top.boolean("drop_caches", False)
    if drop_caches and cache != "warm":
        raise top.fail(
            "drop_caches", 'only with cache = "warm" (a cold cache drops it already, after a remount)'
        )
    data_table = top.table("data")
    study_data = _data_spec(source, "data", data_table or {}, DataSpec(), base_dir)

    targets_raw = top.raw("targets")
    if targets_raw is None:
        raise top.fail("targets", "missing (expected at least one [[targets]] table)")
    if (
        not isinstance(targets_raw, list)
        or not targets_raw
        or not all(isinstance(t, dict) for t in targets_raw)
    ):
        raise top.fail("targets", "expected a non-empty array of tables ([[targets]])")
    targets = tuple(_target(source, i, t) for i, t in enumerate(targets_raw))
    seen: dict[str, int] = {}
    for i, t in enumerate(targets):
        if t.name in seen:
            raise ConfigError(
                source, f"targets[{i}].name", f"duplicate name {t.name!r} (also targets[{seen[t.name]}])"
            )
        seen[t.name] = i

    workloads_raw = top.table("workloads")
    if not workloads_raw:
        raise top.fail("workloads", "missing (expected at least one [workloads.<name>] table)")
    workloads = tuple(_workload(source, n, w, study_data, base_dir) for n, w in workloads_raw.items())
    top.reject_unknown()
    return Study(
        source=source,
        path=path or Path(source),
        text=text,
        name=name,
        description=description,
        version=version,
        repetitions=repetitions,
        cache=cache,
        format=fmt,
        seed=seed,
        measures=measures,
        realistic_ratio=realistic_ratio,
        scratch_dir=(base_dir / scratch) if scratch else None,
        targets=targets,
        workloads=workloads,
        memory_limit=memory_limit,
        drop_caches=drop_caches,
    )


def _data_spec(
    source: str, prefix: str, table: dict[str, Any], default: DataSpec, base_dir: Path
) -> DataSpec:
    t = _Table(source, prefix, table)
    kind = t.string("kind", default.kind, ("synthetic", "corpus", "tool"))
    pct = t.integer("compress_percentage", default.compress_percentage, lo=0, hi=100)
    dedup = t.integer("dedupe_percentage", default.dedupe_percentage, lo=0, hi=100)
    corpus = t.string("corpus_dir", None)
    t.reject_unknown()
    corpus_dir = (base_dir / corpus) if corpus else default.corpus_dir
    if kind == "corpus" and corpus_dir is None:
        raise t.fail("corpus_dir", "missing (data kind 'corpus' needs corpus_dir, see `zbdlab corpus build`)")
    if dedup and kind != "synthetic" and "dedupe_percentage" in table:
        raise t.fail("dedupe_percentage", f"applies to synthetic data only, not kind {kind!r}")
    if kind != "synthetic":
        dedup = 0  # an inherited study-level value means nothing for corpus or tool data
    return DataSpec(kind=kind, compress_percentage=pct, corpus_dir=corpus_dir, dedupe_percentage=dedup)


def _workload(source: str, name: str, table: Any, data: DataSpec, base_dir: Path) -> WorkloadSpec:
    key = f"workloads.{name}"
    if not _NAME_RE.match(name):
        raise ConfigError(source, key, "workload names use letters, digits, '.', '_' and '-'")
    if not isinstance(table, dict):
        raise ConfigError(source, key, f"expected a table, got {_show(table)}")
    kind = table.get("kind", table.get("type"))
    if "kind" in table and "type" in table and table["kind"] != table["type"]:
        raise ConfigError(source, f"{key}.type", "differs from kind (type is an alias of kind; give one)")
    allowed = (*WORKLOAD_KINDS, "custom")
    if kind is None:
        raise ConfigError(source, f"{key}.kind", f"missing (expected one of {', '.join(allowed)})")
    if kind not in allowed:
        raise ConfigError(
            source, f"{key}.kind", f"unknown workload kind {kind!r} (expected {', '.join(allowed)})"
        )
    own = {k: v for k, v in table.items() if k != "type"}
    own["kind"] = kind
    data_table = own.pop("data", None)
    if data_table is not None and not isinstance(data_table, dict):
        raise ConfigError(source, f"{key}.data", f"expected a table, got {_show(data_table)}")
    spec_data = _data_spec(source, f"{key}.data", data_table, data, base_dir) if data_table else data
    return WorkloadSpec(name=name, kind=kind, table=own, data=spec_data, key=key)


def _codec(value: str, family: dict[str, tuple[int, int] | None]) -> bool:
    name, _, level = value.partition(":")
    if name not in family:
        return False
    bounds = family[name]
    if not level:
        return True
    if bounds is None or not level.isdigit():
        return False
    return bounds[0] <= int(level) <= bounds[1]


BTRFS_CODECS: dict[str, tuple[int, int] | None] = {"lzo": None, "zstd": (1, 15), "zlib": (1, 9)}
ZBD_CODECS: dict[str, tuple[int, int] | None] = {
    "lz4": None,
    "zstd": (1, 22),
    "zlib": (1, 9),
    "lzo": None,
    "none": None,
}


def _target(source: str, index: int, raw: dict[str, Any]) -> TargetSpec:
    t = _Table(source, f"targets[{index}]", raw)
    name = t.required_string("name", "a name such as 'btrfs-zstd'")
    if not _NAME_RE.match(name):
        raise t.fail("name", f"{name!r}: names use letters, digits, '.', '_' and '-' (at most 64)")
    fs = t.string("fs", None)
    if fs is None:
        raise t.fail("fs", f"missing (expected {', '.join(FILESYSTEMS)})")
    if fs not in FILESYSTEMS:
        raise t.fail("fs", f"unknown filesystem {fs!r} (expected {', '.join(FILESYSTEMS)})")
    size = t.size("size", 1 << 30)
    if size < SIZE_MIN_BYTES[fs]:
        raise t.fail("size", f"{fs} needs at least {SIZE_MIN_BYTES[fs] >> 20}M per device, got {size} bytes")
    devices = t.integer("devices", 1, lo=1, hi=16)
    mkfs_options = t.options("mkfs_options")
    mount_options = t.options("mount_options")

    kwargs: dict[str, Any] = {}
    for key in ("compress", "compress_force", "raid", "metadata_raid"):
        if t.has(key) and fs != "btrfs":
            raise t.fail(
                key, f"only btrfs takes {key} ({fs} here; use a zbd table for block-level compression)"
            )
    for key in ("layout", "compression", "dedup", "recordsize"):
        if t.has(key) and fs != "zfs":
            raise t.fail(key, f"only zfs takes {key} ({fs} here)")
    if fs == "btrfs":
        kwargs.update(_btrfs(t, devices))
    elif fs == "zfs":
        kwargs.update(_zfs(t, devices))
    elif devices > 1:
        raise t.fail("devices", f"{fs} uses one device (multi-device targets: btrfs raid or zfs layout)")

    zbd_table = t.table("zbd")
    zbd = _zbd(source, index, zbd_table, size) if zbd_table is not None else None
    if zbd and devices > 1:
        raise t.fail("devices", "a zbd target is one volume (one backing device)")
    transport = t.string("transport", None, TRANSPORTS)
    if transport and (zbd or fs == "zfs" or devices > 1):
        raise t.fail(
            "transport", "a transport baseline is one kernel filesystem on one plain NBD export (no zbd)"
        )

    server_cache = t.string("server_cache", "host", SERVER_CACHES) or "host"
    if t.has("server_cache") and not (zbd or transport):
        raise t.fail("server_cache", "only a zbd or transport target has an NBD server under its filesystem")

    real = t.raw("device")
    allow_real = t.boolean("allow_real_device", False)
    real_devices: tuple[str, ...] = ()
    if real is not None:
        paths = [real] if isinstance(real, str) else real
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
            raise t.fail("device", f"expected a device path or a list of them, got {_show(real)}")
        if not allow_real:
            raise t.fail(
                "device", "a real device is used only with allow_real_device = true (its data is destroyed)"
            )
        if not all(p.startswith("/dev/") for p in paths):
            raise t.fail("device", "real devices are paths under /dev/")
        if len(paths) != devices:
            raise t.fail("device", f"{len(paths)} device(s) given but devices = {devices}")
        real_devices = tuple(paths)
    elif allow_real:
        raise t.fail("allow_real_device", 'set, but no device = "/dev/..." is named')
    throttle_table = t.table("throttle")
    throttle = _throttle(source, index, throttle_table) if throttle_table is not None else None
    if throttle and real_devices:
        raise t.fail("throttle", "throttles loop images only, not a real device")
    t.reject_unknown(
        (
            "name fs size devices mkfs_options mount_options compress compress_force raid metadata_raid "
            "layout compression dedup recordsize zbd transport server_cache device allow_real_device throttle"
        ).split()
    )
    return TargetSpec(
        name=name,
        fs=fs,
        size_bytes=size,
        devices=devices,
        mkfs_options=mkfs_options,
        mount_options=mount_options,
        zbd=zbd,
        transport=transport,
        server_cache=server_cache,
        real_devices=real_devices,
        throttle=throttle,
        **kwargs,
    )


def _btrfs(t: _Table, devices: int) -> dict[str, Any]:
    compress = t.string("compress", None)
    if compress is not None and compress != "no" and not _codec(compress, BTRFS_CODECS):
        raise t.fail(
            "compress", f"unknown btrfs compression {compress!r} (expected lzo, zstd[:1-15], zlib[:1-9])"
        )
    force = t.boolean("compress_force", False)
    if force and not compress:
        raise t.fail("compress_force", "needs compress = <algorithm>")
    profiles = tuple(BTRFS_RAID_MIN_DEVICES)
    raid = t.string("raid", None, profiles)
    meta = t.string("metadata_raid", None, profiles)
    if devices > 1 and raid is None:
        raise t.fail("raid", f"{devices} devices need a profile (expected {', '.join(profiles)})")
    for key, profile in (("raid", raid), ("metadata_raid", meta)):
        if profile and devices < BTRFS_RAID_MIN_DEVICES[profile]:
            raise t.fail(
                key, f"{profile} needs at least {BTRFS_RAID_MIN_DEVICES[profile]} devices, got {devices}"
            )
    return {
        "compress": None if compress == "no" else compress,
        "compress_force": force,
        "raid": raid,
        "metadata_raid": meta,
    }


def _zfs(t: _Table, devices: int) -> dict[str, Any]:
    layout = t.string("layout", "single", tuple(ZFS_LAYOUT_MIN_DEVICES))
    if devices < ZFS_LAYOUT_MIN_DEVICES[layout]:
        raise t.fail(
            "layout", f"{layout} needs at least {ZFS_LAYOUT_MIN_DEVICES[layout]} devices, got {devices}"
        )
    if layout == "raid10" and devices % 2:
        raise t.fail(
            "layout", f"raid10 (a stripe of two-way mirrors) needs an even number of devices, got {devices}"
        )
    compression = t.string("compression", "off", ZFS_COMPRESSION)
    dedup_raw = t.raw("dedup", "off")
    if isinstance(dedup_raw, bool):
        dedup = "on" if dedup_raw else "off"
    elif isinstance(dedup_raw, str) and dedup_raw in ZFS_DEDUP:
        dedup = dedup_raw
    else:
        raise t.fail(
            "dedup", f"unknown value {_show(dedup_raw)} (expected true, false, 'on', 'off', 'verify')"
        )
    recordsize = t.size("recordsize", None)
    if recordsize is not None and (
        recordsize < 512 or recordsize > (128 << 10) or recordsize & (recordsize - 1)
    ):
        raise t.fail("recordsize", f"a power of two from 512 to 128K, got {recordsize}")
    return {"layout": layout, "compression": compression, "dedup": dedup, "recordsize_bytes": recordsize}


def _zbd(source: str, index: int, table: dict[str, Any], size: int) -> ZbdSpec:
    t = _Table(source, f"targets[{index}].zbd", table)
    codec = t.string("codec", "lz4")
    if not _codec(codec, ZBD_CODECS):
        raise t.fail("codec", f"unknown codec {codec!r} (expected lz4, zstd:N, zlib:N, lzo, none)")
    extent = t.size("extent_size", ZbdSpec.extent_size_bytes)
    if extent < (8 << 10) or extent > (1 << 20) or extent & (extent - 1):
        raise t.fail("extent_size", f"a power of two from 8K to 1M, got {extent}")
    logical = t.size("logical_size", None)
    t.reject_unknown()
    return ZbdSpec(codec=codec, extent_size_bytes=extent, logical_size_bytes=logical)


def _throttle(source: str, index: int, table: dict[str, Any]) -> Throttle:
    # imported here: zbdlab.throttle imports the targets package, which imports this module
    from zbdlab.throttle import Throttle as _Throttle
    from zbdlab.throttle import ThrottleError, parse_latency, parse_rate

    t = _Table(source, f"targets[{index}].throttle", table)
    try:
        rate = parse_rate(t.raw("rate"))
        latency = parse_latency(t.raw("latency"))
    except ThrottleError as exc:
        raise t.fail(exc.key, exc.problem) from None
    t.reject_unknown(("rate", "latency"))
    if rate is None and not latency:
        raise ConfigError(
            source, t.prefix, 'sets neither rate nor latency (e.g. { rate = "100M", latency = "2ms" })'
        )
    return _Throttle(rate_bytes=rate, latency_ms=latency)
