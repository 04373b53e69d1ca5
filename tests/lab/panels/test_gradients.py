"""fp8lab.lab.panels.gradients: notebook 09's gradient panel, on the smoke-sized recording."""

from __future__ import annotations

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
