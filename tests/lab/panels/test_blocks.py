"""fp8lab.lab.panels.blocks: notebook 04's block panels computed, and what a drag moves in place (their pictures are
swept in the widget tests)."""

from __future__ import annotations

import pytest

from fp8lab.lab.panels.blocks import BlockPanel, BlockSweepPanel, activation_shape, block_table
from tests.lab.drawings import whole_drawings


def test_the_block_table_scale_costs_by_hand_and_blocks_beat_one_scale():
    m, k = activation_shape()
    t = block_table(("per-tensor", "1x128", "1x32"))
    assert t.loc["per-tensor", "scale_bits_per_element"] == pytest.approx(32 / (m * k))
    assert t.loc["1x128", "scale_bits_per_element"] == pytest.approx(32 / 128)
    assert t.loc["1x32", "scale_bits_per_element"] == pytest.approx(8 / 32)  # E8M0 scales
    assert t.loc["1x32", "scale_rule"] == "rceil"
    assert t.loc["1x128", "ordinary_sqnr_db"] > t.loc["per-tensor", "ordinary_sqnr_db"] + 10
    assert t.loc["per-tensor", "ordinary_underflow"] > t.loc["1x128", "ordinary_underflow"]


def test_one_block_size_gives_one_scale_per_block():
    panel = BlockPanel()
    m, k = panel.shape
    data = panel.compute(block="1x128", fmt="e4m3", scales="fp32, exact", distribution="normal", outliers=1e5)
    assert tuple(data["q"].scale.shape) == (m, k // 128)
    assert data["report"]["scale_bits_per_element"] == pytest.approx(32 / 128)
    assert "dB" in panel.describe(data)


@pytest.mark.slow  # every strategy at every block size (seconds)
def test_the_sweep_names_the_cheapest_block_that_reaches_the_target():
    panel = BlockSweepPanel()
    data = panel.compute(fmt="e4m3", distribution="normal", outliers=1e5, measure="ordinary channels", threshold=20)
    df = data["df"]
    ok = df[(df.strategy == "fp32 scales, exact") & (df.sqnr_db >= 20)]
    assert data["cheapest"] == ok.loc[ok.scale_bits_per_element.idxmin(), "block"]
    assert set(df.strategy) == {"fp32 scales, exact", "E8M0 scales, rceil", "E8M0 scales, floor (OCP)"}
    unreachable = panel.compute(fmt="e4m3", distribution="normal", outliers=1e5, measure="ordinary channels",
                                threshold=1000)
    assert unreachable["cheapest"] is None


def test_a_drag_of_the_target_moves_its_line_and_legend_in_place_and_another_format_draws_anew():
    panel = BlockSweepPanel()
    panel.refresh()
    whole = whole_drawings(panel)
    panel.update(threshold=44)
    assert whole == []
    ax = panel._figure[1][0]
    target = next(line for line in ax.lines if line.get_gid() == "threshold")
    assert list(target.get_ydata()) == [44, 44]
    assert ax.get_legend().get_texts()[-1].get_text() == "44 dB"
    assert ax.get_ylim()[1] >= 44  # the limits follow the target, as a new drawing's do
    panel.update(fmt="e5m2")
    assert len(whole) == 1

