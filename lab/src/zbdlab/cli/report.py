"""`zbdlab report`."""

from __future__ import annotations

import click


@click.command(name="report")
def command() -> None:
    """Not implemented yet."""
    raise click.ClickException("zbdlab report is not implemented yet")
