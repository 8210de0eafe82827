"""`zbdlab corpus build`: the mixed data corpus, identical on every machine."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from zbdlab.corpus import CorpusError
from zbdlab.corpus.build import SIZES, build
from zbdlab.corpus.fetch import default_cache_dir
from zbdlab.corpus.ratios import CODECS, UNITS, PartRatios


@click.group(name="corpus")
def command() -> None:
    """Build the data corpus (pinned PyPI files + seeded generated data)."""


@command.command(name="build")
@click.option("-o", "--output", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Corpus directory (default: ./corpus-<size>).")  # fmt: skip
@click.option("--size", type=click.Choice(sorted(SIZES)), default="small", show_default=True,
              help="small: ~32 MiB for tests and demos; full: a few hundred MiB.")  # fmt: skip
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Download cache (default: $ZBDLAB_CACHE_DIR or ~/.cache/zbdlab).")  # fmt: skip
def build_command(out: Path | None, size: str, cache_dir: Path | None) -> None:
    """Fetch, verify, unpack and generate the corpus; write its manifest and compression report."""
    console = Console(stderr=True)
    out = out or Path(f"corpus-{size}")
    try:
        with console.status("building corpus") as status:
            result = build(out, size, cache_dir or default_cache_dir(), log=lambda m: status.update(m))
    except CorpusError as e:
        raise click.ClickException(str(e)) from e
    except OSError as e:
        raise click.ClickException(f"building the corpus in {out} failed: {e}") from e
    total = int(result.manifest["total_bytes"])  # type: ignore[call-overload]
    files = len(result.manifest["files"])  # type: ignore[arg-type]
    # The table needs about 110 columns; a narrow terminal wraps lines rather than eliding ratios.
    Console(width=max(Console().width, 118)).print(
        ratio_table(result.ratios, f"corpus {out} ({size}): {files} files, {total / (1 << 20):.1f} MiB")
    )
    console.print(f"manifest: {out / 'manifest.json'}; ratios: {out / 'compression.json'}")


def ratio_table(ratios: list[PartRatios], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("part", no_wrap=True)
    table.add_column("files", justify="right")
    table.add_column("MiB", justify="right")
    for codec in CODECS:
        for unit in UNITS:
            table.add_column(f"{codec}\n{unit // 1024}K", justify="right")
    for r in ratios:
        cells = [f"{r.ratio(codec, unit):.2f}" for codec in CODECS for unit in UNITS]
        table.add_row(r.part, str(r.files), f"{r.original_bytes / (1 << 20):.1f}", *cells)
    total = PartRatios(
        part="all",
        files=sum(r.files for r in ratios),
        original_bytes=sum(r.original_bytes for r in ratios),
        stored_bytes={k: sum(r.stored_bytes[k] for r in ratios) for k in ratios[0].stored_bytes}
        if ratios
        else {},
    )
    if ratios:
        cells = [f"{total.ratio(codec, unit):.2f}" for codec in CODECS for unit in UNITS]
        table.add_row(
            "all", str(total.files), f"{total.original_bytes / (1 << 20):.1f}", *cells, style="bold"
        )
    return table
