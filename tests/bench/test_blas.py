"""fp8lab.bench.blas: candidates run interleaved, and the table's medians, ratios to MKL's default and counts of
bit-identical processes follow from what each process reported (the processes replaced by a recorder)."""

import math

from fp8lab.bench import blas


def test_rows_from_the_processes_results(monkeypatch):
    calls = []
    reported = {"AUTO,STRICT": iter([(10.0, 100.0, True), (14.0, 120.0, True), (12.0, 110.0, True)]),
                "AUTO": iter([(8.0, 90.0, False), (9.0, 100.0, True), (10.0, 95.0, False)])}

    def child(cbwr, size, steps):
        calls.append(cbwr)
        gemm, step, same = next(reported[cbwr])
        return {"gemm_ms": gemm, "step_ms": step, "same": same}

    monkeypatch.setattr(blas, "_child", child)
    monkeypatch.setattr(blas, "print_table", lambda *a, **k: None)
    rows = blas.bench_blas(size=64, rounds=3, steps=1)
    assert calls == ["AUTO,STRICT", "AUTO"] * 3  # interleaved round by round
    strict, auto = rows
    assert strict["fp32 64^3 GEMM ms"] == 12.0 and auto["fp32 64^3 GEMM ms"] == 9.0  # medians over processes
    assert math.isclose(strict["vs AUTO"], 12.0 / 9.0) and auto["vs AUTO"] == 1.0
    assert math.isclose(strict["step vs AUTO"], 110.0 / 95.0)
    assert strict["same bits, 1 and 2 threads"] == "3/3 processes"
    assert auto["same bits, 1 and 2 threads"] == "1/3 processes"
