"""fp8lab.lab.panels.gemm: notebook 05's GEMM panels computed without drawing."""

from __future__ import annotations

import torch

from fp8lab.lab.panels.gemm import GemmOperandsPanel, GemmPanel
from fp8lab.training.operands import operand_losses


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
