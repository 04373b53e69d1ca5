"""`bench widgets` (fp8lab/bench/widgets.py) measures what a learner's changes cost: a live panel's sliders dragged
value by neighbouring value, across and back as fp8lab.bench.drag drags in a running kernel, and the other controls
clicked; the live target judged on the drags. Tests check what is measured and reported, never a time.
"""

from __future__ import annotations

import itertools

import ipywidgets as W
import pytest

import fp8lab.lab.panels as panels_module
from fp8lab.bench.drag import drag_path
from fp8lab.bench.widgets import LIVE_MEDIAN_MS, LIVE_P95_MS, bench_widgets, changes, slider_values
from fp8lab.lab.panels import PANELS, RoundingPanel, sweep_values
from fp8lab.lab.panels.base import SLIDERS


def test_a_drag_path_goes_to_each_end_and_back_one_neighbour_at_a_time():
    options = list("abcde")
    path = drag_path(options, 2)
    assert path == list("dedcbabc")
    steps = [options.index(v) for v in [options[2], *path]]
    assert all(abs(b - a) == 1 for a, b in itertools.pairwise(steps)), steps
    assert path[-1] == options[2] and {path.count(v) for v in "bcd"} == {2} and path.count("a") == path.count("e") == 1
    assert drag_path(options, 0) == list("bcdedcba") and drag_path(options, 2, sweeps=2) == path * 2


# the gradient panel trains notebook 09's models when it is made (tens of seconds on a busy machine)
SLOW_TO_MAKE = ("gradients",)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_TO_MAKE else n
                                  for n in PANELS])
def test_every_live_panels_sliders_are_dragged_and_its_other_controls_clicked(name):
    make = PANELS[name]
    panel = make()
    drags, clicks = changes(panel)
    sliders = {k for k, c in panel.controls.items() if isinstance(c, SLIDERS)}
    if not make.live_sliders:  # its sliders send their value on release: each value is one change
        assert drags == {} and clicks == sweep_values(panel)
        return
    assert set(drags) == sliders and set(clicks) == set(panel.controls) - sliders
    for control, path in drags.items():
        values = slider_values(panel.controls[control])
        start = values.index(panel.controls[control].value)
        steps = [values.index(v) for v in [values[start], *path]]
        assert all(abs(b - a) == 1 for a, b in itertools.pairwise(steps)), (control, steps)
        assert {0, len(values) - 1} <= set(steps) and path[-1] == values[start], control


def test_slider_values_follow_the_slider_and_leave_other_controls_out():
    assert slider_values(W.SelectionSlider(options=[("a", 1), ("b", 2), ("c", 3)], value=2)) == [1, 2, 3]
    assert slider_values(W.IntSlider(min=2, max=8, step=3, value=5)) == [2, 5, 8]
    assert slider_values(W.IntRangeSlider(min=-3, max=3, value=(-1, 1))) == [(-1, h) for h in range(-1, 4)]
    assert slider_values(W.FloatSlider(min=0.0, max=1.0, step=0.25, value=0.5)) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert slider_values(W.Dropdown(options=["x", "y"])) is None and slider_values(W.Checkbox()) is None


def test_the_benchmark_times_each_change_of_the_drag_in_order_and_judges_the_live_target(monkeypatch, capsys):
    sent: list[dict] = []

    class Recorded(RoundingPanel):
        def update(self, **values):
            sent.append(values)
            return super().update(**values)

    monkeypatch.setitem(PANELS, "rounding", Recorded)
    (row,) = bench_widgets(rounds=1, panels=("rounding",))
    path = drag_path(slider_values(Recorded().controls["draws"]), 2)  # from 16, its default
    assert sent == [{"draws": d} for d in path]  # one update per value, in the drag's order
    assert row["changes"] == "drag draws" and row["updates"] == len(path) == 10
    assert 0 < row["median ms"] <= row["p95 ms"] <= row["max ms"]
    assert 0 < row["cpu median ms"] <= row["cpu p95 ms"]
    assert row["render ms"] > 0 and all(row[f"{part} ms"] >= 0 for part in ("compute", "draw"))
    met = row["median ms"] <= LIVE_MEDIAN_MS and row["p95 ms"] <= LIVE_P95_MS
    assert row["live target"] == ("met" if met else "missed")
    out = capsys.readouterr().out
    assert "| rounding" in out and "reference: fp32 2048^3 mm" in out
    assert panels_module.PANELS is PANELS
    with pytest.raises(ValueError, match="unknown panels \\['nope'\\]; valid: timing, bits"):
        bench_widgets(panels=("nope",))


def test_a_live_panel_without_a_slider_is_judged_on_its_clicks_and_a_release_panel_not_at_all():
    rows = {r["panel"]: r for r in bench_widgets(rounds=1, panels=("export", "timing"))}
    export = rows["export"]
    assert export["changes"] == "clicks" and export["live target"] in ("met", "missed")
    assert export["updates"] == sum(len(v) for v in sweep_values(PANELS["export"]()).values())
    assert rows["timing"]["live"] == "no (release/button)" and rows["timing"]["live target"] == "-"
