"""fp8lab.lab.panels.fp4: notebook 09's parts panel read from the shipped runs (the other fp4 panels' pictures are
swept in the widget tests)."""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.lab.panels.fp4 import PartsPanel, RoundingPanel, TwoDWeightPanel
from fp8lab.training.measured_fp4 import parts


def test_the_checkboxes_name_the_run_and_its_change_is_each_seed_against_its_bf16():
    panel = PartsPanel()
    assert PartsPanel.parts_of(True, False, True, False) == ("2d_weights", "stochastic_rounding")
    d = panel.compute(two_d=True, hadamard=False, stochastic=True, high=False, measure="final loss")
    assert d["label"] == "nvfp4 2D+SR"
    df = parts()
    by = df[df.model == "mlp"].pivot_table(index="seed", columns="run", values="final loss")
    rel = by["nvfp4 2D+SR"] / by["bf16"] - 1
    assert d["values"]["nvfp4 2D+SR"] == pytest.approx(float(rel.mean()), rel=1e-12)
    assert d["values"]["bf16"] == 0.0
    assert list(d["values"])[:2] == ["nvfp4 1x16", "nvfp4 2D+SR"]
    none = panel.compute(two_d=False, hadamard=False, stochastic=False, high=False, measure="final loss")
    assert none["label"] == "nvfp4 1x16" and list(none["values"]).count("nvfp4 1x16") == 1


def test_a_drag_moves_the_artists_drawn():
    """Two-D weights: the map's image, the points and the diagonal are the ones drawn, holding what a fresh drawing
    shows; rounding: the mean's line holds the new mean and its legend entry says the new number of draws."""
    panel = TwoDWeightPanel()
    panel.update(outliers=1.0)
    left, right = panel._figure[1]
    drawn = (list(left.images), list(right.collections), list(right.lines))
    first_lim = right.get_xlim()
    panel.update(outliers=100.0)
    assert (list(left.images), list(right.collections), list(right.lines)) == drawn
    fresh = TwoDWeightPanel()
    fresh.update(outliers=100.0)
    f_left, f_right = fresh._figure[1]
    assert np.array_equal(left.images[0].get_array(), f_left.images[0].get_array())
    assert left.get_title() == f_left.get_title()
    assert np.array_equal(right.collections[0].get_offsets(), f_right.collections[0].get_offsets())
    assert np.array_equal(right.lines[0].get_xydata(), f_right.lines[0].get_xydata())
    assert right.get_xlim() == f_right.get_xlim() != first_lim and right.get_ylim() == f_right.get_ylim()
    rounding = RoundingPanel()
    rounding.update(draws=4)
    ax = rounding._figure[1][0]
    lines = list(ax.lines)
    data = rounding.update(draws=256)
    assert list(ax.lines) == lines
    line = next(line for line in ax.lines if line.get_gid() == "stochastic")
    assert np.array_equal(line.get_ydata(), data["sr"].double().numpy())
    assert not np.array_equal(line.get_ydata(), rounding.compute(draws=4)["sr"].double().numpy())
    assert "stochastic, mean of 256 draws" in [t.get_text() for t in ax.get_legend().get_texts()]
    fresh_rounding = RoundingPanel()
    fresh_rounding.update(draws=256)
    assert ax.get_ylim() == fresh_rounding._figure[1][0].get_ylim()
