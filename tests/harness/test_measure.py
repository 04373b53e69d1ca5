"""fp8lab.harness.measure: `python -m fp8lab measured`'s options, the shipped tables it prints, and what --write
writes (the training stubbed, the files in tmp_path: never the package's)."""

import json

import pandas as pd
import pytest

from fp8lab.harness import measure, tables
from fp8lab.training import measured, shipped


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RUNS", tmp_path)
    monkeypatch.setattr(measure, "RUNS", tmp_path)
    monkeypatch.setattr(measure, "machine_line", lambda state: f"a test machine, {state}")
    yield tmp_path
    shipped.read_table.cache_clear()


def test_the_parts_and_a_part_not_among_them(capsys):
    assert list(measure.PARTS) == ["cliff", "mismatch", "published", "flush", "tokens", "both"]
    with pytest.raises(SystemExit) as exit_:
        measure.main(["--write", "--part", "cliffs"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'cliffs'" in err
    assert "'all', 'cliff', 'mismatch', 'published', 'flush', 'tokens', 'both'" in err


@pytest.mark.slow
def test_without_write_it_prints_the_shipped_tables_and_writes_nothing(capsys, monkeypatch):
    monkeypatch.setattr(measure, "write_table", lambda *a, **k: pytest.fail("wrote a table"))
    assert measure.main([]) == 0
    out = capsys.readouterr().out
    for on in (measured.MEASURED_ON, measured.MISMATCH_ON, measured.PUBLISHED_ON, measured.TOKENS_ON,
               measured.BOTH_ON):
        assert f"measured on: {on}\n" in out
    assert measured.recovery().to_string(index=False) in out
    assert measured.mismatch().to_string(index=False) in out


def test_write_mismatch_trains_each_seed_and_writes_its_losses_to_6_digits(runs, monkeypatch, capsys):
    calls = []

    class Result:
        def __init__(self, seed):
            self.seed = seed

        def final_loss(self):
            return {"tensorwise": 0.123456789 + self.seed, "rowwise": 1 / 3}

    def train(recipes, seed, sink_magnitude, progress, monitor_every):
        calls.append((tuple(recipes), seed, sink_magnitude))
        return Result(seed)

    monkeypatch.setattr(measure, "train", train)
    assert measure.main(["--write", "--part", "mismatch", "--seeds", "2"]) == 0
    assert calls == [(tuple(measured.MISMATCH_RUNS), s, measured.MISMATCH_SINKS) for s in (0, 1)]
    assert [p.name for p in runs.iterdir()] == ["mismatch.json"]
    data = json.loads((runs / "mismatch.json").read_text())
    assert data["columns"] == ["seed", "run", "loss"] and data["measured_on"].startswith("a test machine, ")
    assert data["rows"] == [[0, "tensorwise", 0.123457], [0, "rowwise", 0.333333],
                            [1, "tensorwise", 1.12346], [1, "rowwise", 0.333333]]
    assert f"wrote the mismatch table in {runs}" in capsys.readouterr().out


def test_write_cliff_writes_the_cliff_and_the_recovery_tables(runs, monkeypatch):
    sweep = pd.DataFrame({"seed": [0, 1], "sinks": [0.0, 1e6], "run": ["fp32", "tensorwise"],
                          "loss": [0.0402234567, 0.39], "loss_short": [0.05, 1 / 7]})
    seeds_seen = []
    monkeypatch.setattr(measure, "cliff_sweep", lambda seeds: seeds_seen.append(seeds) or sweep)
    history = pd.DataFrame({"history": [1, 1, 4, 4], "step": [0, 1, 0, 1], "underflow": [0.5, 0.0, 0.5, 0.5]})
    monkeypatch.setattr(measure, "history_sweep", lambda: history)
    monkeypatch.setattr(measure, "steps_to_recover", lambda s: 1 if s.iloc[-1] == 0 else None)
    assert measure.main(["--write", "--part", "cliff"]) == 0
    assert seeds_seen == [(0, 1, 2)]
    assert sorted(p.name for p in runs.iterdir()) == ["cliff.json", "recovery.json"]
    cliff = json.loads((runs / "cliff.json").read_text())
    assert cliff["columns"] == measured.CLIFF_COLUMNS
    assert cliff["rows"] == [[0, 0.0, "fp32", 0.0402235, 0.05], [1, 1e6, "tensorwise", 0.39, 0.142857]]
    assert json.loads((runs / "recovery.json").read_text())["rows"] == [[1, 1], [4, None]]
