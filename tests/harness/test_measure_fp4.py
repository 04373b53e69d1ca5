"""fp8lab.harness.measure_fp4: `python -m fp8lab measured_fp4`'s options, the shipped tables it prints, and what
--write writes (the training and the process pool stubbed, the files in tmp_path: never the package's)."""

import itertools
import json
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from fp8lab.harness import measure_fp4, tables
from fp8lab.training import measured_fp4, shipped


class _Pool:
    """multiprocessing's Pool in this process: starmap in order."""

    def __init__(self, jobs):
        self.jobs = jobs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def starmap(self, fn, tasks):
        return list(itertools.starmap(fn, tasks))


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RUNS", tmp_path)
    monkeypatch.setattr(measure_fp4, "machine_line", lambda state: f"a test machine, {state}")
    pools = []
    context = SimpleNamespace(Pool=lambda jobs: pools.append(jobs) or _Pool(jobs))
    monkeypatch.setattr(measure_fp4, "multiprocessing", SimpleNamespace(get_context=lambda how: context))
    yield tmp_path, pools
    shipped.read_table.cache_clear()


def test_the_parts_and_a_part_not_among_them(capsys):
    assert {name: table for name, (table, _) in measure_fp4.PARTS.items()} == {
        "parts": "fp4_parts", "dy": "fp4_dy", "backward": "fp4_backward", "dy_control": "fp4_dy_control",
        "split": "fp4_split"}
    with pytest.raises(SystemExit) as exit_:
        measure_fp4.main(["--part", "dgrad"])
    assert exit_.value.code == 2
    assert "invalid choice: 'dgrad'" in capsys.readouterr().err


def test_without_write_it_prints_the_shipped_tables_and_writes_nothing(capsys, monkeypatch):
    monkeypatch.setattr(measure_fp4, "write_table", lambda *a, **k: pytest.fail("wrote a table"))
    assert measure_fp4.main([]) == 0
    out = capsys.readouterr().out
    for name, frame, on in (("parts", measured_fp4.parts, measured_fp4.PARTS_ON),
                            ("dy", measured_fp4.dy_runs, measured_fp4.DY_ON),
                            ("split", measured_fp4.split, measured_fp4.SPLIT_ON)):
        assert f"{name}, measured on: {on}\n{measured_fp4.means(frame()).to_string()}\n" in out


def test_write_trains_each_model_and_seed_and_writes_one_table(runs, monkeypatch, capsys):
    tmp, pools = runs
    monkeypatch.setattr(measure_fp4, "task", lambda part, model, seed: [(model, seed, part, 0.5, 0.25, 0.125)])
    assert measure_fp4.main(["--write", "--part", "dy", "--seeds", "2", "--jobs", "3"]) == 0
    assert pools == [3] and [p.name for p in tmp.iterdir()] == ["fp4_dy.json"]
    data = json.loads((tmp / "fp4_dy.json").read_text())
    assert data["columns"] == measured_fp4.COLUMNS and data["measured_on"].startswith("a test machine, ")
    assert data["rows"] == [[m, s, "dy", 0.5, 0.25, 0.125] for m in ("mlp", "llm_like") for s in (0, 1)]
    assert "wrote fp8lab/training/runs/fp4_dy.json" in capsys.readouterr().out


def test_a_task_trains_its_parts_runs_and_rounds_to_6_digits(monkeypatch):
    seen = []

    def train_parts(runs, model, seed):
        seen.append((list(runs), model, seed))
        table = pd.DataFrame([[1 / 3, 2 / 3, 0.1234567]], index=["fc1 split"], columns=measured_fp4.COLUMNS[3:])
        return SimpleNamespace(table=table)

    monkeypatch.setattr(measure_fp4, "train_parts", train_parts)
    threads = torch.get_num_threads()
    try:
        rows = measure_fp4.task("split", "mlp", 2)
    finally:
        torch.set_num_threads(threads)
    assert seen == [(list(measure_fp4.FC1_SPLIT), "mlp", 2)]
    assert rows == [("mlp", 2, "fc1 split", 0.333333, 0.666667, 0.123457)]
