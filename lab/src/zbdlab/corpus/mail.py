"""Mail-like text for workloads that write their own bytes (PostMark): an mbox made of this machine's
Debian changelogs.

The ZBD paper modified PostMark to write real mail (its Table II mailboxes compress 1.2..2.2:1 with
zlib). No mailbox is on this machine and nothing may be downloaded for it; Debian changelogs are the
nearest thing: dated entries written by people, each signed with a name, an address and a date. Each
entry becomes one message with the headers a mailing-list archive gives it (From_ line, From, To,
Subject, Date, Message-ID), so the headers' share of the bytes resembles a real mailbox's. What the
bytes compress to is measured, not assumed (`zbd bench codec --data`), and reported beside the numbers.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from collections.abc import Iterable, Iterator
from email.utils import parsedate_to_datetime
from pathlib import Path

CHANGELOGS = Path("/usr/share/doc")
LIST_ADDRESS = "debian-devel-changes@lists.debian.org"
# " -- Name <address>  Sun, 01 Jan 2023 12:00:00 +0100": the line that closes an entry
_TRAILER = re.compile(r"^ -- (?P<name>.*?) <(?P<address>[^>]*)>\s+(?P<date>\S.*)$")
# "package (1.2-3) unstable; urgency=medium": the line that opens one
_HEADLINE = re.compile(r"^(?P<package>[a-z0-9][a-z0-9+.-]*) \((?P<version>[^)]*)\) (?P<dist>[^;]*);")


def entries(text: str) -> Iterator[tuple[str, str, str, str, str]]:
    """(package, version, name <address>, date, body) of each entry of one changelog; text that is not
    inside a complete entry (old free-form history at the end) is skipped."""
    head: re.Match[str] | None = None
    body: list[str] = []
    for line in text.splitlines():
        if head is None:
            head = _HEADLINE.match(line)
            body = []
            continue
        trailer = _TRAILER.match(line)
        if trailer:
            author = f"{trailer['name']} <{trailer['address']}>"
            yield (
                head["package"],
                head["version"],
                author,
                trailer["date"].strip(),
                "\n".join(body).strip("\n"),
            )
            head = None
        else:
            body.append(line)


def message(package: str, version: str, author: str, date: str, body: str) -> str:
    """One mbox message (From_ line, headers, body with '>From ' quoting, blank line after)."""
    address = author.rpartition("<")[2].rstrip(">") or "unknown@debian.org"
    try:
        asctime = parsedate_to_datetime(date).strftime("%a %b %d %H:%M:%S %Y")
    except (TypeError, ValueError):
        asctime = "Thu Jan 01 00:00:00 1970"
    digest = hashlib.sha1(f"{package} {version} {date}".encode()).hexdigest()[:20]
    quoted = re.sub(r"^(>*From )", r">\1", body, flags=re.MULTILINE)
    return (
        f"From {address} {asctime}\n"
        f"From: {author}\n"
        f"To: {LIST_ADDRESS}\n"
        f"Subject: Accepted {package} {version} (source) into unstable\n"
        f"Date: {date}\n"
        f"Message-ID: <E1{digest}@debian.org>\n"
        "Content-Type: text/plain; charset=utf-8\n"
        "\n"
        f"{quoted}\n"
        "\n"
    )


def changelog_texts(root: Path = CHANGELOGS) -> Iterator[str]:
    """The decompressed changelog.Debian.gz of every installed package, in path order."""
    for path in sorted(root.glob("*/changelog.Debian.gz")):
        try:
            yield gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
        except (OSError, EOFError):
            continue


def mbox(texts: Iterable[str], cap: int) -> bytes:
    """The messages of all entries of `texts`, joined, cut at `cap` bytes."""
    out: list[bytes] = []
    size = 0
    for text in texts:
        for entry in entries(text):
            data = message(*entry).encode("utf-8")
            out.append(data)
            size += len(data)
            if size >= cap:
                return b"".join(out)[:cap]
    return b"".join(out)


def build_mbox(path: Path, cap: int = 64 << 20, root: Path = CHANGELOGS) -> int:
    """Write the mbox of this machine's changelogs to `path` (at most `cap` bytes); returns its size.
    Raises ValueError when the machine has too little changelog text to stand in for mail."""
    data = mbox(changelog_texts(root), cap)
    if len(data) < 1 << 20:
        raise ValueError(
            f"only {len(data)} bytes of Debian changelogs under {root}: too little for a mailbox"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return len(data)
