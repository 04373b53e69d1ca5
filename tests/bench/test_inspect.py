"""fp8lab.bench.inspect: the models it times are 25 blocks of 4 linears of the asked width, and each row reports
what inspect returned (inspect replaced by a recorder: what inspect computes is tests/training/test_readiness.py's)."""

import types

from torch import nn

import fp8lab.bench.inspect
import fp8lab.bench.table
from fp8lab.bench.inspect import bench_inspect


def test_models_and_rows(monkeypatch):
    seen = []

    def fake_inspect(model, x):
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        seen.append((len(linears), linears[0].in_features, tuple(x.shape)))
        return types.SimpleNamespace(layers=linears, recipes=["a", "b"], frame=list(range(7)))

    monkeypatch.setattr(fp8lab.bench.inspect, "inspect", fake_inspect)
    monkeypatch.setattr(fp8lab.bench.table, "reference_speed", lambda: "not measured")
    rows = bench_inspect(size=8, rounds=2)
    assert seen == [(100, 8, (64, 8))] * 3  # a warm-up and two timed rounds
    (row,) = rows
    assert row["model"] == "100 linears, width 8" and row["tokens"] == 64
    assert (row["recipes"], row["rows"]) == (2, 7)
    assert row["max s"] >= row["median s"] >= 0
    default = bench_inspect(rounds=1)
    assert [r["model"] for r in default] == ["100 linears, width 64", "100 linears, width 128"]


def test_each_block_is_fused_in_out_and_an_mlp(monkeypatch):
    width = 8
    models = []
    monkeypatch.setattr(fp8lab.bench.inspect, "inspect", lambda model, x: models.append(model) or
                        types.SimpleNamespace(layers=[], recipes=[], frame=[]))
    monkeypatch.setattr(fp8lab.bench.table, "reference_speed", lambda: "not measured")
    bench_inspect(size=width, rounds=1)
    block = models[0][0]
    assert [(m.in_features, m.out_features) for m in block if isinstance(m, nn.Linear)] == [
        (width, 3 * width), (3 * width, width), (width, 4 * width), (4 * width, width)]
