"""The study files the entries generate for `zbdlab run` (docs/lab.md has every key): the head every
reproduction's study starts with, and its target tables.

The text is what `Context.study` writes and compares with an interrupted run's, so the builders keep
each key on its own line in a fixed order: the same arguments always give the same bytes.
"""

from __future__ import annotations


def study_head(
    what: str,
    name: str,
    *,
    repetitions: int,
    cache: str,
    seed: int,
    compress_percentage: int | None = None,
    format: str | None = None,
    memory_limit: str | None = None,
    drop_caches: bool = False,
) -> str:
    """The study's comment line (`# zbdlab reproduce <what>`), its top-level keys and its [data]
    table, then a blank line. Without `compress_percentage` the data are the tool's own (kind "tool");
    with it, synthetic data of that compressibility. `format` and `memory_limit` only when given,
    `drop_caches` only when true (warm studies)."""
    assert cache in ("cold", "warm"), cache
    lines = [
        f"# zbdlab reproduce {what}",
        "version = 1",
        f'name = "{name}"',
        f"repetitions = {repetitions}",
        f'cache = "{cache}"',
    ]
    if format is not None:
        lines.append(f'format = "{format}"')
    if memory_limit is not None:
        lines.append(f'memory_limit = "{memory_limit}"')
    if drop_caches:
        assert cache == "warm", "a cold cache is dropped after a remount already"
        lines.append("drop_caches = true")
    lines += [f"seed = {seed}", "[data]"]
    if compress_percentage is None:
        lines.append('kind = "tool"')
    else:
        lines += ['kind = "synthetic"', f"compress_percentage = {compress_percentage}"]
    return "\n".join(lines) + "\n\n"


def target(
    name: str,
    fs: str,
    size: str,
    *,
    devices: int | None = None,
    throttle: str | None = None,
    lines: str = "",
) -> str:
    """One [[targets]] table: name, file system and image size, then `devices` and `throttle` (an
    inline table such as `{ rate = "100M", latency = "2ms" }`) when given, then `lines`: more keys or
    sub-tables, as TOML text that ends in a newline."""
    assert not lines or lines.endswith("\n"), lines
    text = f'[[targets]]\nname = "{name}"\nfs = "{fs}"\nsize = "{size}"\n'
    if devices is not None:
        text += f"devices = {devices}\n"
    if throttle is not None:
        text += f"throttle = {throttle}\n"
    return text + lines


def zbd_table(**options: str) -> str:
    """A target's [targets.zbd] sub-table (a file system on a zbd volume): codec, extent_size, ..."""
    return "[targets.zbd]\n" + "".join(f'{key} = "{value}"\n' for key, value in options.items())
