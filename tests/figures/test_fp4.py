"""fp8lab.figures.fp4: notebook 09's figures draw the data they are given (dy's range in log2, a block's
values and what NVFP4 keeps, the parts' bars in percent)."""

import numpy as np
import pandas as pd
import torch

from fp8lab.figures.axes import figure
from fp8lab.figures.fp4 import (
    block_bars,
    dy_range,
    error_vs_draws,
    layer_bars,
    layer_colors,
    parts_bars,
    rounding_means,
    stochastic_label,
)


def _ax():
    return figure(pyplot=False)[1]


def test_dy_range_draws_log2_and_each_formats_binades_down_from_the_top():
    ranges = pd.DataFrame({"step": [0, 1, 0], "layer": ["fc1", "fc1", "fc2"], "amax": [2.0**4, 2.0**2, 1.0],
                           "smallest": [2.0**-20, 2.0**-18, 1.0]})
    ax = dy_range(ranges, "fc1", step=1, binades={"e4m3": 17.0}, ax=_ax())
    hi, lo, fmt = (ax.lines[i].get_ydata() for i in range(3))
    assert list(hi) == [4.0, 2.0] and list(lo) == [-20.0, -18.0] and list(fmt) == [-13.0, -15.0]
    assert ax.get_title() == "fc1: dy over training"


def test_block_bars_mark_the_flushed_values():
    values = torch.tensor([1.0, -0.5, 0.5, 0.0])
    kept = torch.tensor([1.0, 0.0, 0.5, 0.0])
    ax = block_bars(values, kept, ax=_ax())
    assert [p.get_height() for p in ax.patches[:4]] == [1.0, -0.5, 0.5, 0.0]
    kept_dots, flushed = ax.collections[0].get_offsets(), ax.collections[1].get_offsets()
    assert flushed.tolist() == [[1.0, 0.0]]  # only -0.5 was nonzero and kept as 0
    assert len(kept_dots) == 3
    assert np.isclose(ax.get_ylim()[1], 1.1)


def test_parts_layer_and_draws_figures_carry_the_values():
    ax = parts_bars({"nvfp4 1x16": 0.2, "nvfp4 2D": 0.05}, spread={"nvfp4 2D": 0.01}, highlight="nvfp4 2D", ax=_ax())
    assert [p.get_height() for p in ax.patches] == [0.2, 0.05]
    assert ax.get_ylim() == (0.0, 0.25)  # top: the largest times 1.25
    df = pd.DataFrame({"err": [0.1, 0.3], "kept in high precision": [False, True]}, index=["blocks.0.fc", "out"])
    ax2 = layer_bars(df, "err", ax=_ax())
    assert [p.get_height() for p in ax2.patches] == [0.1, 0.3]
    assert [t.get_text() for t in ax2.get_xticklabels()] == ["b0.fc", "out"]
    ax3 = error_vs_draws([1, 4, 16], [0.4, 0.2, 0.1], nearest=0.15, single=0.4, ax=_ax())
    assert list(ax3.lines[0].get_ydata()) == [0.4, 0.2, 0.1] and list(ax3.lines[1].get_ydata()) == [0.15, 0.15]


def test_what_a_panel_moves_in_place_is_what_the_figures_draw():
    """rounding_means names its mean line with stochastic_label (gid "stochastic"); layer_bars colours its bars with
    layer_colors; dy_range's step mark carries gid "mark"."""
    x = torch.linspace(0, 6, 5)
    ax = rounding_means(x, x.round(), x, 4, ax=_ax())
    line = next(line for line in ax.lines if line.get_gid() == "stochastic")
    assert line.get_label() == stochastic_label(4) == "stochastic, mean of 4 draws"
    assert stochastic_label(1) == "stochastic, mean of 1 draw"
    assert stochastic_label(4) in [t.get_text() for t in ax.get_legend().get_texts()]
    df = pd.DataFrame({"err": [0.1, 0.3], "kept in high precision": [False, True]}, index=["a", "b"])
    ax2 = layer_bars(df, "err", ax=_ax())
    from matplotlib.colors import to_rgba

    assert [p.get_facecolor() for p in ax2.patches] == [to_rgba(c) for c in layer_colors(df)]
    assert layer_colors(df)[0] != layer_colors(df)[1]
    ranges = pd.DataFrame({"step": [0, 1, 2], "layer": "fc1", "amax": [1.0, 2.0, 4.0], "smallest": [0.01, 0.01, 0.02]})
    ax3 = dy_range(ranges, "fc1", step=1, ax=_ax())
    assert [list(line.get_xdata()) for line in ax3.lines if line.get_gid() == "mark"] == [[1, 1]]
