"""IOzone auto-mode text output (`iozone -a ...`): the KB/reclen table.

The table is found by its heading line (`KB  reclen  write ...`); the line above it supplies the first
word of two-word headings (`random read`, `bkwd read`, ...). Values are matched to columns by position,
so builds that leave a cell blank or print extra columns still parse; anything absent is missing,
never zero. A file with no table is an error; a table cut short (no "iozone test complete.") is kept
with a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from zbdlab.parsers.model import CellKey, InputError, Sample, canonical_operation

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_TOKEN = re.compile(r"\S+")


@dataclass
class IozoneRun:
    source: str
    rows: dict[CellKey, float] = field(default_factory=dict)  # KB/s as printed
    operations: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _spans(line: str) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), m.group()) for m in _TOKEN.finditer(line)]


def _column_names(top: str, heading: str) -> list[tuple[int, int, str]]:
    """Heading columns with their spans, two-word names joined from the line above."""
    upper = _spans(top)
    columns = []
    for start, end, word in _spans(heading):
        prefix = [w for (s, e, w) in upper if s < end + 1 and e > start - 1]
        name = f"{prefix[0]} {word}" if prefix else word
        columns.append((start, end, name))
    return columns


def _assign(tokens: list[tuple[int, int, str]], columns: list[tuple[int, int, str]]) -> dict[int, str]:
    """Column index -> token. Full rows map in order; short rows map each token to the nearest column end."""
    if len(tokens) == len(columns):
        return {i: tok[2] for i, tok in enumerate(tokens)}
    assigned: dict[int, str] = {}
    for _, end, text in tokens:
        best = min(range(len(columns)), key=lambda i: abs(columns[i][1] - end))
        if best not in assigned:
            assigned[best] = text
    return assigned


def parse_iozone_text(text: str, source: str) -> IozoneRun:
    lines = text.splitlines()
    heading_index = next(
        (i for i, line in enumerate(lines) if re.match(r"^\s*KB\s+reclen\b", line)),
        None,
    )
    if heading_index is None:
        if not text.strip():
            raise InputError(f"{source}: empty file")
        raise InputError(f"{source}: no IOzone auto-mode table (no 'KB reclen ...' heading line)")
    top = lines[heading_index - 1] if heading_index > 0 else ""
    columns = _column_names(top, lines[heading_index])
    names = [canonical_operation(name) for (_, _, name) in columns]
    run = IozoneRun(source=source, operations=names[2:])
    complete = False
    for line_number, line in enumerate(lines[heading_index + 1 :], start=heading_index + 2):
        if "iozone test complete" in line.lower():
            complete = True
            break
        tokens = _spans(line)
        if not tokens:
            continue
        if not all(_NUMBER.fullmatch(tok[2]) for tok in tokens):
            break  # end of the table (another report section follows)
        assigned = _assign(tokens, columns)
        if 0 not in assigned or 1 not in assigned:
            run.warnings.append(f"{source}:{line_number}: row without KB and reclen skipped")
            continue
        file_kb, record_kb = int(float(assigned[0])), int(float(assigned[1]))
        for index, text_value in assigned.items():
            if index < 2:
                continue
            value = float(text_value)
            if value <= 0:
                run.warnings.append(f"{source}:{line_number}: non-positive value in {names[index]}, ignored")
                continue
            run.rows[CellKey(names[index], file_kb, record_kb)] = value
    if not run.rows:
        raise InputError(f"{source}: IOzone table heading found but no result rows (truncated file?)")
    if not complete:
        run.warnings.append(f"{source}: no 'iozone test complete.' line; the run may be truncated")
    return run


def iozone_samples(path: Path, run_id: str) -> tuple[list[Sample], list[str]]:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from exc
    run = parse_iozone_text(text, str(path))
    samples = [Sample(cell=cell, run=run_id, value=kbs / 1024.0) for cell, kbs in run.rows.items()]
    return samples, run.warnings


def looks_like_iozone(path: Path) -> bool:
    try:
        head = path.read_text(errors="replace")[:20000]
    except OSError:
        return False
    return "iozone" in head.lower() or bool(re.search(r"^\s*KB\s+reclen\b", head, re.M))
