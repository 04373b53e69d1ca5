"""fp8lab.lab.panels.gemm: notebook 05's GEMM panels computed, and what a drag moves in place."""

from __future__ import annotations

import torch
from matplotlib.colors import to_rgba

from fp8lab.figures import plots
from fp8lab.lab.panels.gemm import GemmOperandsPanel, GemmPanel
from fp8lab.training.operands import operand_losses
from tests.lab.drawings import whole_drawings


def test_the_operands_panel_shows_what_each_gemm_keeps_of_x():
    panel = GemmOperandsPanel()
    d = panel.compute(recipe="rowwise", outliers=1e6)
    direct = operand_losses(d["x"], "rowwise", d["outlier_channels"])
    assert torch.equal(d["views"]["fprop"]["values"], direct["fprop"]["values"])
    assert d["views"]["wgrad"]["label"] == "per column (one channel)"
    assert d["formats"] == {"input": "E4M3", "weight": "E4M3", "grad_output": "E4M3"}
    hp = panel.compute(recipe="rowwise_with_gw_hp", outliers=1e6)
    assert "high precision: nothing flushes" in panel.describe(hp)


def test_sinks_meeting_zero_weight_rows_break_one_scale_not_blocks():
    panel = GemmPanel()
    d = panel.compute(k=1024, outliers=1e5, distribution="normal", weights="zero rows")
    e = d["errors"]
    assert e["tensorwise"] > 2 * e["blockwise"]  # per tensor the sinks set every scale; blocks, one tile of 8
    assert d["zeroed"] == d["outlier_channels"] and d["zeroed"]
    clean = panel.compute(k=256, outliers=0.0, distribution="normal", weights="random")["errors"]
    assert clean["tensorwise"] < 0.1 and clean["blockwise"] < 0.1


def test_the_gemm_bars_move_in_place_highlighting_the_largest_error():
    panel = GemmPanel()
    panel.refresh()
    whole = whole_drawings(panel)
    errors = panel.update(outliers=1e5)["errors"]
    bars = panel._figure[1].patches
    assert [b.get_height() for b in bars] == list(errors.values())
    worst = list(errors).index(max(errors, key=errors.get))
    expected = [plots.CLIP if i == worst else plots.PALETTE[i % 10] for i in range(len(bars))]
    assert [b.get_facecolor() for b in bars] == [to_rgba(c) for c in expected]
    assert whole == []


def test_the_operand_maps_change_in_place_while_the_outliers_move():
    panel = GemmOperandsPanel()
    panel.refresh()
    whole = whole_drawings(panel)
    panel.update(outliers=1e7)
    images = [ax.images[0].get_array() for ax in panel._figure[1]]
    fresh = GemmOperandsPanel()
    fresh.update(outliers=1e7)
    assert all((a == b).all() for a, b in zip(images, [ax.images[0].get_array() for ax in fresh._figure[1]],
                                               strict=True))
    assert whole == []
    panel.update(recipe="rowwise")  # other titles: drawn anew
    assert whole == [1]


def test_the_accumulation_curves_move_in_place_until_promotion_is_switched_off():
    from fp8lab.lab.panels.gemm import AccumulationPanel

    panel = AccumulationPanel()
    panel.refresh()
    whole = whole_drawings(panel)
    data = panel.update(bits=12)
    for ax, df in zip(panel._figure[1], data["frames"].values(), strict=True):
        shown = [line.get_ydata().tolist() for line in ax.lines[:3]]
        assert shown == [part["relative error"].tolist() for _, part in df.groupby("accumulation", sort=False)][:3]
        assert ax.texts[-1].get_text() == "12-bit accumulator, promoted every 128"
    assert whole == []
    panel.update(promote=0)  # one curve fewer: drawn anew
    assert whole == [1]
