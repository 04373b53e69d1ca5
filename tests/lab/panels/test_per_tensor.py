"""fp8lab.lab.panels.per_tensor: notebook 02's per-tensor panel computed, and what a drag moves in place."""

from __future__ import annotations

import math

import pytest
import torch

from fp8lab.lab.panels.per_tensor import PerTensorPanel
from tests.lab.drawings import whole_drawings


def _compute(panel, **kw):
    values = {"distribution": "normal", "outliers": 0.0, "placement": "channels", "fmt": "e4m3", "rule": "exact",
              "margin": 0, "normalize": False, **kw}
    return panel.compute(**values)


def test_the_scale_is_amax_over_448_times_the_margin():
    panel = PerTensorPanel()
    d = _compute(panel)
    amax = float(d["x"].abs().max())
    assert float(d["q"].scale) == pytest.approx(amax / 448, rel=1e-6)
    d2 = _compute(panel, margin=2)
    assert float(d2["q"].scale) == pytest.approx(4 * amax / 448, rel=1e-6)
    assert "x 2^2" in panel.describe(d2)


def test_outliers_flush_the_ordinary_channels_and_dividing_by_each_channels_amax_saves_them():
    panel = PerTensorPanel()
    d = _compute(panel, outliers=1e5)
    saved = _compute(panel, outliers=1e5, normalize=True)
    keep = torch.ones(d["x"].shape[1], dtype=torch.bool)
    keep[d["outlier_channels"]] = False
    # E4M3 flushes what lies under half its smallest subnormal: 2^-10 of the scale's unit amax / 448
    under = float(d["x"].abs().max()) / 448 * 2.0 ** -10
    expected = float((d["x"][:, keep].abs() < under).double().mean())
    assert d["report"]["ordinary_underflow"] == pytest.approx(expected, abs=0.01) and expected > 0.3
    assert saved["report"]["ordinary_underflow"] < 0.01
    assert torch.all(saved["x"].abs().amax(0) == 1.0)  # every channel divided by its own amax


def test_a_drag_moves_the_histogram_and_window_in_place_and_another_format_draws_anew():
    panel = PerTensorPanel()
    panel.refresh()
    whole = whole_drawings(panel)
    d = panel.update(outliers=1e4)
    ax = panel._figure[1]
    hi = math.log2(d["q"].fmt.max_value * float(d["q"].scale))
    clips = ax.patches[3]  # the clipping span starts at the scaled max
    assert clips.get_x() == hi
    assert ax.get_title() == f"|x| against the e4m3 window (scale {float(d['q'].scale):.3g})"
    assert whole == []
    panel.update(fmt="e5m2")
    assert whole == [1]


def test_the_cliff_panel_builds_every_table_when_made_so_a_click_only_draws(monkeypatch):
    """CliffPanel measures every (distribution, placement, GEMM) its controls offer when it is made: after that no
    click samples or quantizes anything (sample is broken here and every control's every value still draws), and
    each click's table is the one a fresh measurement of that key gives."""
    from fp8lab.lab.panels import per_tensor, sweep_values

    panel = per_tensor.CliffPanel()
    keys = panel.keys()
    assert len(keys) == len(set(keys)) == 4 * 3 * 2 and set(panel._cache) == set(panel._published) == set(keys)
    tables = {key: panel.table(*key) for key in keys}

    def no_sampling(*args, **kwargs):
        raise AssertionError("a click sampled a new tensor: its table was not built when the panel was made")

    monkeypatch.setattr(per_tensor, "sample", no_sampling)
    for control, values in sweep_values(panel).items():
        for value in values:
            panel.update(**{control: value})
    monkeypatch.undo()
    fresh = per_tensor.CliffPanel.__new__(per_tensor.CliffPanel)
    fresh.shape, fresh._cache, fresh._published = panel.shape, {}, {}
    for key in (keys[0], keys[-1]):  # (the first and last built: a table does not depend on what was built before)
        assert fresh.table(*key).equals(tables[key])
