"""`zbdlab compare`."""

from __future__ import annotations

import click


@click.command(name="compare")
def command() -> None:
    """Not implemented yet."""
    raise click.ClickException("zbdlab compare is not implemented yet")
