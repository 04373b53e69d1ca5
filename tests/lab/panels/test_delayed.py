"""fp8lab.lab.panels.delayed: notebook 03's stream under delayed scaling, computed, and what a drag moves in place."""

from __future__ import annotations

from fp8lab.lab.panels.delayed import DelayedPanel
from tests.lab.drawings import whole_drawings


def _run(**kw):
    panel = DelayedPanel()
    values = {"history": 16, "algo": "max", "spike": 20, "drift": 0.0, "fmt": "e4m3", "margin": 0, **kw}
    return panel, panel.compute(**values)["df"]


def test_history_one_scales_each_step_with_the_previous_steps_amax():
    _, df = _run(history=1)
    assert df["scale amax (delayed)"].iloc[0] == df["amax"].iloc[0]  # an empty history: the current amax
    assert df["scale amax (delayed)"].iloc[1:].tolist() == df["amax"].iloc[:-1].tolist()


def test_the_spike_clips_on_its_own_step_and_max_keeps_it_for_the_history_length():
    panel, df = _run(history=8, spike=100)
    spike = panel.steps // 4
    assert df.loc[spike, "overflow (delayed)"] == df["overflow (delayed)"].max() > 0.5  # scaled for a 100x smaller amax
    assert (df["overflow (delayed)"].iloc[spike + 1:spike + 9] == 0).all()  # while the spike's amax is in the history
    held = df["scale amax (delayed)"].iloc[spike + 1:spike + 9]
    assert (held == df.loc[spike, "amax"]).all()  # the spike's amax rules the next 8 steps
    assert df.loc[spike + 9, "scale amax (delayed)"] < df.loc[spike, "amax"]


def test_the_description_counts_the_steps_that_clipped():
    panel, df = _run(history=4, spike=100)
    clipped = int((df["overflow (delayed)"] > 0).sum())
    assert f"{clipped} ({clipped - 1} besides the spike step {panel.steps // 4})" in panel.describe({"df": df})


def test_every_control_redraws_in_place_with_the_new_curves():
    panel = DelayedPanel()
    panel.refresh()
    whole = whole_drawings(panel)
    for control, value in (("history", 1), ("spike", 1e4), ("fmt", "e5m2"), ("margin", 2)):
        df = panel.update(**{control: value})["df"]
        amax, delayed = panel._figure[1][0], panel._figure[1][1]
        assert amax.lines[1].get_ydata().tolist() == df["scale amax (delayed)"].tolist()
        assert delayed.lines[1].get_ydata().tolist() == df["sqnr delayed"].tolist()
        clipped = df[df["overflow (delayed)"] > 0]
        assert amax.collections[0].get_offsets()[:, 0].tolist() == clipped["step"].tolist()
    assert whole == []
