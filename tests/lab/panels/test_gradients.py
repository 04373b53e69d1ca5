"""fp8lab.lab.panels.gradients: notebook 09's gradient panel, on the smoke-sized recording."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fp8lab.numerics.quantize import quantize
from fp8lab.training.gradients import DY_CHOICES, WHEN


@pytest.mark.slow  # records dy over two short training runs (seconds)
def test_each_value_is_shown_over_its_blocks_scale(monkeypatch):
    monkeypatch.setenv("FP8LAB_SMOKE", "1")
    from fp8lab.lab.panels.gradients import GradientPanel

    panel = GradientPanel()
    layer = panel.controls["layer"].value
    d = panel.compute(layer=layer, when=WHEN[0], choice="E4M3 per-tensor")
    dy = panel.records[layer[0]].snapshots[d["step"], layer[1]]
    q = quantize(dy, "e4m3", "per-tensor")
    assert torch.equal(d["q"].data.view(torch.uint8), q.data.view(torch.uint8))
    rows = torch.linspace(0, dy.shape[0] - 1, min(64, dy.shape[0])).round().long()  # the sampled tokens
    assert torch.equal(d["seen"], dy[rows] / q.scale)
    assert list(d["table"].index) == [c[0] for c in DY_CHOICES]
    assert d["span"] == pytest.approx(float(torch.log2(dy.abs().max() / dy.abs()[dy != 0].min())), rel=1e-6)


@pytest.mark.slow  # records dy over two short training runs (seconds)
def test_a_drag_over_training_moves_the_histograms_stairs_as_a_new_drawing_draws_them(monkeypatch):
    monkeypatch.setenv("FP8LAB_SMOKE", "1")
    from matplotlib.patches import StepPatch

    from fp8lab.lab.panels.gradients import GradientPanel

    panel = GradientPanel()
    model, name = panel.controls["layer"].value
    assert {step for (m, n, step) in panel._tables if (m, n) == (model, name)} == set(panel.records[model].at)
    panel.update(when=WHEN[-1])
    stairs = panel._histogram_drawn[0]
    for when in WHEN[::-1]:
        panel.update(when=when)
        assert panel._histogram_drawn[0] is stairs  # moved, not drawn again
        fresh = GradientPanel()
        fresh.update(**panel.values())
        ax, new = panel._figure[1][0], fresh._figure[1][0]
        shown, drawn = (next(p for p in a.patches if isinstance(p, StepPatch)) for a in (ax, new))
        assert np.array_equal(shown.get_data().values, drawn.get_data().values)
        assert ax.get_ylim() == new.get_ylim() and ax.get_title() == new.get_title()
        assert tuple(ax.dataLim.intervaly) == tuple(new.dataLim.intervaly)
        assert fresh.image.value == panel.image.value
