"""fp8lab.figures.plots: data in, the ax out, and what is drawn is the data (bar heights, the heatmap's cells,
the format's window edges at its constants).

Every panel's axes (units, tick labels): tests/lab/test_widgets.py.
"""

import math

import numpy as np
import torch
from matplotlib.colors import to_rgb

from fp8lab.figures.axes import figure
from fp8lab.figures.plots import (
    CLIP,
    bars,
    histogram_log2,
    histogram_log2_parts,
    number_line,
    scale_heatmap,
    scale_heatmap_parts,
)
from fp8lab.numerics.formats import E4M3
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.scaling import PerBlock


def _ax():
    return figure(pyplot=False)[1]


def test_bars_draw_the_values_and_highlight_one():
    ax = bars({"a": 1.0, "b": 3.0, "c": 2.0}, ax=_ax(), ylabel="err", highlight="b")
    heights = [p.get_height() for p in ax.patches]
    assert heights == [1.0, 3.0, 2.0]
    assert tuple(ax.patches[1].get_facecolor()[:3]) != tuple(ax.patches[0].get_facecolor()[:3])
    assert tuple(ax.patches[1].get_facecolor()[:3]) == to_rgb(CLIP)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"] and ax.get_ylabel() == "err"


def test_scale_heatmap_shows_log2_of_each_blocks_scale():
    x = torch.ones(4, 8)
    x[:2, 4:] = 448.0  # block (0, 1) has amax 448: scale 1; the others 1/448
    q = quantize(x, E4M3, PerBlock(2, 4))
    ax = scale_heatmap(q, ax=_ax())
    grid = np.asarray(ax.images[0].get_array())
    want = torch.log2(q.scale).double().numpy()  # float32 log2, as drawn
    assert grid.shape == (2, 2) and np.array_equal(grid, want)
    assert grid[0, 1] == 0.0 and math.isclose(grid[0, 0], -math.log2(448), rel_tol=1e-6)
    assert ax.get_title() == "scales, 2x4 blocks"


def test_histogram_window_edges_sit_at_the_formats_constants():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    ax = histogram_log2(x, fmt=E4M3, scale=1.0, ax=_ax())
    spans = {p.get_label(): (p.get_x(), p.get_x() + p.get_width()) for p in ax.patches if p.get_label() != "|x|"}
    assert spans["subnormal"] == (-10.0, -6.0)  # half the smallest subnormal (2^-9 / 2) .. the smallest normal
    assert spans["e4m3 normal range"][0] == -6.0
    assert math.isclose(spans["e4m3 normal range"][1], math.log2(448))
    assert math.isclose(spans["clips to max"][0], math.log2(448))
    ax2 = histogram_log2(x, fmt=E4M3, scale=2.0**-3, ax=_ax())  # a scale moves the window by its log2
    moved = {p.get_label(): p.get_x() for p in ax2.patches if p.get_label() == "subnormal"}
    assert moved["subnormal"] == -13.0


def test_the_plots_draw_the_parts_a_caller_hands_them_as_they_draw_their_own():
    """histogram_log2(parts=...) and scale_heatmap(parts=...) draw those parts (a caller that has them computes them
    once): the same artists' data as a drawing of the values they came from."""
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    other = x * 1e3
    given = histogram_log2(x, fmt=E4M3, scale=1.0, ax=_ax(), parts=histogram_log2_parts(other, fmt=E4M3, scale=1.0))
    own = histogram_log2(other, fmt=E4M3, scale=1.0, ax=_ax())
    stairs = [next(p for p in ax.patches if p.get_label() == "|x|").get_data() for ax in (given, own)]
    assert all(np.array_equal(a, b) for a, b in zip(stairs[0], stairs[1], strict=True))
    assert given.get_xlim() == own.get_xlim() and given.get_title() == own.get_title()
    q, q_other = quantize(x, E4M3, PerBlock(1, 32)), quantize(other, E4M3, PerBlock(16, 16))
    given = scale_heatmap(q, ax=_ax(), parts=scale_heatmap_parts(q_other))
    own = scale_heatmap(q_other, ax=_ax())
    assert np.array_equal(given.images[0].get_array(), own.images[0].get_array())
    assert given.get_title() == own.get_title() == "scales, 16x16 blocks"


def test_number_line_counts_each_formats_positive_values():
    ax = number_line(["e4m3", "e5m2"], ax=_ax(), lo=-20, hi=17)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["e4m3", "e5m2"]
    # E4M3: codes 0x01..0x7E (0x7F is NaN); E5M2: 0x01..0x7B (0x7C is infinity)
    assert [t.get_text() for t in ax.texts] == ["126 values", "123 values"]
