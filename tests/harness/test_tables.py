"""fp8lab.harness.tables: write_table writes RUNS/<name>.json and read_table reads the new rows back at once.
(The shipped files' own text and values: tests/training/test_shipped.py.)"""

import json

import pytest

from fp8lab.harness import tables
from fp8lab.training import shipped


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """RUNS in tmp_path for writer and reader (never the package's folder)."""
    monkeypatch.setattr(tables, "RUNS", tmp_path)
    monkeypatch.setattr(shipped, "RUNS", tmp_path)
    shipped.read_table.cache_clear()
    yield tmp_path
    shipped.read_table.cache_clear()


def test_a_written_table_reads_back_with_its_types_and_floats_bit_for_bit(runs):
    rows = [(0, 1e-310, "fp32", None), (2, 0.1 + 0.2, "blockwise", -0.0), (3, 2.0 ** -1074, "mx", 1 / 3)]
    tables.write_table("t", "2026-01-01 on a 2-core CPU", ["seed", "loss", "run", "other"], rows, "a note")
    assert [p.name for p in runs.iterdir()] == ["t.json"]
    back = shipped.read_table("t")
    assert back.measured_on == "2026-01-01 on a 2-core CPU" and back.note == "a note"
    assert back.columns == ("seed", "loss", "run", "other") and back.rows == tuple(rows)
    for got, want in zip(back.rows, rows, strict=True):
        assert type(got[0]) is int and got[1].hex() == want[1].hex()
    assert str(back.rows[1][3]) == "-0.0"


def test_a_rewrite_is_read_at_once(runs):
    tables.write_table("t", "m1", ["v"], [(1.5,)])
    assert shipped.read_table("t").rows == ((1.5,),)  # read, and cached
    tables.write_table("t", "m2", ["v"], [(2.5,), (3.5,)])
    assert shipped.read_table("t").rows == ((2.5,), (3.5,)) and shipped.read_table("t").measured_on == "m2"


def test_the_text_has_one_row_a_line_and_no_note_unless_given():
    text = tables.table_text("m", ["a", "b"], [(1, "x"), (2, None)])
    assert text == ('{\n  "measured_on": "m",\n  "columns": ["a", "b"],\n  "rows": [\n'
                    '    [1, "x"],\n    [2, null]\n  ]\n}\n')
    assert "note" not in json.loads(text)
    assert json.loads(tables.table_text("m", ["a"], [(1,)], "why"))["note"] == "why"
