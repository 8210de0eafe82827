"""Application-wide plumbing: the console, user errors, and where things live."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from rich.console import Console

# Logs and `make demo` output are not terminals: give tables room instead of rich's 80 columns.
console = Console(stderr=False, highlight=False, width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, highlight=False)

# Exit codes: 0 ok, 1 a run failed or was interrupted, 2 the study file or command line is wrong.
EXIT_FAILED = 1
EXIT_USAGE = 2


class UserError(Exception):
    """A problem the user can fix (bad study file, missing tool). Printed as one line, no traceback."""

    exit_code = EXIT_USAGE


class HostError(UserError):
    """This host lacks something the study needs (a tool, kernel feature)."""


def repo_root() -> Path:
    """The repository root (lab/src/zbdlab/app.py -> four levels up)."""
    return Path(__file__).resolve().parents[3]


def zbd_binary() -> str | None:
    """The zbd binary: $ZBD_BIN, else target/release/zbd under the repo, else PATH."""
    env = os.environ.get("ZBD_BIN")
    if env and Path(env).is_file() and os.access(env, os.X_OK):
        return env
    built = repo_root() / "target" / "release" / "zbd"
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    return shutil.which("zbd")


def require_tool(name: str, why: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise HostError(f"{name} not found on PATH (needed for {why}; run scripts/install-deps.sh)")
    return path
