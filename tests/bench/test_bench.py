"""fp8lab.bench (the package's __init__): the `bench` command's argument checks and its dispatch to each
benchmark (the benchmarks themselves replaced by recorders here: tests never time anything)."""

import argparse

import pytest

from fp8lab import bench


def test_integer_types_name_what_they_take():
    assert bench.positive_int("3") == 3 and bench.non_negative_int("0") == 0
    with pytest.raises(argparse.ArgumentTypeError, match="positive integer"):
        bench.positive_int("0")
    with pytest.raises(argparse.ArgumentTypeError, match="0 or more"):
        bench.non_negative_int("-1")
    with pytest.raises(argparse.ArgumentTypeError, match="not an integer"):
        bench.positive_int("2.5")


@pytest.mark.parametrize("argv", [["quantize", "4"], ["fp6"], ["gemm", "--size", "0"], ["gemm", "--period-ms", "5"],
                                  ["room"], ["gemm", "--parts"]])
def test_bad_command_lines_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    assert exit_.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_parts_reaches_bench_train(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "bench_train", lambda **kw: calls.append(kw) or [])
    assert bench.main(["train", "--parts", "--only", "unseen_mlp", "--rounds", "2"]) == 0
    assert bench.main(["train"]) == 0
    assert calls == [{"rounds": 2, "models": ("unseen_mlp",), "parts": True}, {"models": None, "parts": False}]


def test_size_and_rounds_reach_the_benchmark(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "bench_quantize", lambda **kw: calls.append(kw) or [])
    assert bench.main(["quantize", "--size", "64", "--rounds", "2"]) == 0
    assert calls == [{"size": 64, "rounds": 2}]
    assert bench.main(["quantize"]) == 0
    assert calls[-1] == {}  # each benchmark's own defaults
