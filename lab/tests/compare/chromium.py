"""Headless Chromium helpers for the report tests: dump the DOM after load, capture console messages,
take a screenshot. Each call gets its own temporary profile directory, removed afterwards."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_CONSOLE = re.compile(r"CONSOLE[:(]\d+\)?\] (.*)")


def run_chromium(binary: str, page: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="zbdlab-chromium-") as profile:
        return subprocess.run(
            [binary, *FLAGS, f"--user-data-dir={profile}", *extra, page.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )


def dump_dom(binary: str, page: Path) -> tuple[str, list[str]]:
    """The DOM after the load event, and every console message Chromium logged while loading."""
    result = run_chromium(binary, page, "--enable-logging=stderr", "--v=0", "--dump-dom")
    messages = [m.group(1) for m in _CONSOLE.finditer(result.stderr)]
    return result.stdout, messages


def screenshot(binary: str, page: Path, out: Path, width: int = 1300, height: int = 2400) -> None:
    run_chromium(binary, page, f"--window-size={width},{height}", f"--screenshot={out}")
