"""`zbdlab bench [--quick] [--only GROUP]... [-o DIR]`: every benchmark of `make bench`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from zbdlab.app import EXIT_FAILED, UserError, repo_root, zbd_binary
from zbdlab.bench.settings import ALL_GROUPS, DEFAULT_GROUPS, GROUPS

ROOTLESS_GROUPS = {
    "engine",
    "builtin",
    "scale",
    "latency",
    "metrics",
    "dedup-index",
    "dedup-write",
}  # the others mount, attach or loop


@click.command(name="bench")
@click.option("--quick", is_flag=True, help="Fewer rounds on smaller devices (a smoke run while developing).")
@click.option(
    "--only",
    "only",
    multiple=True,
    type=click.Choice(ALL_GROUPS),
    help="Run only this group (repeatable; default: every group but rados-ab; --quick: the ratio groups "
    "engine, nbd-fast, nbd-slow and fs).",
)
@click.option("--rounds", type=click.IntRange(1, 100), help="Rounds per group (default 5; --quick 3).")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, file_okay=False),
    help="Results directory (default: bench/results/<date>-<commit>-<groups>; the tools' raw output "
    "goes to bench/raw/<same name>, ignored by git).",
)
@click.option(
    "--zbd",
    "zbd",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="The zbd binary to measure (default: $ZBD_BIN, else target/release/zbd).",
)
@click.option(
    "--base-zbd",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="A second zbd binary (e.g. main's) measured in the same rounds: engine, NBD and latency "
    "figures 'this / base' (and the group rados-ab).",
)
@click.option(
    "--rerender",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    help="Measure nothing: write RERENDER/summary.md again from its figures.json.",
)
@click.option(
    "--work-dir",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    help="Directory on the disk to measure (default: /var/tmp).",
)
def command(
    quick: bool,
    only: tuple[str, ...],
    rounds: int | None,
    output: Path | None,
    zbd: Path | None,
    base_zbd: Path | None,
    rerender: Path | None,
    work_dir: Path | None,
) -> None:
    """Measure zbd as same-run ratios in alternating rounds, check the targets, run the other
    benchmarks (scripts/bench-*.sh), write the results."""
    from zbdlab import signals
    from zbdlab.bench.report import rerender as render_again
    from zbdlab.bench.run import run_bench
    from zbdlab.bench.settings import Settings
    from zbdlab.runner.execute import Interrupted

    if rerender:
        click.echo(render_again(rerender, Settings().confidence).read_text())
        return
    settings = Settings.quick() if quick else Settings()
    if rounds:
        settings.rounds = rounds
    if work_dir:
        settings.work_dir = work_dir
    if base_zbd:
        settings.base_zbd = str(base_zbd.resolve())
    binary = str(zbd.resolve()) if zbd else zbd_binary()
    try:
        if binary is None:
            raise UserError("no zbd binary (build it with `cargo build --release` or pass --zbd)")
        groups = list(only or (GROUPS if quick else DEFAULT_GROUPS))
        if os.geteuid() != 0 and (needs_root := sorted(set(groups) - ROOTLESS_GROUPS)):
            raise UserError(
                f"groups {', '.join(needs_root)} need root (loop devices, mounts); try --only engine"
            )
        # SIGTERM like Ctrl-C: the groups' loop devices, mounts and servers are undone by their
        # `finally`s, which a process killed by the default SIGTERM action never runs
        with signals.raising(Interrupted):
            summary, failed = run_bench(binary, settings, groups, repo_root(), output, click.echo)
    except (Interrupted, KeyboardInterrupt) as exc:
        click.echo(f"zbdlab bench: interrupted ({exc or 'SIGINT'}); cleaned up", err=True)
        sys.exit(130)
    except UserError as exc:
        click.echo(f"zbdlab bench: {exc}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:  # a tool failed mid-run: one line; every group cleaned up after itself
        click.echo(f"zbdlab bench: failed: {type(exc).__name__}: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    click.echo(summary.read_text())
    click.echo(f"results: {summary.parent}")
    if failed:
        # The other groups' figures are written; the run as a whole did not do what was asked.
        click.echo(f"zbdlab bench: group failed: {', '.join(failed)} (why: notes in {summary})", err=True)
        sys.exit(EXIT_FAILED)
