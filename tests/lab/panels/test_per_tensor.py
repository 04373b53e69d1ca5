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
