"""Progress bars on the work that runs longer than a few seconds: they are on by default, appear only
after fp8lab.progress.DELAY seconds, and stay, full, when the work is done (leave=True)."""

from __future__ import annotations

import inspect as signature_of

import pytest
import torch

import fp8lab.progress
from fp8lab.training import capstone
from fp8lab.training.readiness import inspect
from fp8lab.training.train import train


def _last_frame(err: str) -> str:
    """What a terminal shows last: the text after the final carriage return."""
    assert err.endswith("\n"), "a bar left on screen ends its line"
    return err.rstrip("\n").split("\r")[-1]


def test_progress_is_on_by_default_where_work_runs_long():
    for fn in (train, capstone.train_case, inspect):
        assert signature_of.signature(fn).parameters["progress"].default is True, fn.__name__


def test_a_training_bar_stays_full_when_done(monkeypatch, capsys):
    monkeypatch.setattr(fp8lab.progress, "DELAY", 0.0)
    train("tensorwise", steps=3, batch=8, monitor_every=None)
    last = _last_frame(capsys.readouterr().err)
    assert "mlp: tensorwise" in last and "100%" in last and "3/3" in last, last


def test_the_capstone_and_inspect_bars_stay_full_when_done(monkeypatch, capsys):
    monkeypatch.setattr(fp8lab.progress, "DELAY", 0.0)
    case = capstone.make_case("llm_like")
    capstone.train_case(case, ["fp32", "tensorwise"], steps=2)
    last = _last_frame(capsys.readouterr().err)
    assert "llm_like: fp32, tensorwise" in last and "2/2" in last, last
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    inspect(model, torch.randn(16, 32), recipes=("tensorwise",))
    last = _last_frame(capsys.readouterr().err)
    assert "inspect: 2 linear calls" in last and "2/2" in last, last


@pytest.mark.parametrize("progress", [True, False])
def test_quick_work_shows_no_bar(capsys, progress):
    """Under DELAY seconds nothing is printed; progress=False never prints."""
    train("tensorwise", steps=1, batch=8, monitor_every=None, progress=progress)
    assert capsys.readouterr().err == ""
