"""The study runner: plan the runs, provision targets, execute workloads, record every run."""

from zbdlab.runner.execute import Runner, RunOutcome

__all__ = ["RunOutcome", "Runner"]
