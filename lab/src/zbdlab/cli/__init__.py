"""The `zbdlab` command: one module per subcommand, assembled here."""

from __future__ import annotations

import click

from zbdlab import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="zbdlab")
def main() -> None:
    """Measure zbd against filesystem compression, and compare result sets."""


def _register() -> None:
    # Each subcommand lives in its own module and is attached here, so adding one never edits another.
    from zbdlab.cli import bench, compare, corpus, report, reproduce, run

    for module in (run, compare, report, corpus, reproduce, bench):
        main.add_command(module.command)


_register()
