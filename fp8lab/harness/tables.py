"""Writing the shipped runs' data files (fp8lab.training.shipped reads them).

Public: write_table(name, measured_on, columns, rows, note=""), table_text(...) (the text it writes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from fp8lab.training.shipped import RUNS, read_table

__all__ = ["table_text", "write_table"]


def table_text(measured_on: str, columns: Sequence[str], rows: Iterable[Sequence], note: str = "") -> str:
    """The JSON text of one table, one row per line (floats as their repr: they read back bit for bit)."""
    head = {"measured_on": measured_on, **({"note": note} if note else {}), "columns": list(columns)}
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    body = ",\n".join(f"    {json.dumps(list(row))}" for row in rows)
    return "{\n" + "\n".join(lines) + '\n  "rows": [\n' + body + "\n  ]\n}\n"


def write_table(name: str, measured_on: str, columns: Sequence[str], rows: Iterable[Sequence], note: str = "") -> None:
    """Write fp8lab/training/runs/<name>.json (read back by fp8lab.training.shipped.read_table)."""
    (RUNS / f"{name}.json").write_text(table_text(measured_on, columns, rows, note))
    read_table.cache_clear()
