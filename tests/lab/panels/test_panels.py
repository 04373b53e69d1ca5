"""fp8lab.lab.panels (the package): the registry of panels, the values sweep_values gives each control, and which
panels redraw while a slider moves."""

from __future__ import annotations

import ipywidgets as W

from fp8lab.lab import panels
from fp8lab.lab.panels import LIVE_PANELS, PANELS, Panel, sweep_values


def test_every_registered_panel_is_a_public_panel_class():
    assert len(PANELS) == len(set(PANELS.values()))
    for name, cls in PANELS.items():
        assert issubclass(cls, Panel), name
        assert cls.__name__ in panels.__all__, name
    assert set(LIVE_PANELS) == {n for n, cls in PANELS.items() if cls.live_sliders}
    assert "placement" not in LIVE_PANELS  # it quantizes anew on release only


def test_sweep_values_covers_each_control_by_its_kind():
    class Toy(Panel):
        def __init__(self) -> None:
            super().__init__(n=W.IntSlider(value=3, min=0, max=10), pick=W.Dropdown(options=[("a", 1), ("b", 2)]),
                             on=W.Checkbox(value=True), many=W.SelectMultiple(options=["x", "y", "z", "w"],
                                                                               value=["y"]))

        def compute(self, **values) -> dict:
            return values

    v = sweep_values(Toy())
    assert v["n"] == [0, 3, 5, 10]
    assert v["pick"] == [1, 2]
    assert v["on"] == [False, True]
    assert v["many"] == [("x",), ("x", "y", "z"), ("y",)]
