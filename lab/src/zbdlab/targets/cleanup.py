"""A LIFO stack of teardown steps, pushed as each resource is created.

Whatever happens (a failed tool, Ctrl-C, SIGTERM), closing the stack undoes exactly what zbdlab made,
newest first. A failing step is reported and the rest still run.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

_ids = itertools.count(1)


@dataclass
class Step:
    label: str
    undo: Callable[[], None]
    ident: int


class CleanupStack:
    def __init__(self, label: str = "zbdlab", report: Callable[[str], None] | None = None) -> None:
        self.label = label
        self.steps: list[Step] = []
        self.report = report or (lambda message: None)
        self.failures: list[str] = []

    def push(self, label: str, undo: Callable[[], None]) -> Step:
        step = Step(label, undo, next(_ids))
        self.steps.append(step)
        return step

    def scope(self, label: str) -> CleanupStack:
        """A child stack undone as one step of this one (a target instance's resources)."""
        child = CleanupStack(label, self.report)
        child._step = self.push(label, child.close)  # type: ignore[attr-defined]
        return child

    def release(self, step: Step) -> None:
        """Undo one step now (a normal teardown), removing it from the stack."""
        if step in self.steps:
            self.steps.remove(step)
            self._run(step)
        self._reraise()

    def close_scope(self, parent: CleanupStack) -> None:
        parent.release(self._step)  # type: ignore[attr-defined]

    def forget(self, step: Step) -> None:
        if step in self.steps:
            self.steps.remove(step)

    def close(self) -> None:
        while self.steps:
            self._run(self.steps.pop())
        self._reraise()

    def _run(self, step: Step) -> None:
        try:
            step.undo()
        except Exception as exc:  # keep tearing down: report and go on with the rest
            message = f"cleanup: {step.label}: {exc}"
            self.failures.append(message)
            self.report(message)
        except BaseException as exc:
            # An interrupt during an undo: finish that undo (steps are idempotent) and the rest of
            # the stack, then let the interrupt go on.
            self._pending = exc
            try:
                step.undo()
            except Exception as again:
                self.failures.append(f"cleanup: {step.label}: {again}")
                self.report(self.failures[-1])

    _pending: BaseException | None = None

    def _reraise(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            raise pending
