"""`zbdlab report`: compare the sets held in zbdlab results directories.

Which sets (documented in docs/compare.md):
  * one results directory holding several targets: each target is a set, in the study's target order
    (first = baseline);
  * several results directories, each with one target: each directory is a set, named by its study
    name (or the directory name when study names repeat), first = baseline;
  * several directories where some hold several targets: each (directory, target) is a set named
    `<dir>/<target>`, in command-line then study order.
"""

from __future__ import annotations

from pathlib import Path

import click

from zbdlab.cli.compare import analysis_options, run_comparison
from zbdlab.parsers import DataSet, InputError
from zbdlab.parsers.results import ResultsDir, load_results_dir, results_to_set

# environment.json keys that legitimately differ between runs of the same machine.
_VOLATILE = {"timestamp", "date", "started", "finished", "start_time", "end_time", "uptime", "duration_s"}


def _unique(names: list[str], fallback: list[str]) -> list[str]:
    if len(set(names)) == len(names):
        return names
    if len(set(fallback)) == len(fallback):
        return fallback
    return [f"{n}#{i + 1}" for i, n in enumerate(fallback)]


def _environment_warnings(dirs: list[ResultsDir]) -> list[str]:
    base = dirs[0]
    out = []
    for other in dirs[1:]:
        differing = sorted(
            k
            for k in set(base.environment) & set(other.environment)
            if k not in _VOLATILE
            and not isinstance(base.environment[k], dict | list)
            and base.environment[k] != other.environment[k]
        )
        if differing:
            out.append(
                f"environment of {other.path} differs from {base.path} in: {', '.join(differing)} "
                "(differences may come from the machine, not the targets)"
            )
    return out


def sets_from_dirs(dirs: list[ResultsDir]) -> list[DataSet]:
    if len(dirs) == 1:
        only = dirs[0]
        if len(only.targets) < 2:
            raise click.UsageError(
                f"{only.path} holds one target ({', '.join(only.targets)}); give a second results directory"
            )
        return [results_to_set(only, target, target) for target in only.targets]
    if all(len(d.targets) == 1 for d in dirs):
        names = _unique([d.study_name for d in dirs], [d.path.name for d in dirs])
        return [results_to_set(d, name) for d, name in zip(dirs, names, strict=True)]
    prefixes = _unique([d.path.name for d in dirs], [str(d.path) for d in dirs])
    return [results_to_set(d, f"{p}/{t}", t) for d, p in zip(dirs, prefixes, strict=True) for t in d.targets]


@click.command(name="report")
@click.argument("results_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@analysis_options
def command(results_dirs: tuple[Path, ...], output: Path, detail: str | None, **raw: object) -> None:
    """Report on zbdlab results directories: one directory with several targets (each target is a
    set) or several directories (each is a set). The first is the baseline."""
    try:
        dirs = [load_results_dir(path) for path in results_dirs]
        sets = sets_from_dirs(dirs)
    except InputError as exc:
        raise click.ClickException(str(exc)) from None
    sets[0].warnings.extend(_environment_warnings(dirs))
    run_comparison(sets, output, detail, **raw)
