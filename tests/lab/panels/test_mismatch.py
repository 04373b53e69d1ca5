"""fp8lab.lab.panels.mismatch: notebook 06's why-rowwise-fails panel; fc2's input measured once by fp8lab.inspect,
the losses from the shipped runs."""

from __future__ import annotations

import pytest

from fp8lab.training.measured import MISMATCH_RUNS


@pytest.mark.slow  # inspects the lesson MLP once (seconds) and computes the constant predictor's loss
def test_rowwise_flushes_fc2s_input_in_fprop_not_in_wgrad_and_the_panel_keeps_the_chosen_recipes():
    from fp8lab.lab.panels.mismatch import MismatchPanel

    panel = MismatchPanel()
    d = panel.compute(recipes=("rowwise", "rowwise_with_gw_hp"))
    f = d["flush"]
    assert list(dict.fromkeys(f.index.get_level_values(0))) == ["rowwise", "rowwise_with_gw_hp"]
    # the sinks set each token's scale (fprop, along K): the forward loses nearly all of fc2's input, while
    # wgrad (along M, a channel's tokens) keeps it: the weight gradient is for inputs the forward did not use
    assert f.loc[("rowwise", "fprop"), "underflow"] > 0.9 > 0.01 > f.loc[("rowwise", "wgrad"), "underflow"]
    assert f.loc[("rowwise_with_gw_hp", "wgrad"), "format"] == "high precision"
    assert set(d["losses"].run) == {"rowwise", "rowwise_with_gw_hp"} and set(d["all_losses"].run) == set(MISMATCH_RUNS)
    assert panel.compute(recipes=("tensorwise",))["flush"].index.get_level_values(0).unique().tolist() == ["tensorwise"]
    with pytest.raises(ValueError, match="at least one recipe"):
        panel.compute(recipes=())
