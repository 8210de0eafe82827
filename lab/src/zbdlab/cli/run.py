"""`zbdlab run STUDY.toml [-o RESULTS_DIR] [--resume]`: provision, measure, record."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from rich.markup import escape

from zbdlab.app import EXIT_FAILED, UserError, console
from zbdlab.config import load_study


def _say(message: str) -> None:
    """Errors go to stderr as plain, unwrapped lines (one problem, one line)."""
    click.echo(message, err=True)


@click.command(name="run")
@click.argument("study_file", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "-o",
    "--output",
    "results_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Results directory (default: results/<study>-<time>).",
)
@click.option(
    "--report/--no-report",
    default=True,
    help="Compare the targets with `zbdlab report` into RESULTS_DIR/report at the end (default: on).",
)
@click.option(
    "--resume", is_flag=True, help="Continue an interrupted run in -o RESULTS_DIR, skipping recorded runs."
)
def command(study_file: Path, results_dir: Path | None, resume: bool, report: bool) -> None:
    """Run the study described in STUDY_FILE and record every run in the results directory."""
    from zbdlab.runner import Runner
    from zbdlab.runner.execute import Interrupted, RunFailed
    from zbdlab.runner.summary import generate_report

    try:
        study = load_study(study_file)
        if results_dir is None:
            if resume:
                raise UserError("--resume needs -o RESULTS_DIR (the directory of the interrupted run)")
            results_dir = Path("results") / f"{study.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        runner = Runner(study, results_dir, resume=resume, console=console)
        outcome = runner.run()
    except UserError as exc:
        _say(f"zbdlab run: {exc}")
        sys.exit(exc.exit_code)
    except RunFailed as exc:
        _say(f"zbdlab run: run failed: {exc}")
        _say(f"zbdlab run: everything created was torn down; finished runs are in {results_dir}")
        sys.exit(EXIT_FAILED)
    except (Interrupted, KeyboardInterrupt) as exc:
        _say(f"zbdlab run: interrupted ({exc or 'SIGINT'}); torn down. Continue with:")
        _say(f"  zbdlab run {study_file} -o {results_dir} --resume")
        sys.exit(130)
    except Exception as exc:  # a bug or an unexpected tool failure: one line, cleanup already ran
        _say(f"zbdlab run: failed: {type(exc).__name__}: {exc}")
        sys.exit(EXIT_FAILED)
    for warning in outcome.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    generate_report(outcome.results_dir, console, compare=report)
    console.print(
        f"{outcome.done} unit(s) run, {outcome.skipped} skipped as already recorded; "
        f"results in {outcome.results_dir}"
    )
