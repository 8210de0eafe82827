"""`zbdlab reproduce [--quick] [--only NAME] -o DIR`: the seeds' headline figures, ours beside theirs."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from zbdlab.app import EXIT_FAILED, UserError


@click.command(name="reproduce")
@click.option(
    "-o",
    "--output",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Directory for the runs and DIR/reproduction.md + .html; rerunning continues where it stopped.",
)
@click.option("--quick", is_flag=True, help="Reduced sizes: the whole set in about 15 minutes.")
@click.option(
    "--only", multiple=True, metavar="NAME", help="Run only this reproduction (repeatable), e.g. 002-table1."
)
@click.option("--list", "list_only", is_flag=True, help="List the reproductions and exit.")
def command(directory: Path | None, quick: bool, only: tuple[str, ...], list_only: bool) -> None:
    """Regenerate every headline figure of the seeds and set ours beside the published numbers."""
    from zbdlab.reproduce import pipeline
    from zbdlab.reproduce.render import time_total
    from zbdlab.runner.execute import Interrupted

    if list_only:
        for entry in pipeline.ENTRIES:
            click.echo(f"{entry.name:18} {entry.title}")
        return
    if directory is None:
        click.echo("zbdlab reproduce: -o DIR is required (where the runs and the pages go)", err=True)
        sys.exit(2)
    try:
        md, page, outcomes = pipeline.reproduce(
            directory, quick, only, pipeline.command_line(sys.argv[1:]), say=lambda m: click.echo(m, err=True)
        )
    except UserError as exc:
        click.echo(str(exc), err=True)
        sys.exit(exc.exit_code)
    except (Interrupted, KeyboardInterrupt) as exc:
        # the running study was stopped and tore its devices down (Context.study); finished figures stay
        click.echo(f"zbdlab reproduce: interrupted ({exc or 'SIGINT'}); the same command resumes", err=True)
        sys.exit(130)
    # each figure's wall time, so a reader sees where the time of the set went
    for o in outcomes:
        click.echo(f"{o.name:18} {o.elapsed_s:7.0f} s  {o.verdict}", err=True)
    click.echo(f"wall time: {time_total(outcomes)}", err=True)
    click.echo(f"{md}\n{page}")
    # the exit status is about this invocation's figures, not older ones the pages also show
    selected = {e.name for e in pipeline.select(only)}
    if any(o.error for o in outcomes if o.name in selected):
        sys.exit(EXIT_FAILED)
