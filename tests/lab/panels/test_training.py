"""fp8lab.lab.panels.training: notebook 06's cliff panel read from the shipped runs (the live training panel runs in
the widget and lesson tests)."""

from __future__ import annotations

import pytest

from fp8lab.lab.panels.training import TrainingCliffPanel
from fp8lab.training.measured import cliff


def test_the_marked_point_is_the_mean_over_seeds_against_its_no_sink_mean():
    panel = TrainingCliffPanel()
    d = panel.compute(placement="channels", recipes=("fp32", "tensorwise", "blockwise"), measure="relative",
                      sinks=1e6)
    df = cliff()
    tw = df[df.run == "tensorwise"]
    at, clean = tw[tw.sinks == 1e6].loss.mean(), tw[tw.sinks == 0.0].loss.mean()
    assert d["point"]["tensorwise"]["mean"] == pytest.approx(at, rel=1e-12)
    assert d["point"]["tensorwise"]["change vs no sinks"] == pytest.approx(at / clean - 1, rel=1e-12)
    assert d["point"]["tensorwise"]["seed 0"] == float(tw[(tw.sinks == 1e6) & (tw.seed == 0)].loss.iloc[0])
    assert set(d["df"].run) == {"fp32", "tensorwise", "blockwise"} and d["seeds"] == 3
    with pytest.raises(ValueError, match="at least one recipe"):
        panel.compute(placement="channels", recipes=(), measure="relative", sinks=1e6)
