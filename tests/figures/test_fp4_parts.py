"""fp8lab.figures.fp4_parts: each backward part's figure draws the values it is given."""

import pandas as pd

from fp8lab.figures.axes import figure
from fp8lab.figures.fp4_parts import contrast_bars, depth_curves, pair_bars, sum_error, weight_path


def _ax():
    return figure(pyplot=False)[1]


def test_sum_error_lines_and_per_value_levels():
    ax = sum_error([16, 256], [0.01, 0.1], [0.02, 0.005], {"nearest": 0.03, "stochastic": 0.04}, mark=256, ax=_ax())
    ys = [list(line.get_ydata()) for line in ax.lines]
    assert ys[0] == [0.01, 0.1] and ys[1] == [0.02, 0.005] and ys[2] == [0.03, 0.03] and ys[3] == [0.04, 0.04]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


def test_weight_path_and_depth_curves_plot_their_series():
    ax = weight_path([0, 1, 2], [0, 0, 0], [0, 1, 3], ax=_ax())
    assert [list(line.get_ydata()) for line in ax.lines] == [[0, 1, 2], [0, 0, 0], [0, 1, 3]]
    ax2 = depth_curves([1, 2, 4], [0.1, 0.2, 0.4], [0.0, 0.0, 0.01], mark=2, ax=_ax())
    assert list(ax2.lines[0].get_ydata()) == [0.1, 0.2, 0.4] and list(ax2.lines[1].get_ydata()) == [0.0, 0.0, 0.01]


def test_paired_bars_sit_either_side_of_each_group():
    table = pd.DataFrame({"without": [0.3, 0.5], "with": [0.1, 0.2]},
                         index=pd.MultiIndex.from_tuples([("e2m1", "nearest"), ("e2m1", "stochastic")]))
    ax = contrast_bars(table, ax=_ax())
    assert [(p.get_x() + p.get_width() / 2, p.get_height()) for p in ax.patches] == [
        (-0.2, 0.3), (0.8, 0.5), (0.2, 0.1), (1.2, 0.2)]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["e2m1\nto nearest", "e2m1\nstochastic"]
    ax2 = pair_bars(["a", "b"], [0.1, -0.1], [0.0, 0.2], ("one", "two"), ax=_ax())
    assert [p.get_height() for p in ax2.patches] == [0.1, -0.1, 0.0, 0.2]
