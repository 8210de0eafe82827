"""Fixtures for the study runner's tests: root + real loop devices, and leak checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
LAB = HERE.parents[1]
sys.path.insert(0, str(HERE))  # run_tinyload, for in-process runs


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (loop devices, mkfs, mount)")
    for item in items:
        if "needs_root" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_root: uses loop devices, mkfs and mount")


def zbdlab_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


def zbdlab_argv(*args: str) -> list[str]:
    return [sys.executable, "-c", "from zbdlab.cli import main; main()", *args]


def run_zbdlab(*args: str) -> subprocess.CompletedProcess[str]:
    """`zbdlab ARGS...` in a child process (so signals, exit codes and cleanup are real)."""
    return subprocess.run(zbdlab_argv(*args), env=zbdlab_env(), capture_output=True, text=True)


def start_zbdlab(*args: str) -> subprocess.Popen[str]:
    """`zbdlab ARGS...` started in a child process, to be signalled while it runs."""
    return subprocess.Popen(
        zbdlab_argv(*args), env=zbdlab_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def mounts_under(path: Path) -> list[str]:
    prefix = str(path)
    with open("/proc/self/mounts", encoding="utf-8") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(prefix)]


def loops_over(images: list[str]) -> list[str]:
    """Loop devices still attached to any of these image files (losetup -j)."""
    out = []
    for image in images:
        proc = subprocess.run(["losetup", "-j", image], capture_output=True, text=True)
        out += [line for line in proc.stdout.splitlines() if line.strip()]
    listed = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    out += [line for line in listed.splitlines() if any(img in line for img in images)]
    return out


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A scratch dir for images; fails the test if anything is still mounted or attached under it."""
    path = tmp_path / "scratch"
    path.mkdir()
    yield path
    leaked_mounts = mounts_under(path)
    for m in reversed(leaked_mounts):
        subprocess.run(["umount", "-l", m], check=False)
    images = [str(p) for p in path.rglob("*.img")]
    leaked_loops = loops_over(images) if images else []
    for line in leaked_loops:
        subprocess.run(["losetup", "-d", line.split(":", 1)[0]], check=False)
    assert not leaked_mounts, f"left mounted: {leaked_mounts}"
    assert not leaked_loops, f"left attached: {leaked_loops}"
