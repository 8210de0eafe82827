"""`zbdlab corpus`."""

from __future__ import annotations

import click


@click.command(name="corpus")
def command() -> None:
    """Not implemented yet."""
    raise click.ClickException("zbdlab corpus is not implemented yet")
