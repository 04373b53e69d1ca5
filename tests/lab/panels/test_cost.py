"""fp8lab.lab.panels.cost: the cost panel's table and comparison (the times it measures are stood in for here:
timing is not asserted)."""

from __future__ import annotations

import pandas as pd

from fp8lab.lab.panels.cost import CostPanel
from fp8lab.training.cost import COST_RECIPES, PARALLEL


def test_the_panel_computes_the_cost_table_at_its_k_and_answers_from_it():
    panel = CostPanel()
    panel._measured = pd.DataFrame(  # stand-in times: per-tensor twice as fast
        {"quantize ms": [0.0] + [1.0] * len(COST_RECIPES), "GEMM ms": [1.0] * (1 + len(COST_RECIPES)),
         "backend": ["torch.mm"] + ["emulated"] * len(COST_RECIPES)},
        index=["fp32 (no FP8)", *COST_RECIPES])
    panel._measured.loc["tensorwise", "quantize ms"] = 0.5
    data = panel.compute(k=1024, parallel=PARALLEL[0])
    assert data["table"].loc["blockwise", "scale multiplies per output"] == 1024 // 128
    assert data["table"].loc["tensorwise", "scale multiplies per output"] == 1
    c = data["comparison"]
    assert c.loc["scale multiplies per output element", "cheaper"] == "tensorwise"
    assert c.loc["quantize ms on this machine (emulated)", "cheaper"] == "tensorwise"
    assert data["answer"].startswith("tensorwise is cheaper in: ")


def test_a_k_drag_moves_the_bars_drawn_and_sets_the_title():
    panel = CostPanel()
    panel._measured = pd.DataFrame(  # stand-in times (the panel times quantization once)
        {"quantize ms": [0.0] + [1.0] * len(COST_RECIPES), "GEMM ms": [1.0] * (1 + len(COST_RECIPES)),
         "backend": ["torch.mm"] + ["emulated"] * len(COST_RECIPES)},
        index=["fp32 (no FP8)", *COST_RECIPES])
    panel.update(k=256)
    axes = panel._figure[1]
    bars = [list(ax.patches) for ax in axes]
    data = panel.update(k=16384)
    assert [list(ax.patches) for ax in axes] == bars  # moved, not drawn again
    multiplies = data["table"]["scale multiplies per output"].astype(float).tolist()
    assert [b.get_height() for b in axes[1].patches] == multiplies
    assert axes[1].get_title() == "scale multiplies, K=16384"
