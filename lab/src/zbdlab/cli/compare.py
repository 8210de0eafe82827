"""`zbdlab compare`: compare N result sets against the first (the baseline).

A set is a zbdlab results directory, an IOzone output file, a directory of repeated IOzone runs, or a
directory of repeated fio --output-format=json files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from zbdlab.parsers import DataSet, InputError, load_set

# Kept here (not imported from zbdlab.stats) so `zbdlab --help` does not pay for importing scipy.
TESTS = ("mwu", "welch")


def _fraction(text: str, flag: str) -> float:
    """'2%', '2 %' and '0.02' all mean two percent."""
    try:
        value = float(text.strip().rstrip("%")) / 100 if text.strip().endswith("%") else float(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a number or percentage", param_hint=flag) from None
    if not 0 <= value < 1:
        raise click.BadParameter(f"{text!r} must lie in [0, 1) (or 0-100 %)", param_hint=flag)
    return value


def analysis_options(function):
    """Options shared by `compare` and `report`."""
    decorators = [
        click.option(
            "-o",
            "--output",
            type=click.Path(path_type=Path),
            default=Path("compare-out"),
            show_default=True,
            help="Directory for index.html, tables/*.csv|tsv, comparison.json.",
        ),
        click.option("--detail", metavar="OP", help="Also write per-size detail pages for one operation."),
        click.option(
            "--margin",
            default="2%",
            show_default=True,
            help="Equivalence margin: smaller changes are 'no significant difference'.",
        ),
        click.option(
            "--test",
            "test",
            type=click.Choice(TESTS),
            default="mwu",
            show_default=True,
            help="Per-cell test: Mann-Whitney U (mwu) or Welch's t.",
        ),
        click.option(
            "--alpha", default="0.05", show_default=True, help="False discovery rate for per-cell tests."
        ),
        click.option(
            "--confidence", default="0.90", show_default=True, help="Confidence level of intervals."
        ),
        click.option(
            "--bootstrap",
            type=click.IntRange(100, 100000),
            default=2000,
            show_default=True,
            help="Bootstrap replicates.",
        ),
        click.option("--seed", type=int, default=1, show_default=True, help="Bootstrap seed."),
        click.option("--no-plots", is_flag=True, help="Skip the figures (faster; tables and text only)."),
    ]
    for decorator in reversed(decorators):
        function = decorator(function)
    return function


def run_comparison(sets: list[DataSet], output: Path, detail: str | None, **raw: object) -> None:
    """Analyse, write every output, print the terminal table; user errors become one-line messages."""
    # numpy, scipy and matplotlib take a second to import: only when a comparison really runs.
    from zbdlab.report.render import write_all
    from zbdlab.stats.compare import Options, analyse

    names = [s.name for s in sets]
    if len(sets) < 2:
        raise click.UsageError("need at least two sets to compare (the first is the baseline)")
    if len(set(names)) != len(names):
        raise click.UsageError(f"set names must be unique, got {', '.join(names)}")
    options = Options(
        margin=_fraction(str(raw["margin"]), "--margin"),
        confidence=_fraction(str(raw["confidence"]), "--confidence"),
        alpha=_fraction(str(raw["alpha"]), "--alpha"),
        test=str(raw["test"]),
        bootstrap=int(raw["bootstrap"]),  # type: ignore[call-overload]
        seed=int(raw["seed"]),  # type: ignore[call-overload]
    )
    analysis = analyse(sets, options)
    for message in analysis.mismatches + [w for s in sets for w in s.warnings]:
        click.echo(f"warning: {message}", err=True)
    if not analysis.primaries:
        raise click.ClickException("the sets have no cell in common; nothing to compare")
    try:
        result = write_all(analysis, output, detail, plots=not raw.get("no_plots", False))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror}") from None
    click.echo(result["terminal"], nl=False)
    click.echo(f"report: {result['html']}", err=True)
    for path in result["details"]:
        click.echo(f"detail: {path}", err=True)


def _parse_set(text: str) -> tuple[str, Path, str | None]:
    """NAME=PATH, or NAME=PATH@TARGET for one target of a results directory."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise click.BadParameter(f"{text!r} is not NAME=PATH", param_hint="--set")
    target = None
    if not Path(path).exists() and "@" in path:
        path, target = path.rsplit("@", 1)
    if not Path(path).exists():
        raise click.BadParameter(f"set {name!r}: {path} does not exist", param_hint="--set")
    return name, Path(path), target


@click.command(name="compare")
@click.option(
    "--set",
    "set_args",
    multiple=True,
    metavar="NAME=PATH",
    required=True,
    help="A set to compare (repeat; the first is the baseline).",
)
@analysis_options
def command(set_args: tuple[str, ...], output: Path, detail: str | None, **raw: object) -> None:
    """Compare result sets: IOzone outputs, fio JSON directories or zbdlab results directories.

    Each --set NAME=PATH is one set; a directory of repeated IOzone or fio runs is one set with one run
    per file; NAME=RESULTS_DIR@TARGET picks one target of a zbdlab results directory.

    Per operation the verdict comes from the geometric mean of per-cell ratios set/baseline with a
    bootstrap interval and the equivalence --margin.
    """
    sets = []
    for text in set_args:
        name, path, target = _parse_set(text)
        try:
            sets.append(load_set(name, path, target))
        except InputError as exc:
            if not sets:
                raise click.ClickException(f"baseline unusable: {exc}") from None
            click.echo(f"warning: set {name!r} dropped: {exc}", err=True)
    run_comparison(sets, output, detail, **raw)
    sys.stdout.flush()
