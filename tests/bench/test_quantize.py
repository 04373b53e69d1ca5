"""fp8lab.bench.quantize: the rows' ratios follow from their medians (floor = 5/8 of a copy's time); no time is
asserted."""

import math

import pytest

import fp8lab.bench.table
from fp8lab.bench.quantize import bench_quantize


@pytest.fixture(scope="module")
def rows():
    with pytest.MonkeyPatch.context() as mp:  # the table's reference matmul (seconds) is not what this checks
        mp.setattr(fp8lab.bench.table, "reference_speed", lambda: "not measured")
        return bench_quantize(size=64, rounds=1)


def test_every_candidate_has_a_row(rows):
    names = [r["what"] for r in rows]
    assert names[:6] == ["copy: x.clone() (allocates)", "copy: dst.copy_(x) (preallocated)", "fp8lab per-tensor E4M3",
                         "fp8lab 1x128 E4M3", "fp8lab 128x128 E4M3", "fp8lab 1x32 E4M3 + E8M0 (rceil)"]


def test_ratios_follow_from_the_medians(rows):
    clone, copy = rows[0], rows[1]
    assert math.isclose(clone["x floor"], 8 / 5)  # the floor is 5/8 of x.clone()'s time
    assert math.isclose(copy["x floor (mapped)"], 8 / 5)
    for r in rows:
        seconds = r["median ms"] / 1e3
        assert math.isclose(r["GB/s (4 B in)"], 64 * 64 * 4 / seconds / 1e9)
        assert math.isclose(r["x floor"] / r["x floor (mapped)"], copy["median ms"] / clone["median ms"])
