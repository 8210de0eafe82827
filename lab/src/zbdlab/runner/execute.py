"""Run a study: provision targets as the plan needs them, execute units, record every run.

Every resource (image, loop device, mount, pool, daemon) is pushed on a cleanup stack when created;
a failure, Ctrl-C or SIGTERM unwinds the stack (newest first) and the runs already recorded stay.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from zbdlab import memlimit, signals, throttle
from zbdlab.app import HostError, UserError
from zbdlab.config import Study, TargetSpec, WorkloadSpec
from zbdlab.monitors import cache, counters, environment
from zbdlab.results.schema import RunRecord
from zbdlab.results.store import ResultStore
from zbdlab.runner import factory, plan, recover, validity
from zbdlab.targets.cleanup import CleanupStack
from zbdlab.targets.commands import Commands
from zbdlab.targets.instance import Space, TargetInstance, provision
from zbdlab.targets.zbd import zbd_problem
from zbdlab.targets.zfs import ZfsService, kernel_zfs_present
from zbdlab.workloads.base import Measurement, RunContext, Workload, WorkloadError

CSV_INTERVAL_S = 30  # runs.csv is rewritten at most this often during a study, and at its end


# a file the throttle's overhead probe is kept in and reused from (see Executor._throttle_overhead)
OVERHEAD_ENV = "ZBDLAB_THROTTLE_OVERHEAD"


class Interrupted(BaseException):
    """SIGINT/SIGTERM: unwind everything, keep what is recorded."""


class RunFailed(Exception):
    pass


@dataclass
class RunOutcome:
    results_dir: Path
    done: int
    skipped: int
    total: int
    warnings: list[str] = field(default_factory=list)


@dataclass
class _OpSample:
    cpu: counters.CpuSample
    io: dict[str, counters.IoSample]
    t: float


class Runner:
    def __init__(self, study: Study, results_dir: Path, resume: bool = False, console: Console | None = None):
        self.study, self.resume = study, resume
        # absolute: workloads run tools from other directories and hand them raw-file paths
        self.store = ResultStore(results_dir.resolve())
        self.console = console or Console()
        self.workloads: dict[str, Workload] = {}
        self.specs: dict[str, WorkloadSpec] = {w.name: w for w in study.workloads}
        self.targets: dict[str, TargetSpec] = {t.name: t for t in study.targets}
        self.instances: dict[str, TargetInstance] = {}
        self.seed = 0
        self.mem_available = 0

    # --- before anything is created -----------------------------------------------------------------

    def prepare(self) -> list[plan.Unit]:
        """Validate everything that can be checked without touching devices (errors exit 2)."""
        for spec in self.study.workloads:
            self.workloads[spec.name] = factory.build(self.study.source, spec)
        cells = {name: list(w.cells()) for name, w in self.workloads.items()}
        for name, cs in cells.items():
            if not cs:
                raise UserError(f"{self.study.source}: workloads.{name}: the workload has no cells")
        self._check_host()
        units = plan.units_of(self.study, cells)
        self.seed, order_ids = self._seed_and_order(units)
        by_id = {u.unit_id: u for u in units}
        if set(order_ids) != set(by_id):
            raise UserError(f"{self.store.root}/plan.json: the recorded plan does not match the study file")
        return [by_id[i] for i in order_ids]

    def _check_host(self) -> None:
        if os.geteuid() != 0:
            raise HostError("zbdlab run needs root (loop devices, mkfs, mount, drop_caches)")
        if any(t.zbd or t.transport for t in self.study.targets):
            problem = zbd_problem()
            if problem:
                raise HostError(f"zbd targets cannot run: {problem}")
        if self.study.memory_limit and (problem := memlimit.cgroup_problem()):
            raise HostError(f"{self.study.source}: {problem}")
        fuse_only = not kernel_zfs_present()
        for i, t in enumerate(self.study.targets):
            if t.fs == "zfs" and t.compression == "lz4" and fuse_only:
                raise HostError(
                    f"{self.study.source}: targets[{i}].compression: lz4 needs kernel ZFS; this host has "
                    "zfs-fuse (pool v23: lzjb, gzip, gzip-N, zle)"
                )
            if t.throttle and throttle.throttle_problem():
                raise HostError(f"target {t.name}: {throttle.throttle_problem()}")
            for d in t.real_devices:
                if not Path(d).is_block_device():
                    raise HostError(f"target {t.name}: {d} is not a block device")
                with open("/proc/self/mounts", encoding="utf-8") as mounts:
                    if any(line.split()[0] == d for line in mounts):
                        raise HostError(f"target {t.name}: {d} is mounted; refusing to use it")

    def _seed_and_order(self, units: list[plan.Unit]) -> tuple[int, list[str]]:
        saved = self.store.read_json("plan.json")
        if self.resume:
            if saved is None:
                raise UserError(f"--resume: {self.store.root} holds no interrupted run (no plan.json)")
            saved_study = (self.store.root / "study.toml").read_text(encoding="utf-8")
            if saved_study != self.study.text:
                raise UserError(f"--resume: the study file differs from {self.store.root}/study.toml")
            return int(saved["seed"]), list(saved["order"])
        if saved is not None or self.store.runs_path.exists():
            raise UserError(
                f"{self.store.root} already holds results (use --resume, or another -o directory)"
            )
        seed = self.study.seed if self.study.seed is not None else secrets.randbelow(2**31)
        order = plan.order_units(self.study, units, seed)
        return seed, [u.unit_id for u in order]

    # --- the run ------------------------------------------------------------------------------------

    def run(self) -> RunOutcome:
        order = self.prepare()
        store = self.store
        store.create()
        # the throttle's overhead probe (in _record_start) makes loop devices, nbdkit and nbdfuse
        # mounts: a SIGTERM there must unwind them too, not kill the process with them left behind
        with signals.raising(Interrupted):
            self._record_start(order)
        finished = store.finished_units()
        remaining = [u for u in order if u.unit_id not in finished]
        outcome = RunOutcome(store.root, 0, len(order) - len(remaining), len(order))
        if outcome.skipped:
            self.console.print(
                f"resume: {outcome.skipped} of {len(order)} units already recorded, skipping them"
            )
        cmds = Commands(store.root / "commands.jsonl")
        if self.resume:
            self._recover(cmds)
        stack = CleanupStack("zbdlab run", report=lambda m: self.console.print(f"[yellow]{m}[/]"))
        scratch = self._scratch(stack)
        zfs = ZfsService(cmds, stack, scratch / "zfs-fuse")
        self.mem_available = counters.meminfo().get("MemAvailable", 0)
        if self.study.memory_limit:
            # the page cache a workload can use is its cgroup's limit
            self.mem_available = min(self.mem_available, self.study.memory_limit)
            for left in memlimit.remove_stale():
                self.console.print(f"[yellow]removed the cgroup {left} of a killed run[/]")
        left_per_instance: dict[str, int] = {}
        for u in remaining:
            left_per_instance[u.instance_key] = left_per_instance.get(u.instance_key, 0) + 1
        csv_written = time.monotonic()
        try:
            with signals.raising(Interrupted), self._progress(len(order), outcome.skipped) as progress:
                task = progress.add_task("starting", total=len(order), completed=outcome.skipped)
                for unit in remaining:
                    progress.update(task, description=f"{unit.unit_id}  [dim]({unit.target})[/]")
                    inst = self.instances.get(unit.instance_key)
                    if inst is None:
                        progress.update(task, description=f"provisioning {unit.instance_key}")
                        inst = provision(
                            self.targets[unit.target], plan.safe(unit.instance_key), scratch, cmds, stack, zfs
                        )
                        self.instances[unit.instance_key] = inst
                        progress.update(task, description=f"{unit.unit_id}  [dim]({unit.target})[/]")
                    index = order.index(unit)
                    records = self._execute(unit, inst, cmds, index)
                    store.append(records)
                    if time.monotonic() - csv_written > CSV_INTERVAL_S:  # the table re-reads all runs
                        store.write_csv()
                        csv_written = time.monotonic()
                    outcome.done += 1
                    progress.advance(task)
                    left_per_instance[unit.instance_key] -= 1
                    if left_per_instance[unit.instance_key] == 0:
                        cmds.context = f"teardown {inst.ident}"
                        self.instances.pop(unit.instance_key)
                        inst.teardown()
        finally:
            with signals.deferred(self.console):
                cmds.context = "cleanup"
                stack.close()
                cmds.close()
                store.write_csv()
                outcome.warnings = self._finish_warnings()
        return outcome

    def _record_start(self, order: list[plan.Unit]) -> None:
        store = self.store
        if self.resume:
            env = store.read_json("environment.json") or {}
            env.setdefault("resume_times", []).append(time.time())
            store.write_json("environment.json", env)
            return
        seed = self.seed
        store.save_study(self.study.text)
        store.write_json(
            "plan.json",
            {
                "seed": seed,
                "cache": self.study.cache,
                "format": self.study.format,
                "order": [u.unit_id for u in order],
            },
        )
        env = environment.collect()
        env["study"] = {
            "name": self.study.name,
            "repetitions": self.study.repetitions,
            "cache": self.study.cache,
            "format": self.study.format,
            "measures": self.study.measures,
            "seed": seed,
        }
        env["targets"] = {t.name: _target_options(t) for t in self.study.targets}
        if any(t.throttle for t in self.study.targets):
            # what the nbdkit + nbdfuse + loop chain costs by itself, so throttled numbers can be read
            env["throttle_overhead"] = self._throttle_overhead()
        env["start_time"] = time.time()
        store.write_json("environment.json", env)

    def _throttle_overhead(self) -> dict[str, Any]:
        """The chain's overhead probe; with ZBDLAB_THROTTLE_OVERHEAD=FILE it is measured once and
        reused from FILE (zbdlab reproduce runs many throttled studies back to back: the probe is of
        this machine's nbdkit + nbdfuse + loop chain, not of a study)."""
        shared = os.environ.get(OVERHEAD_ENV)
        if shared and Path(shared).is_file():
            try:
                saved = json.loads(Path(shared).read_text())
                return {**saved, "reused_from": shared}
            except (OSError, json.JSONDecodeError):
                pass  # measure again
        self.console.print("measuring the throttled devices' own overhead (fio, about 15 s)")
        measured = throttle.measure_overhead(self.study.scratch_dir or Path("/var/tmp"), runtime_s=1)
        measured["measured_at"] = time.time()
        if shared:
            Path(shared).parent.mkdir(parents=True, exist_ok=True)
            Path(shared).write_text(json.dumps(measured, indent=2))
        return measured

    def _scratch(self, stack: CleanupStack) -> Path:
        base = self.study.scratch_dir or Path("/var/tmp")
        base.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix="zbdlab-", dir=base))
        stack.push(f"remove {scratch}", lambda: shutil.rmtree(scratch, ignore_errors=True))
        # recorded, so a --resume after a SIGKILL can find and undo what this run leaves behind
        saved = self.store.read_json("plan.json")
        saved.setdefault("scratch_dirs", []).append(str(scratch))
        self.store.write_json("plan.json", saved)
        return scratch

    def _recover(self, cmds: Commands) -> None:
        for path in self.store.read_json("plan.json").get("scratch_dirs", []):
            if recover.recover(Path(path), cmds):
                self.console.print(f"resume: cleaned up what the interrupted run left in {path}")

    @contextmanager
    def _progress(self, total: int, done: int) -> Iterator[Progress]:
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("units done"),
            TimeElapsedColumn(),
            TextColumn("elapsed,"),
            TimeRemainingColumn(),
            TextColumn("left"),
            console=self.console,
            transient=False,
        )
        with progress:
            yield progress

    # --- one unit -----------------------------------------------------------------------------------

    def _execute(self, unit: plan.Unit, inst: TargetInstance, cmds: Commands, index: int) -> list[RunRecord]:
        spec = self.specs[unit.workload]
        workload = self.workloads[unit.workload]
        target = self.targets[unit.target]
        cmds.context = unit.unit_id
        raw = self.store.raw_dir(unit.unit_id)
        self.store.write_json(f"raw/{unit.unit_id}/target.json", inst.describe())
        workdir = inst.workdir / plan.safe(f"{unit.workload}-{unit.repetition}")
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        cold = self.study.cache == "cold"
        cache_checks: list[dict[str, Any]] = []
        if cold:
            cache_checks.append(self._make_cold(inst, cmds, workdir, "before the run"))
        elif self.study.drop_caches:
            # warm, but what the previous run left in the host's page cache (the loop devices', zbd's
            # and nbdkit's, outside the workload's memory cgroup) does not carry into this one
            cache_checks.append({"when": "before the run (drop only)", **cache.drop_caches(cmds)})
        samples: dict[str, _OpSample] = {}
        deltas: dict[str, dict[str, Any]] = {}
        spaces: dict[str, Space] = {}
        devices = inst.counted_devices()

        def before(op: str) -> None:
            samples[op] = _OpSample(counters.read_cpu(), self._io(inst), time.monotonic())

        def after(op: str) -> None:
            cpu = counters.read_cpu()
            start = samples.get(op)
            if start is None:
                return
            synced = time.monotonic()
            cmds.run(["sync"])  # this op's dirty data reaches the devices before they are read
            sync_s = time.monotonic() - synced
            io = self._io(inst)
            read, written = counters.io_delta_bytes({d: start.io[d] for d in devices}, io)
            requests = counters.io_delta_requests({d: start.io[d] for d in devices}, io)
            front = [d for d in start.io if d not in devices]
            f_read, f_written = counters.io_delta_bytes({d: start.io[d] for d in front}, io)
            deltas[op] = {
                **counters.cpu_delta_s(start.cpu, cpu),
                "backing_bytes_read": read,
                "backing_bytes_written": written,
                # requests the backing devices completed (their /sys/block stat): on a throttled
                # target each paid the per-request latency; flushes sealed what zbd or the fs wrote
                "backing_read_requests": requests["read_requests"],
                "backing_write_requests": requests["write_requests"],
                "backing_flushes": requests["flushes"],
                "frontend_bytes_read": f_read if front else None,
                "frontend_bytes_written": f_written if front else None,
                "wall_s": time.monotonic() - start.t,
                # what the operation left dirty took this long to reach the devices (not in its time)
                "sync_s": sync_s,
                "loadavg_1m": os.getloadavg()[0],  # other load on the machine shows up in CPU figures
            }
            # space now, while the operation's files exist (workloads may delete them at the end)
            spaces[op] = inst.space()

        def between() -> None:
            if cold:
                cache_checks.append(self._make_cold(inst, cmds, workdir, "between operations"))

        ctx = RunContext(
            mountpoint=workdir,
            raw_dir=raw,
            data=spec.data,
            between_operations=between,
            before_operation=before,
            after_operation=after,
            memory_limit_bytes=self.study.memory_limit,
        )
        whole_before = _OpSample(counters.read_cpu(), self._io(inst), time.monotonic())
        try:
            measurements = workload.execute(unit.cell, ctx)
        except WorkloadError as exc:
            raise RunFailed(f"{unit.unit_id}: {exc}") from None
        except (OSError, RuntimeError, ValueError) as exc:
            raise RunFailed(f"{unit.unit_id}: workload {unit.workload} failed: {exc}") from None
        if not measurements:
            raise RunFailed(f"{unit.unit_id}: workload {unit.workload} returned no measurements")
        if len(measurements) == 1 and measurements[0].operation not in deltas:
            # a single-operation workload that does not call the hooks: measure the whole execution
            samples[measurements[0].operation] = whole_before
            after(measurements[0].operation)
        records = self._records(
            unit, target, spec, inst, measurements, deltas, spaces, cache_checks, raw, index, ctx.memory_usage
        )
        shutil.rmtree(workdir, ignore_errors=True)
        return records

    def _io(self, inst: TargetInstance) -> dict[str, counters.IoSample]:
        return counters.read_io_all(inst.counted_devices() + inst.frontend_devices())

    def _make_cold(self, inst: TargetInstance, cmds: Commands, workdir: Path, when: str) -> dict[str, Any]:
        """sync, unmount/remount (restarting user-space servers), drop caches, and verify."""
        restarted = inst.remount()
        dropped = cache.drop_caches(cmds)
        resident = cache.resident_bytes(cmds, workdir)
        return {"when": when, **restarted, **dropped, "resident_bytes_after": resident}

    def _records(
        self,
        unit: plan.Unit,
        target: TargetSpec,
        spec: WorkloadSpec,
        inst: TargetInstance,
        measurements: list[Measurement],
        deltas: dict[str, dict[str, Any]],
        spaces: dict[str, Space],
        cache_checks: list[dict[str, Any]],
        raw: Path,
        index: int,
        ctx_usage: list[dict[str, int]],
    ) -> list[RunRecord]:
        cell = unit.cell
        common = validity.static_warnings(self.study, target, inst.fuse_bound)
        cell_set = (cell.file_size_bytes or 0) * max(1, cell.threads)
        warm_left = [c for c in cache_checks if c.get("resident_bytes_after")]
        if warm_left:
            common.append(
                f"cache not cold: {warm_left[0]['resident_bytes_after']} bytes of the working set "
                "stayed resident"
            )
        records: list[RunRecord] = []
        seen: dict[str, int] = {}
        for m in measurements:
            seen[m.operation] = seen.get(m.operation, 0) + 1
            suffix = "" if seen[m.operation] == 1 else f"-{seen[m.operation]}"
            run_id = f"{unit.unit_id}.{plan.safe(m.operation)}{suffix}"
            d = deltas.get(m.operation, {})
            space = spaces.get(m.operation) or Space()
            run_raw = self.store.raw_dir(run_id)
            _link_raw(m.raw_files, raw, run_raw)
            for name, text in space.raw.items():
                (run_raw / name).write_text(text, encoding="utf-8")
            monitors = {"operation_counters": d, "cache_checks": cache_checks, "space": space.extra}
            self.store.write_json(f"raw/{run_id}/monitors.json", monitors)
            self.store.write_json(f"raw/{run_id}/commands.json", {"workload": m.commands})
            # a workload may know its data better than the study (postmark writes its own text)
            label = m.data_label
            warnings = list(common)
            # working set: the cell's files, else what the operation moved (personalities, postmark)
            moved = max(m.logical_bytes_written or 0, m.logical_bytes_read or 0)
            fit = validity.cache_fit(cell_set or moved or None, self.mem_available, self.study)
            if fit:
                warnings.append(fit)
            declared = spec.data.declared_ratio if not label else None
            comp = validity.compressibility(
                target, space.compression_ratio, declared, self.study.realistic_ratio
            )
            if comp:
                warnings.append(comp)
            declared_dedup = spec.data.declared_dedup_ratio if not label else None
            dedup_ratio = space.extra.get("dedup_ratio")
            dedup_warning = validity.dedup(target, dedup_ratio, declared_dedup)
            if dedup_warning:
                warnings.append(dedup_warning)
            if not d:
                warnings.append(
                    "the workload did not report this operation's start/end: no CPU or device I/O"
                )
            records.append(
                RunRecord.of(
                    m,
                    run_id=run_id,
                    target=unit.target,
                    workload=unit.workload,
                    repetition=unit.repetition,
                    file_size_bytes=cell.file_size_bytes,
                    record_size_bytes=cell.record_size_bytes,
                    threads=cell.threads,
                    cpu_user_s=d.get("cpu_user_s"),
                    cpu_system_s=d.get("cpu_system_s"),
                    cpu_iowait_s=d.get("cpu_iowait_s"),
                    elapsed_s=m.elapsed_s if m.elapsed_s is not None else d.get("wall_s"),
                    backing_bytes_written=d.get("backing_bytes_written"),
                    backing_bytes_read=d.get("backing_bytes_read"),
                    physical_bytes_used=space.physical_bytes_used,
                    data_bytes_stored=space.data_bytes_stored,
                    compression_ratio=space.compression_ratio,
                    declared_compressibility=declared,
                    data_kind=label or spec.data.label,
                    cache_policy=self.study.cache,
                    discarded=unit.discarded,
                    warnings=warnings,
                    extra={
                        **m.extra,
                        **_memory_usage(ctx_usage),
                        "cell_key": cell.key,
                        "cell_params": cell.params,
                        "instance": inst.ident,
                        "raw_dir": f"raw/{run_id}",
                        "unit_raw_dir": f"raw/{unit.unit_id}",
                        "ratio_source": space.extra.get("ratio_source"),
                        # what the backing images hold after fstrim, metadata included
                        "backing_allocated_bytes": space.extra.get("backing_allocated_bytes"),
                        "frontend_bytes_read": d.get("frontend_bytes_read"),
                        "frontend_bytes_written": d.get("frontend_bytes_written"),
                        "backing_read_requests": d.get("backing_read_requests"),
                        "backing_write_requests": d.get("backing_write_requests"),
                        "backing_flushes": d.get("backing_flushes"),
                        "sync_s": d.get("sync_s"),
                        **_cache_drop(cache_checks),
                    },
                    unit_id=unit.unit_id,
                    target_kind=target.kind,
                    compression=target.compression_label,
                    fuse_bound=inst.fuse_bound,
                    order_index=index,
                    declared_dedup_ratio=declared_dedup,
                    dedup_ratio=dedup_ratio,
                )
            )
        return records

    def _finish_warnings(self) -> list[str]:
        rows = self.store.read_rows()
        study_level = validity.variation(rows)
        self.store.write_json("warnings.json", {"study": study_level})
        per_row: dict[str, int] = {}
        for r in rows:
            for w in r.get("warnings") or []:
                key = f"{r['target']}: {w}"
                per_row[key] = per_row.get(key, 0) + 1
        lines = [f"{w}  [{n} run(s)]" for w, n in per_row.items()]
        lines += [s["warning"] for s in study_level]
        return lines


