"""The data corpus: pinned PyPI release files plus data generated from a fixed seed, the same bytes on
every machine, with a sha256 manifest and a compressibility report (`zbdlab corpus build`)."""

from __future__ import annotations

from pathlib import Path


class CorpusError(RuntimeError):
    """A download, checksum or build step failed; the message names the file and the problem."""


def data_dir(corpus: Path) -> Path:
    """The directory holding the corpus files (a built corpus keeps them under data/, next to its
    manifest); a plain directory of files is its own data directory."""
    inner = corpus / "data"
    return inner if (corpus / "manifest.json").is_file() and inner.is_dir() else corpus
