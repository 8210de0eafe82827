"""`zbdlab run`."""

from __future__ import annotations

import click


@click.command(name="run")
def command() -> None:
    """Not implemented yet."""
    raise click.ClickException("zbdlab run is not implemented yet")
