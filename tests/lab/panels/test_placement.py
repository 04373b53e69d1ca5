"""fp8lab.lab.panels.placement: where the sinks sit decides which scales they break (fc2's input, one placement)."""

from __future__ import annotations

import pytest

from fp8lab.lab.panels.placement import PlacementPanel
from fp8lab.training.published import sinks_for


@pytest.mark.slow  # a forward of the lesson MLP and three recipes' casts (seconds)
def test_channel_sinks_break_per_token_scales_not_per_channel_ones_and_the_table_is_cached():
    panel = PlacementPanel()
    data = panel.compute(placement="channels", ratio=1e5)
    assert data["sinks"] == sinks_for(1e5)
    df = data["df"].set_index(["recipe", "gemm"])
    assert df.loc[("rowwise", "fprop"), "flushed"] > 0.1  # a token's scale is set by its sink channels
    assert df.loc[("rowwise", "wgrad"), "flushed"] < 1e-3  # a channel's scale is its own
    assert df.loc[("tensorwise", "fprop"), "flushed"] == df.loc[("tensorwise", "wgrad"), "flushed"]
    assert (df["worst"] >= df["flushed"]).all()
    assert panel.compute(placement="channels", ratio=1e5)["df"] is data["df"]