def _cache_drop(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """The page-cache drop before the run, as record fields: how much the host had cached and
    how much was left after `echo 3 > drop_caches` (empty when the run's cache was not dropped)."""
    first = next((c for c in checks if "cached_before_bytes" in c), None)
    if first is None:
        return {}
    return {
        "cache_dropped": True,
        "cached_before_drop_bytes": first["cached_before_bytes"],
        "cached_after_drop_bytes": first["cached_after_bytes"],
    }


def _memory_usage(usage: list[dict[str, int]]) -> dict[str, int]:
    """The unit's memory-limited tool runs in one: the highest peak and every time the limit was hit."""
    if not usage:
        return {}
    return {
        "memory_limit_bytes": usage[0]["memory_limit_bytes"],
        "memory_peak_bytes": max(u.get("memory_peak_bytes", 0) for u in usage),
        "memory_limit_hits": sum(u.get("memory_limit_hits", 0) for u in usage),
        "memory_oom_kills": sum(u.get("memory_oom_kills", 0) for u in usage),
    }


def _link_raw(files: list[Path], unit_raw: Path, run_raw: Path) -> None:
    for f in files:
        src = Path(f)
        if not src.is_absolute():
            src = unit_raw / src
        if not src.is_file():
            continue
        dst = run_raw / src.name
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


def _target_options(t: TargetSpec) -> dict[str, Any]:
    return {
        "fs": t.fs,
        "kind": t.kind,
        "size_bytes": t.size_bytes,
        "devices": t.devices,
        "mkfs_options": list(t.mkfs_options),
        "mount_options": list(t.mount_options),
        "compression": t.compression_label,
        "btrfs_compress": t.compress,
        "btrfs_compress_force": t.compress_force,
        "btrfs_raid": t.raid,
        "btrfs_metadata_raid": t.metadata_raid,
        "zfs_layout": t.layout if t.fs == "zfs" else None,
        "zfs_compression": t.compression if t.fs == "zfs" else None,
        "zfs_dedup": t.dedup if t.fs == "zfs" else None,
        "zfs_recordsize_bytes": t.recordsize_bytes,
        "zbd": (
            {
                "codec": t.zbd.codec,
                "extent_size_bytes": t.zbd.extent_size_bytes,
                "logical_size_bytes": t.zbd.logical_size_bytes,
            }
            if t.zbd
            else None
        ),
        "transport": t.transport,
        "server_cache": t.server_cache if (t.zbd or t.transport) else None,
        "real_devices": list(t.real_devices),
        "throttle": t.throttle.as_dict() if t.throttle else None,
    }
