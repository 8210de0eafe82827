"""Download pinned files into a cache, verified by sha256, and unpack them deterministically."""

from __future__ import annotations

import hashlib
import os
import tarfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from zbdlab.corpus import CorpusError
from zbdlab.corpus.pins import Pin

FIXED_MTIME = 1_700_000_000  # every corpus file and directory gets this mtime (no build timestamps)
DOWNLOAD_TIMEOUT_S = 60


def default_cache_dir() -> Path:
    if explicit := os.environ.get("ZBDLAB_CACHE_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "zbdlab"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(pin: Pin, cache_dir: Path, log: Callable[[str], None] = lambda _: None) -> Path:
    """The verified cached copy of `pin`: a cached file with the wrong sha256 is discarded and fetched
    again; a download with the wrong sha256 is an error (and is not kept)."""
    downloads = cache_dir / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    path = downloads / pin.filename
    if path.exists():
        actual = sha256_file(path)
        if actual == pin.sha256:
            return path
        log(f"cached {pin.filename} has sha256 {actual[:12]}…, expected {pin.sha256[:12]}…; fetching again")
        path.unlink()
    partial = path.with_name(path.name + ".partial")
    log(f"downloading {pin.url}")
    try:
        with (
            urllib.request.urlopen(pin.url, timeout=DOWNLOAD_TIMEOUT_S) as response,
            partial.open("wb") as out,
        ):
            while chunk := response.read(1 << 20):
                out.write(chunk)
    except (urllib.error.URLError, OSError) as e:
        partial.unlink(missing_ok=True)
        raise CorpusError(f"downloading {pin.filename} from {pin.url} failed: {e}") from e
    actual = sha256_file(partial)
    if actual != pin.sha256:
        partial.unlink()
        raise CorpusError(
            f"{pin.filename} from {pin.url} has sha256 {actual}, expected {pin.sha256}; not used"
        )
    partial.rename(path)
    return path


def _safe_member(name: str, archive: Path) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        raise CorpusError(f"{archive.name} holds an unsafe path {name!r}")
    return path


def unpack(archive: Path, target: Path) -> None:
    """Unpack the regular files of a wheel/zip or tar.gz into target (links and special files are
    skipped), in name order, with fixed modes and mtimes."""
    target.mkdir(parents=True, exist_ok=True)
    if archive.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as z:
            for info in sorted(z.infolist(), key=lambda i: i.filename):
                if not info.is_dir():
                    _write(target / _safe_member(info.filename, archive), z.read(info))
    elif archive.name.endswith((".tar.gz", ".tgz", ".tar")):
        with tarfile.open(archive) as t:
            for member in sorted(t.getmembers(), key=lambda m: m.name):
                if member.isfile():
                    f = t.extractfile(member)
                    if f is None:
                        raise CorpusError(f"{archive.name}: cannot read {member.name}")
                    _write(target / _safe_member(member.name, archive), f.read())
    else:
        raise CorpusError(f"do not know how to unpack {archive.name}")


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o644)


def normalize_tree(root: Path) -> None:
    """Fixed modes and mtimes for everything under root, so tar/cp of the corpus is reproducible."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            os.chmod(path, 0o644)
            os.utime(path, (FIXED_MTIME, FIXED_MTIME))
        for name in dirnames:
            path = os.path.join(dirpath, name)
            os.chmod(path, 0o755)
            os.utime(path, (FIXED_MTIME, FIXED_MTIME))
    os.utime(root, (FIXED_MTIME, FIXED_MTIME))
