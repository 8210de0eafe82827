"""SIGINT/SIGTERM during a study: raise so cleanup unwinds; during cleanup: note and carry on.

A step that must not be cut in two (starting a child whose kill and wait the caller then owns) runs
`held()`: a signal in it is raised when the step is done.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _handled(handler: Callable[[int, Any], None]) -> Iterator[None]:
    old = {s: signal.signal(s, handler) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


_held = 0
_pending: BaseException | None = None


@contextmanager
def held() -> Iterator[None]:
    """Hold the exception of a signal that lands here until the block is done.

    Why: `subprocess.Popen` forks, execs and only then returns. An exception raised between the fork
    and the return leaves a child nobody kills or waits for: a `mount` that completes after cleanup
    looked, leaving the filesystem mounted over a detached loop device.
    """
    global _held, _pending
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if _held == 0 and _pending is not None:
            pending, _pending = _pending, None
            raise pending


def raising(exc_type: type[BaseException]) -> Any:
    """The first signal raises `exc_type` in the main thread (at the end of a `held()` block, if in
    one); later ones are ignored, so a second Ctrl-C cannot cut the teardown short."""

    def handler(signum: int, _frame: Any) -> None:
        global _pending
        for s in _SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        exc = exc_type(signal.Signals(signum).name)
        if _held:
            _pending = exc
            return
        raise exc

    return _handled(handler)


def deferred(console: Console) -> Any:
    """While tearing down: say that cleanup is under way, and go on with it."""

    def handler(signum: int, _frame: Any) -> None:
        console.print(f"[yellow]{signal.Signals(signum).name}: cleaning up, please wait[/]")

    return _handled(handler)
