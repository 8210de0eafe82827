"""The data types of the ZBD paper's Table II, from what this machine holds.

The paper compressed the authors' mailboxes, office documents, PDFs and a compiled Linux tree; none of
them is here, and nothing may be downloaded for it. Each type is gathered from installed files (the
origin is recorded per set), copied into DIR/data/<name>/ up to a cap, and its archive-level and
file-level gzip savings computed (level 6, gzip's default, as in the paper).
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Where installed files of each type are looked for (read-only; the copies go under DIR/data).
SEARCH_ROOTS = ("/usr/share", "/usr/lib", "/root/.cargo/registry/src", "/root/.pyenv/versions")
OFFICE_SUFFIXES = (".xls", ".xlsx", ".ods", ".odt", ".doc", ".docx", ".ppt", ".odp")
MIN_BYTES = 64 << 10  # a type with less than this on the machine is left out (and said so)


@dataclass
class DataSet:
    name: str  # workload name
    label: str  # row label
    path: Path
    origin: str
    bytes: int
    gzip_files_savings: float
    gzip_tar_savings: float
    tar: Path  # the set as one archive (what block-level compression sees, in order)


def _files_with(suffixes: tuple[str, ...], cap: int) -> list[Path]:
    found: list[Path] = []
    total = 0
    for root in SEARCH_ROOTS:
        for dirpath, _dirs, files in os.walk(root):
            for name in sorted(files):
                if name.lower().endswith(suffixes):
                    path = Path(dirpath) / name
                    try:
                        size = path.stat().st_size
                    except OSError:
                        continue
                    if size and path.is_file() and not path.is_symlink():
                        found.append(path)
                        total += size
                        if total >= cap:
                            return found
    return found


def _changelogs(cap: int) -> bytes:
    """Debian changelogs, decompressed and joined: dated, signed entries by named people, the nearest
    thing to mail text on a machine without mail."""
    out = io.BytesIO()
    for path in sorted(Path("/usr/share/doc").glob("*/changelog.Debian.gz")):
        try:
            out.write(gzip.decompress(path.read_bytes()))
        except (OSError, EOFError):
            continue
        if out.tell() >= cap:
            break
    return out.getvalue()[:cap]


def _gzip_savings(paths: list[Path], root: Path, tar_path: Path) -> tuple[float, float]:
    raw = sum(p.stat().st_size for p in paths)
    per_file = sum(len(gzip.compress(p.read_bytes(), compresslevel=6)) for p in paths)
    with tarfile.open(tar_path, mode="w") as tar:
        for p in paths:
            tar.add(p, arcname=str(p.relative_to(root)))
    archive = len(gzip.compress(tar_path.read_bytes(), compresslevel=6))
    return 100 * (1 - per_file / raw), 100 * (1 - archive / raw)


def _copy_tree(source: Path, dest: Path, cap: int) -> list[Path]:
    out: list[Path] = []
    total = 0
    for dirpath, _dirs, files in sorted(os.walk(source)):
        for name in sorted(files):
            src = Path(dirpath) / name
            if src.is_symlink() or not src.is_file():
                continue
            target = dest / src.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
            out.append(target)
            total += target.stat().st_size
            if total >= cap:
                return out
    return out


def build(directory: Path, quick: bool) -> list[DataSet]:
    """Gather every type (idempotent: an existing DIR/data/<name> is rebuilt from scratch)."""
    cap = (8 if quick else 64) * 1000 * 1000
    sets: list[DataSet] = []

    def add(name: str, label: str, origin: str, fill: Callable[[Path], list[Path]]) -> None:
        dest = directory / name
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        paths = fill(dest)
        size = sum(p.stat().st_size for p in paths)
        if size < MIN_BYTES:
            shutil.rmtree(dest)
            return
        tar = directory / f"{name}.tar"
        per_file, archive = _gzip_savings(paths, dest, tar)
        sets.append(DataSet(name, label, dest, f"{origin}, {len(paths)} files", size, per_file, archive, tar))

    def mail(dest: Path) -> list[Path]:
        # split into "messages" of ~8 KB, like a maildir, so file-level gzip sees files of mail size
        text = _changelogs(cap)
        paths = []
        for i in range(0, len(text), 8192):
            p = dest / f"{i // 8192:06d}"
            p.write_bytes(text[i : i + 8192])
            paths.append(p)
        return paths

    def copy_found(suffixes: tuple[str, ...]) -> Callable[[Path], list[Path]]:
        def fill(dest: Path) -> list[Path]:
            out = []
            for i, src in enumerate(_files_with(suffixes, cap)):
                target = dest / f"{i:05d}-{src.name}"
                shutil.copyfile(src, target)
                out.append(target)
            return out

        return fill

    add(
        "mail",
        "mail text (Debian changelogs)",
        "/usr/share/doc/*/changelog.Debian.gz, split in 8 KB files",
        mail,
    )
    add(
        "office",
        "office documents",
        f"files ending {', '.join(OFFICE_SUFFIXES)} under {', '.join(SEARCH_ROOTS)}",
        copy_found(OFFICE_SUFFIXES),
    )
    add("pdf", "PDF", f"*.pdf under {', '.join(SEARCH_ROOTS)}", copy_found((".pdf",)))
    source = Path("/usr/lib/python3.11")
    add(
        "compiled",
        "compiled source tree",
        f"{source} (Python source and bytecode)",
        lambda dest: _copy_tree(source, dest, cap),
    )
    return sets
