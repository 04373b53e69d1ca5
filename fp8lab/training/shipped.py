"""The data files of the shipped training runs: fp8lab/training/runs/NAME.json, one table each.

Public: RUNS (that folder), Table (what a file holds: measured_on, note, columns, rows), read_table(name).
A file is JSON with one row per line, so that a re-measured run reads as a diff: {"measured_on": the machine line,
"note": what else a reader needs, "columns": [...], "rows": [[...], ...]}; floats are written as Python's repr (the
shortest text that reads back to the same float). fp8lab.training.measured and measured_fp4 load them;
fp8lab.harness.measure writes them (`python -m fp8lab measured --write`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RUNS", "Table", "read_table"]

RUNS = Path(__file__).with_name("runs")


@dataclass(frozen=True)
class Table:
    """One shipped table: the machine it was measured on, a note, its column names and its rows."""

    measured_on: str
    note: str
    columns: tuple[str, ...]
    rows: tuple[tuple, ...]


@functools.cache
def read_table(name: str) -> Table:
    """RUNS/<name>.json as a Table (rows as tuples, JSON null as None)."""
    data = json.loads((RUNS / f"{name}.json").read_text())
    return Table(data["measured_on"], data.get("note", ""), tuple(data["columns"]),
                 tuple(tuple(row) for row in data["rows"]))
