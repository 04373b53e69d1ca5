"""fp8lab.bench.gemm: one row per candidate and shape, ratios to the fp32 matmul of the same shape and GFLOP/s
from each row's own median; no time is asserted."""

import math

import pytest

import fp8lab.bench.table
from fp8lab.bench.gemm import bench_gemm


@pytest.fixture(autouse=True)
def _no_reference_matmul(monkeypatch):
    """The table's machine line times a 2048^3 matmul (seconds): not what these tests check."""
    monkeypatch.setattr(fp8lab.bench.table, "reference_speed", lambda: "not measured")


def test_rows_per_shape_and_their_ratios():
    rows = bench_gemm(size=32, rounds=1, recipes=("tensorwise", "rowwise"))
    shapes = {r["M x K x N"] for r in rows}
    assert shapes == {"32x32x32", "24x48x12"}  # size^3 and (3/4, 3/2, 3/8) * size
    square = [r["what"] for r in rows if r["M x K x N"] == "32x32x32"]
    assert set(square) == {"torch.mm fp32", "fp8lab tensorwise fast", "fp8lab tensorwise reference",
                           "fp8lab rowwise fast", "fp8lab tensorwise matmul(a, b[K,N]) + quantize",
                           "fp8lab tensorwise matmul(a, w.t()) + quantize", "torch.mm bf16 (bf16 output)"}
    other = [r["what"] for r in rows if r["M x K x N"] == "24x48x12"]
    assert "fp8lab rowwise fast" not in other  # operands quantized beforehand: the square shape only
    for r in rows:
        m, k, n = (int(v) for v in r["M x K x N"].split("x"))
        base = next(b for b in rows if b["M x K x N"] == r["M x K x N"] and b["what"] == "torch.mm fp32")
        assert math.isclose(r["x fp32 mm"], r["median ms"] / base["median ms"])
        assert math.isclose(r["GFLOP/s"], 2 * m * k * n / (r["median ms"] / 1e3) / 1e9)
