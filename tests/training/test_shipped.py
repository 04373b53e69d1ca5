"""The shipped runs are data files (fp8lab/training/runs/*.json): they load with the values the lab ships, each float
reads back bit for bit, and the harness's writer writes what the reader reads."""

import hashlib
import json

import pytest

from fp8lab.harness.tables import table_text
from fp8lab.training import measured, measured_fp4
from fp8lab.training.shipped import RUNS, read_table

# (rows, sha256 of repr(rows)[:16]) of each table as the lab ships it: what the Python literals held, loaded once
# from them to write the data files; a changed value, a float that does not read back, or a lost row changes these
SHIPPED = {
    "cliff": (168, "3660b400014936a2"),
    "recovery": (9, "b93c8429b36b43ef"),
    "mismatch": (9, "b3746ab1a35302ed"),
    "published": (42, "00d804df27bae687"),
    "flush": (8, "456a87e5abf18495"),
    "tokens": (70, "1c8a9c15343695a4"),
    "both": (70, "be1293474af1aa1b"),
    "fp4_parts": (66, "3ce8e1eb5d85b3fe"),
    "fp4_dy": (30, "e45a433c5593ce70"),
    "fp4_split": (15, "26190c57d9515821"),
    "fp4_backward": (21, "b9e0d24bfde575aa"),
    "fp4_dy_control": (6, "dcd2d8a72569ea2e"),
}


def test_every_data_file_is_a_shipped_table():
    assert sorted(p.stem for p in RUNS.glob("*.json")) == sorted(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_each_table_loads_the_shipped_values(name):
    table = read_table(name)
    rows, digest = SHIPPED[name]
    assert len(table.rows) == rows
    assert all(len(r) == len(table.columns) for r in table.rows)
    assert hashlib.sha256(repr(list(table.rows)).encode()).hexdigest()[:16] == digest
    assert table.measured_on.startswith("2026-") and "torch" in table.measured_on


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_writer_writes_what_the_reader_reads(name):
    """table_text is the file's text byte for byte (one row a line), and reads back to the same rows."""
    table = read_table(name)
    text = table_text(table.measured_on, table.columns, table.rows, table.note)
    assert text == (RUNS / f"{name}.json").read_text()
    back = json.loads(text)
    assert [tuple(r) for r in back["rows"]] == list(table.rows)


def test_a_float_reads_back_bit_for_bit():
    values = [0.1, 1 / 3, 7.28442e-05, 1e-310, 123456.789, -0.0, 2.0 ** -1074]
    back = json.loads(table_text("m", ["v"], [[v] for v in values]))["rows"]
    assert all(r[0].hex() == v.hex() for r, v in zip(back, values, strict=True))


def test_the_loaders_frames_are_the_tables():
    assert measured.cliff().shape == (168, 5) and list(measured.cliff().columns) == measured.CLIFF_COLUMNS
    assert measured.cliff_rows("tokens").shape == (70, 5) and measured.cliff_rows("both").shape == (70, 5)
    rec = measured.recovery()
    assert rec.steps_to_recover.tolist() == [1, 2, 4, 8, 16, 32, 64, None, None]
    assert measured.mismatch().columns.tolist() == ["seed", "run", "loss", "constant"]
    assert measured.flush_costs().shape == (8, 7)
    assert measured.MEASURED_ON == read_table("cliff").measured_on
    assert measured_fp4.parts().shape == (66, 6) and measured_fp4.PARTS_ON == read_table("fp4_parts").measured_on
    assert measured.survivors() == {"blockwise", "mxfp8"}
