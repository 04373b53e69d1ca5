"""fp8lab.figures.gemms: the flushed-values map in x's layout, and the bars of shares and losses, drawn from
the data they are given."""

import numpy as np
import pandas as pd
import torch

from fp8lab.figures.axes import figure
from fp8lab.figures.gemms import copies_bars, flushed_map, mismatch_flush, mismatch_losses


def _ax():
    return figure(pyplot=False)[1]


def test_flushed_map_marks_nonzero_values_that_became_zero():
    x = torch.tensor([[1.0, 0.0], [2.0, 3.0]])
    y = torch.tensor([[0.0, 0.0], [2.0, 0.0]])  # (0, 0) and (1, 1) flushed; x's own zero is not
    grid = np.asarray(flushed_map(x, y, ax=_ax()).images[0].get_array())
    assert grid.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    none = np.asarray(flushed_map(x, None, ax=_ax()).images[0].get_array())  # high precision: nothing flushes
    assert not none.any()


def test_mismatch_flush_bars_the_quantized_gemms_and_marks_high_precision():
    idx = pd.MultiIndex.from_tuples([("tensorwise", "fprop"), ("tensorwise", "wgrad"),
                                     ("rowwise_with_gw_hp", "fprop"), ("rowwise_with_gw_hp", "wgrad")])
    df = pd.DataFrame({"underflow": [0.1, 0.25, 0.5, 0.0],
                       "format": ["e4m3", "e4m3", "e4m3", "high precision"]}, index=idx)
    ax = mismatch_flush(df, ax=_ax())
    assert sorted(p.get_height() for p in ax.patches) == [0.1, 0.25, 0.5]
    texts = [t.get_text() for t in ax.texts]
    assert "no FP8" in texts and "25%" in texts and "50%" in texts


def test_mismatch_losses_bars_the_mean_over_seeds():
    df = pd.DataFrame({"seed": [0, 1, 0, 1], "run": ["a", "a", "b", "b"], "loss": [1.0, 3.0, 2.0, 2.0],
                       "constant": [5.0, 7.0, 5.0, 7.0]})
    ax = mismatch_losses(df, ax=_ax())
    assert [p.get_height() for p in ax.patches] == [2.0, 2.0]
    assert list(ax.lines[0].get_ydata()) == [6.0, 6.0]  # the constant predictor's mean over seeds


def test_copies_bars_widths_are_the_shares():
    ax = copies_bars({"blockwise": 0.4, "nvfp4": 0.0}, ax=_ax(), highlight="blockwise")
    assert [p.get_width() for p in ax.patches] == [0.4, 0.0]
    assert [t.get_text() for t in ax.texts] == ["40%", "0%"]
