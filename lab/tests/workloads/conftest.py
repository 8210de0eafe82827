"""Fixtures for the workload tests: a small ext4 on a loop device this session creates (and always
detaches), and RunContexts that record the runner hooks."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from zbdlab.workloads.base import DataSpec, RunContext

IMAGE_BYTES = 768 << 20


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="session")
def ext4_mount() -> Iterator[Path]:
    """A fresh ext4 on a loop device over a sparse image; unmounted and detached even on failure."""
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: run scripts/install-deps.sh")
    if os.geteuid() != 0:
        pytest.skip("loop devices need root (CI runs as root)")
    workdir = Path(tempfile.mkdtemp(prefix="zbdlab-wl-", dir="/var/tmp"))
    image = workdir / "ext4.img"
    mountpoint = workdir / "mnt"
    mountpoint.mkdir()
    with image.open("wb") as f:
        f.truncate(IMAGE_BYTES)
    device = None
    mounted = False
    try:
        _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image))
        device = _run("losetup", "--find", "--show", str(image))
        _run("mount", "-t", "ext4", device, str(mountpoint))
        mounted = True
        yield mountpoint
    finally:
        if mounted:
            subprocess.run(["umount", str(mountpoint)], check=False)
        if device:
            subprocess.run(["losetup", "-d", device], check=False)
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Hooks:
    """Records the runner hooks in the order the workload called them."""

    calls: list[str] = field(default_factory=list)

    def between(self) -> None:
        self.calls.append("between")

    def before(self, op: str) -> None:
        self.calls.append(f"before:{op}")

    def after(self, op: str) -> None:
        self.calls.append(f"after:{op}")


CtxFactory = Callable[[Path, DataSpec], tuple[RunContext, Hooks]]


@pytest.fixture
def make_ctx(tmp_path: Path) -> CtxFactory:
    """make_ctx(mountpoint, data) -> (RunContext with a fresh raw dir under tmp_path, its Hooks)."""
    counter = iter(range(1_000_000))

    def make(mountpoint: Path, data: DataSpec) -> tuple[RunContext, Hooks]:
        raw_dir = tmp_path / f"raw{next(counter)}"
        raw_dir.mkdir()
        hooks = Hooks()
        ctx = RunContext(
            mountpoint=mountpoint,
            raw_dir=raw_dir,
            data=data,
            between_operations=hooks.between,
            before_operation=hooks.before,
            after_operation=hooks.after,
        )
        return ctx, hooks

    return make


@pytest.fixture
def ext4_dir(ext4_mount: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A directory of its own on the shared ext4, removed after the test."""
    path = ext4_mount / request.node.name.replace("[", "_").replace("]", "_")
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
