"""The results directory: append-only runs.jsonl (fsync'd per finished unit), runs.csv, metadata.

runs.jsonl is never rewritten. A line cut short by a kill is skipped on reading; a run recorded twice
(redone after an interruption) is read once, the last copy winning.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from zbdlab.results.schema import RunRecord

RUNS_JSONL = "runs.jsonl"
RUNS_CSV = "runs.csv"


class ResultStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.raw = root / "raw"

    @property
    def runs_path(self) -> Path:
        return self.root / RUNS_JSONL

    def create(self) -> None:
        self.raw.mkdir(parents=True, exist_ok=True)

    def exists(self) -> bool:
        return self.runs_path.exists() or (self.root / "plan.json").exists()

    # --- runs ---------------------------------------------------------------------------------------

    def append(self, records: list[RunRecord]) -> None:
        """Append the runs of one finished unit in one write, then fsync, so they land together."""
        text = "".join(json.dumps(asdict(r), sort_keys=True) + "\n" for r in records)
        fd = os.open(self.runs_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            if os.fstat(fd).st_size > 0 and not self._ends_with_newline():
                text = "\n" + text  # close a line a kill cut short; the reader skips it
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _ends_with_newline(self) -> bool:
        with open(self.runs_path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    def read_rows(self) -> list[dict[str, Any]]:
        if not self.runs_path.exists():
            return []
        rows: dict[str, dict[str, Any]] = {}
        with open(self.runs_path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and "run_id" in row:
                    rows.pop(row["run_id"], None)
                    rows[row["run_id"]] = row
        return list(rows.values())

    def finished_units(self) -> set[str]:
        return {r["unit_id"] for r in self.read_rows() if r.get("unit_id")}

    def write_csv(self) -> None:
        rows = self.read_rows()
        names = RunRecord.field_names()
        tmp = self.root / (RUNS_CSV + ".tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=names, extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                out = dict(row)
                out["warnings"] = "; ".join(row.get("warnings") or [])
                out["extra"] = json.dumps(row.get("extra") or {}, sort_keys=True)
                writer.writerow(out)
        tmp.replace(self.root / RUNS_CSV)

    # --- metadata -----------------------------------------------------------------------------------

    def write_json(self, name: str, obj: Any) -> None:
        tmp = self.root / (name + ".tmp")
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
        tmp.replace(self.root / name)

    def read_json(self, name: str) -> Any:
        path = self.root / name
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    def save_study(self, text: str) -> None:
        (self.root / "study.toml").write_text(text, encoding="utf-8")

    def raw_dir(self, name: str, fresh: bool = True) -> Path:
        path = self.raw / name
        if fresh and path.exists():
            shutil.rmtree(path)  # a unit cut short before: its leftovers are not results
        path.mkdir(parents=True, exist_ok=True)
        return path
