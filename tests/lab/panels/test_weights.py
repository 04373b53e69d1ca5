"""fp8lab.lab.panels.weights: a weight's two copies (fprop along K, dgrad along N) under 1-D and 2-D blocks."""

from __future__ import annotations

import pytest
import torch

from fp8lab.lab.panels.weights import WEIGHT_RECIPES, uneven_weight, weight_copies


def test_one_scale_or_square_blocks_give_one_copy_and_1d_blocks_two():
    w = uneven_weight((256, 256))
    share = {name: weight_copies(w, r)["share"] for name, r in WEIGHT_RECIPES.items()}
    for same in ("tensorwise", "blockwise (128x128 weight blocks)", "nvfp4 (16x16 weight blocks)"):
        assert share[same] == 0.0, same
    for pow2 in ("rowwise", "mxfp8 (1x32)"):  # power-of-two scales: the copies differ only where one rounds finer
        assert 0 < share[pow2] < 0.01, pow2
    for two in ("blockwise, 1-D weight blocks (1x128)", "nvfp4, 1-D weight blocks (1x16)"):
        assert share[two] > 0.05, two


def test_the_copies_are_w_quantized_along_each_axis():
    w = uneven_weight((128, 128), seed=1)
    c = weight_copies(w, WEIGHT_RECIPES["blockwise, 1-D weight blocks (1x128)"])
    from fp8lab.numerics.quantize import quantize
    from fp8lab.numerics.scaling import PerBlock

    assert torch.equal(c["fprop"], quantize(w, "e4m3", PerBlock(1, 128)).dequantize())
    assert torch.equal(c["dgrad"], quantize(w.t().contiguous(), "e4m3", PerBlock(1, 128)).dequantize().t())
    assert c["gap"] == pytest.approx(float(torch.linalg.norm(c["fprop"] - c["dgrad"]) / torch.linalg.norm(w)))
    assert torch.equal(c["differ"], c["fprop"] != c["dgrad"])


def test_the_uneven_weight_spreads_rows_and_columns():
    w = uneven_weight((64, 64), spread=3.0)
    rows = w.abs().amax(1)
    assert float(rows.max() / rows.min()) > 8  # 2^(a_i) spans up to 2^6 between rows
    assert torch.equal(w, uneven_weight((64, 64), spread=3.0))
