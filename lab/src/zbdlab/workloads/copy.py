"""Copies: the theses' large sequential `dd ... conv=fsync` of N bytes of the declared data, and a
copy of a real file tree (`cp -a` or a tar pipe) followed by `sync -f` on the target.

The dd source is staged first, unmeasured, outside the target (on /dev/shm by default): synthetic data
is written there by fio with the declared compressibility; corpus data is the corpus files
concatenated in path order (repeated if the corpus is smaller than N).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbdlab.corpus import data_dir
from zbdlab.workloads.base import Cell, Measurement, RunContext, WorkloadConfigError, WorkloadError
from zbdlab.workloads.config import Table, format_size
from zbdlab.workloads.fio import JobFile, data_options, run_fio
from zbdlab.workloads.tool import run_measured

COPY_OPERATIONS = ("dd", "tree")
_DD_RE = re.compile(r"^(\d+) bytes .* copied, ([\d.]+) s", re.MULTILINE)


def default_staging_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


@dataclass
class CopyWorkload:
    name: str
    operations: list[str]
    dd_size: int = 256 << 20
    dd_block: int = 1 << 20
    tree_source: str = "corpus"  # "corpus" (ctx.data.corpus_dir) or a directory path
    tree_method: str = "cp"  # "cp" (cp -a) or "tar" (tar -c | tar -x)
    staging_dir: Path | None = None
    keep_files: bool = False
    data_kinds: tuple[str, ...] = ("synthetic", "corpus")

    def cells(self) -> list[Cell]:
        return [
            Cell(
                file_size_bytes=self.dd_size,
                record_size_bytes=self.dd_block,
                params={"copy": "+".join(self.operations)},
            )
        ]

    def execute(self, cell: Cell, ctx: RunContext) -> list[Measurement]:
        workdir = ctx.mountpoint / self.name
        workdir.mkdir(parents=True, exist_ok=True)
        results = []
        for i, op in enumerate(self.operations):
            if i:
                ctx.between_operations()
            results.append(self._dd(cell, ctx, workdir) if op == "dd" else self._tree(ctx, workdir))
        if not self.keep_files:
            shutil.rmtree(workdir, ignore_errors=True)
        return results

    # -- dd -----------------------------------------------------------------------------------
    def _dd(self, cell: Cell, ctx: RunContext, workdir: Path) -> Measurement:
        staging = Path(tempfile.mkdtemp(prefix="zbdlab-dd-", dir=self.staging_dir or default_staging_dir()))
        try:
            source = self._stage_source(cell, ctx, staging)
            target = workdir / "dd.bin"
            argv = [
                "dd", f"if={source}", f"of={target}", f"bs={self.dd_block}", f"count={self.dd_size}",
                "iflag=fullblock,count_bytes", "conv=fsync",
            ]  # fmt: skip
            proc, wall_s = _timed(argv, ctx, "copy_dd")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        raw = _save(ctx, "copy_dd", argv, proc)
        match = _DD_RE.search(proc.stderr)
        if match is None:
            raise WorkloadError(f"dd printed no transfer summary; output in {raw[0]}")
        copied, dd_s = int(match.group(1)), float(match.group(2))
        if copied != self.dd_size:
            raise WorkloadError(f"dd copied {copied} bytes, expected {self.dd_size}")
        return Measurement(
            operation="copy_dd",
            throughput_bytes_per_s=copied / dd_s if dd_s > 0 else None,
            elapsed_s=dd_s,
            logical_bytes_written=copied,
            logical_bytes_read=copied,
            commands=[argv],
            raw_files=raw,
            extra={"wall_s": wall_s, "note": "elapsed is dd's own time, fsync included (conv=fsync)"},
        )

    def _stage_source(self, cell: Cell, ctx: RunContext, staging: Path) -> Path:
        source = staging / "source.bin"
        if ctx.data.kind == "synthetic":
            job = JobFile({"ioengine": "psync", "thread": True, **data_options(ctx.data)})
            job.add(
                "stage",
                {"filename": str(source), "rw": "write", "bs": "1m", "size": format_size(self.dd_size)},
            )
            run_fio(job, f"{cell.key}-copy_dd-stage", ctx, None)
        elif ctx.data.kind == "corpus" and ctx.data.corpus_dir is not None:
            _concatenate(data_dir(ctx.data.corpus_dir), source, self.dd_size)
        else:
            raise WorkloadError(f"copy dd needs synthetic or corpus data, not {ctx.data.label!r}")
        return source

    # -- tree ---------------------------------------------------------------------------------
    def _tree(self, ctx: RunContext, workdir: Path) -> Measurement:
        source, label = self._tree_source(ctx)
        target = workdir / "tree"
        shutil.rmtree(target, ignore_errors=True)
        if self.tree_method == "cp":
            argvs = [["cp", "-a", "--", str(source), str(target)]]
        else:
            target.mkdir(parents=True)
            argvs = [["tar", "-C", str(source), "-cf", "-", "."], ["tar", "-C", str(target), "-xf", "-"]]
        sync_argv = ["sync", "-f", str(workdir)]
        ctx.before_operation("copy_tree")
        started = time.monotonic()
        try:
            outputs = _run_pipeline(argvs)
            sync = subprocess.run(sync_argv, capture_output=True, text=True, check=False)
        finally:
            wall_s = time.monotonic() - started
            ctx.after_operation("copy_tree")
        log = ctx.raw_dir / "copy_tree.out"
        stages = outputs + [(sync.returncode, sync.stderr)]
        log.write_text(
            "".join(
                f"$ {' '.join(a)}\n[exit {c}] {e}\n"
                for a, (c, e) in zip(argvs + [sync_argv], stages, strict=True)
            )
        )
        if any(code for code, _ in stages):
            raise WorkloadError(f"copying {source} failed; output in {log}")
        files, size = _tree_bytes(source)
        return Measurement(
            operation="copy_tree",
            throughput_bytes_per_s=size / wall_s if wall_s > 0 else None,
            elapsed_s=wall_s,
            logical_bytes_written=size,
            logical_bytes_read=size,
            commands=argvs + [sync_argv],
            raw_files=[log],
            data_label=label,
            extra={"files": files, "method": self.tree_method, "source": str(source)},
        )

    def _tree_source(self, ctx: RunContext) -> tuple[Path, str | None]:
        if self.tree_source == "corpus":
            if ctx.data.kind != "corpus" or ctx.data.corpus_dir is None:
                raise WorkloadError(f'copy tree_source="corpus" needs corpus data, not {ctx.data.label!r}')
            return data_dir(ctx.data.corpus_dir), None
        path = Path(self.tree_source)
        if not path.is_dir():
            raise WorkloadError(f"copy tree_source {path} is not a directory")
        return path, f"tree:{path}"


def _timed(argv: list[str], ctx: RunContext, op: str) -> tuple[subprocess.CompletedProcess[str], float]:
    proc, wall_s = run_measured(argv, ctx, op)
    if proc.returncode != 0:
        raise WorkloadError(f"{argv[0]} failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
    return proc, wall_s


def _save(ctx: RunContext, stem: str, argv: list[str], proc: subprocess.CompletedProcess[str]) -> list[Path]:
    out = ctx.raw_dir / f"{stem}.out"
    out.write_text(f"$ {' '.join(argv)}\n{proc.stdout}{proc.stderr}")
    return [out]


def _run_pipeline(argvs: list[list[str]]) -> list[tuple[int, str]]:
    """Run argv[0] | argv[1] | ...; return each stage's exit code and stderr."""
    procs: list[subprocess.Popen[bytes]] = []
    previous = None
    for i, argv in enumerate(argvs):
        last = i == len(argvs) - 1
        proc = subprocess.Popen(
            argv,
            stdin=previous,
            stdout=subprocess.DEVNULL if last else subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        if previous is not None:
            previous.close()  # the next stage owns the pipe now
        previous = proc.stdout
        procs.append(proc)
    results = []
    for proc in procs:
        _, err = proc.communicate()
        results.append((proc.returncode, err.decode(errors="replace")))
    return results


def _tree_bytes(root: Path) -> tuple[int, int]:
    """Regular files (not symlinks) under root and their total size."""
    files = size = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            if path.is_file() and not path.is_symlink():
                files += 1
                size += path.stat().st_size
    return files, size


def _concatenate(corpus: Path, target: Path, size: int) -> None:
    files = sorted(p for p in corpus.rglob("*") if p.is_file() and not p.is_symlink())
    if sum(p.stat().st_size for p in files) == 0:
        raise WorkloadError(f"corpus {corpus} holds no data")
    left = size
    with target.open("wb") as out:
        while left:
            for path in files:
                with path.open("rb") as f:
                    while left and (chunk := f.read(min(left, 1 << 20))):
                        out.write(chunk)
                        left -= len(chunk)
                if not left:
                    break


def from_config(name: str, table: dict[str, Any]) -> CopyWorkload:
    t = Table(table)
    operations = t.choices("operations", list(COPY_OPERATIONS), COPY_OPERATIONS)
    dd_size = t.size("dd_size", "256M")
    dd_block = t.size("dd_block", "1M")
    tree_source = t.string("tree_source", "corpus") or "corpus"
    tree_method = t.choice("tree_method", "cp", ("cp", "tar"))
    staging = t.string("staging_dir", None)
    keep_files = t.boolean("keep_files", False)
    t.done()
    if tree_source != "corpus" and not Path(tree_source).is_absolute():
        raise WorkloadConfigError(
            "tree_source", f'must be "corpus" or an absolute directory, got {tree_source!r}'
        )
    return CopyWorkload(
        name=name,
        operations=operations,
        dd_size=dd_size,
        dd_block=dd_block,
        tree_source=tree_source,
        tree_method=tree_method,
        staging_dir=Path(staging) if staging else None,
        keep_files=keep_files,
    )
