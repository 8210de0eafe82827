"""Data generated from a fixed seed: an SQLite database, web-server logs, CSV and JSON lines.

Only `random.Random(seed)` draws (random(), randrange(), choice(), getrandbits()), whose sequences
Python keeps stable across versions and platforms; timestamps count from a fixed epoch, never the
clock. Each kind is written until it reaches its byte budget, so the sizes are exact and repeatable.
"""

from __future__ import annotations

import json
import random
import sqlite3
import struct
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

SEED = 20260101
EPOCH = datetime(2024, 3, 1, tzinfo=UTC)
SQLITE_VERSION_PINNED = 3_040_001  # written into the header so the file does not name the local SQLite

WORDS = (
    "alpha beta gamma delta extent block cache flush commit replay cleaner segment ratio buffer "
    "volume queue thread latency record stride random backward window device mapper checksum order "
    "invoice customer product shipping pending settled refund coupon basket session region sensor"
).split()
PATHS = (
    "/api/v1/items",
    "/api/v1/orders",
    "/static/app.js",
    "/static/style.css",
    "/img/logo.png",
    "/login",
    "/",
)
AGENTS = ("Mozilla/5.0 (X11; Linux x86_64)", "curl/8.4.0", "Go-http-client/2.0", "python-requests/2.31")
STATUSES = (200, 200, 200, 200, 200, 304, 404, 500, 302)


def _lines_until(path: Path, budget: int, lines: Iterator[str]) -> None:
    """Write lines until exactly `budget` bytes (the last line is cut)."""
    written = 0
    with path.open("w", encoding="ascii", newline="\n") as out:
        for line in lines:
            data = line[: budget - written]
            out.write(data)
            written += len(data)
            if written >= budget:
                return


def _log_lines(rng: random.Random) -> Iterator[str]:
    t = EPOCH
    while True:
        t += timedelta(microseconds=rng.randrange(1, 250_000))
        ip = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        path = rng.choice(PATHS)
        if path.startswith("/api"):
            path = f"{path}/{rng.randrange(100_000)}"
        yield (
            f"{t.strftime('%Y-%m-%dT%H:%M:%S')}.{t.microsecond // 1000:03d}Z web-{rng.randrange(8):02d} "
            f'nginx[{rng.randrange(1000, 9999)}]: {ip} - - "GET {path} HTTP/1.1" {rng.choice(STATUSES)} '
            f'{rng.randrange(200, 90_000)} "-" "{rng.choice(AGENTS)}" rt={rng.random() * 0.5:.3f}\n'
        )


def _csv_lines(rng: random.Random) -> Iterator[str]:
    yield "sensor_id,timestamp,temperature_c,humidity_pct,pressure_hpa,status\n"
    t = EPOCH
    while True:
        t += timedelta(seconds=rng.randrange(1, 30))
        yield (
            f"S{rng.randrange(500):04d},{int(t.timestamp())},{15 + rng.random() * 15:.2f},"
            f"{30 + rng.random() * 60:.1f},{990 + rng.random() * 40:.2f},"
            f"{rng.choice(('ok', 'ok', 'ok', 'warn'))}\n"
        )


def _json_lines(rng: random.Random) -> Iterator[str]:
    n = 0
    while True:
        n += 1
        event = {
            "id": n,
            "ts": int(EPOCH.timestamp()) + n * 7,
            "user": f"user{rng.randrange(20_000)}",
            "action": rng.choice(("view", "click", "buy", "search", "logout")),
            "tags": [rng.choice(WORDS) for _ in range(rng.randrange(0, 5))],
            "cart": {"items": rng.randrange(0, 9), "total_cents": rng.randrange(0, 500_000)},
            "session": f"{rng.getrandbits(64):016x}",
        }
        yield json.dumps(event, sort_keys=True, separators=(",", ":")) + "\n"


def _sqlite(path: Path, budget: int, rng: random.Random) -> None:
    """A shop database sized by row counts derived from the budget (not by watching the file grow),
    vacuumed into its canonical layout."""
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    db = sqlite3.connect(tmp)
    try:
        db.executescript(
            "PRAGMA page_size=4096; PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;"
            "CREATE TABLE product(id INTEGER PRIMARY KEY, name TEXT, price_cents INTEGER, description TEXT);"
            "CREATE TABLE customer(id INTEGER PRIMARY KEY, name TEXT, email TEXT, city TEXT);"
            "CREATE TABLE orders(id INTEGER PRIMARY KEY, customer_id INTEGER, product_id INTEGER,"
            " quantity INTEGER, status TEXT, created INTEGER);"
            "CREATE INDEX orders_customer ON orders(customer_id);"
        )
        products = 1000
        customers = max(10, budget // 4000)
        orders = max(10, budget // 45)
        db.executemany(
            "INSERT INTO product VALUES (?,?,?,?)",
            (
                (i, f"{rng.choice(WORDS)}-{rng.choice(WORDS)}", rng.randrange(100, 100_000),
                 " ".join(rng.choice(WORDS) for _ in range(rng.randrange(5, 40))))
                for i in range(1, products + 1)
            ),
        )  # fmt: skip
        db.executemany(
            "INSERT INTO customer VALUES (?,?,?,?)",
            (
                (i, f"{rng.choice(WORDS).title()} {rng.choice(WORDS).title()}", f"c{i}@example.org",
                 rng.choice(("Oslo", "Lund", "Turku", "Graz", "Porto", "Brno")))
                for i in range(1, customers + 1)
            ),
        )  # fmt: skip
        db.executemany(
            "INSERT INTO orders VALUES (?,?,?,?,?,?)",
            (
                (i, rng.randrange(1, customers + 1), rng.randrange(1, products + 1), rng.randrange(1, 6),
                 rng.choice(("pending", "settled", "shipped", "refund")), int(EPOCH.timestamp()) + i * 13)
                for i in range(1, orders + 1)
            ),
        )  # fmt: skip
        db.commit()
        db.execute("VACUUM")
    finally:
        db.close()
    header = bytearray(tmp.read_bytes()[:100])
    change_counter = struct.unpack(">I", header[24:28])[0]
    with tmp.open("r+b") as f:  # offsets 92 and 96 of the header: version-valid-for, SQLite version
        f.seek(92)
        f.write(struct.pack(">II", change_counter, SQLITE_VERSION_PINNED))
    tmp.rename(path)


GENERATORS: dict[str, tuple[str, float]] = {
    # kind -> (file name, share of the generated budget)
    "sqlite": ("shop.sqlite", 0.3),
    "logs": ("access.log", 0.3),
    "csv": ("sensors.csv", 0.2),
    "json": ("events.jsonl", 0.2),
}


def generate(root: Path, budget: int, seed: int = SEED) -> list[Path]:
    """Write every generated kind under root/<kind>/; returns the part directories."""
    writers: dict[str, Callable[[Path, int, random.Random], None]] = {
        "sqlite": _sqlite,
        "logs": lambda p, b, r: _lines_until(p, b, _log_lines(r)),
        "csv": lambda p, b, r: _lines_until(p, b, _csv_lines(r)),
        "json": lambda p, b, r: _lines_until(p, b, _json_lines(r)),
    }
    parts = []
    for index, (kind, (filename, share)) in enumerate(GENERATORS.items()):
        part = root / kind
        part.mkdir(parents=True, exist_ok=True)
        writers[kind](part / filename, int(budget * share), random.Random(seed + index))
        parts.append(part)
    return parts
