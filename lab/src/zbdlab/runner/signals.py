"""SIGINT/SIGTERM during a study: raise so cleanup unwinds; during cleanup: note and carry on."""

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


def raising(exc_type: type[BaseException]) -> Any:
    """The first signal raises `exc_type` in the main thread; later ones are ignored, so a second
    Ctrl-C cannot cut the teardown short."""

    def handler(signum: int, _frame: Any) -> None:
        for s in _SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        raise exc_type(signal.Signals(signum).name)

    return _handled(handler)


def deferred(console: Console) -> Any:
    """While tearing down: say that cleanup is under way, and go on with it."""

    def handler(signum: int, _frame: Any) -> None:
        console.print(f"[yellow]{signal.Signals(signum).name}: cleaning up, please wait[/]")

    return _handled(handler)
