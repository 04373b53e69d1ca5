"""fp8lab.figures.scales: the NVFP4 block-scale histogram counts what it is given, against E4M3's range
(smallest subnormal 2^-9, smallest normal 2^-6, largest 448); a weight's differing copies as shares per cell."""

import math

import numpy as np
import pandas as pd
import torch

from fp8lab.figures.axes import figure
from fp8lab.figures.scales import NVFP4_BINS, nvfp4_block_scales, scale_histogram, shares_vs_magnitude, weight_copies


def _ax():
    return figure(pyplot=False)[1]


def test_scale_histogram_counts_clean_and_outlier_blocks_apart():
    ideal = torch.tensor([2.0**-8, 2.0**-8, 1.0, 2.0**-40])  # the last below the bins: counted in the first
    clean = torch.tensor([True, True, False, True])
    c, o = scale_histogram(ideal, clean)
    assert c.sum() == 3 and o.sum() == 1
    assert c[np.searchsorted(NVFP4_BINS, -8.0, side="right") - 1] == 2 and c[0] == 1
    assert o[np.searchsorted(NVFP4_BINS, 0.0, side="right") - 1] == 1


def test_nvfp4_block_scales_marks_e4m3s_floor_and_range():
    counts = (np.ones(len(NVFP4_BINS) - 1), np.zeros(len(NVFP4_BINS) - 1))
    ax = nvfp4_block_scales(counts, ax=_ax())
    spans = sorted((p.get_x(), p.get_x() + p.get_width()) for p in ax.patches if hasattr(p, "get_width"))
    assert spans[0] == (-9.0, -6.0) and spans[1][0] == -6.0 and math.isclose(spans[1][1], math.log2(448))
    assert ax.get_xlim() == (float(NVFP4_BINS[0]), float(NVFP4_BINS[-1]))
    assert ax.get_ylim()[1] == 1  # max(1, int(1 * 1.05))


def test_weight_copies_pools_to_shares():
    differ = torch.zeros(128, 8, dtype=torch.bool)
    differ[:2, 0] = True  # 2 of the 2 rows pooled into cell (0, 0)
    differ[2, 1] = True  # 1 of 2
    ax = weight_copies(differ, ax=_ax())
    grid = np.asarray(ax.images[0].get_array())
    assert grid.shape == (64, 8) and grid[0, 0] == 1.0 and grid[1, 1] == 0.5 and grid.sum() == 1.5


def test_shares_vs_magnitude_draws_none_at_one():
    df = pd.DataFrame({"outliers": [0.0, 10.0, 100.0], "flushed": [0.0, 0.2, 0.9]})
    ax = shares_vs_magnitude(df, {"flushed": "flushed"}, ax=_ax(), mark=10.0)
    x, y = ax.lines[0].get_data()
    assert list(x) == [1.0, 10.0, 100.0] and list(y) == [0.0, 0.2, 0.9]
