"""fp8lab.numerics.scaling: granularities' shapes, per-block amax, the three scale rules and delayed scaling,
each against a value computed here (a Python loop, the rule's formula in float64, a hand count).

quantize on top of these: tests/numerics/test_quantize.py; torchao's own scales: test_torchao_oracle.py.
"""

import math

import pytest
import torch

from fp8lab.numerics.formats import E4M3, E8M0
from fp8lab.numerics.scaling import (
    AmaxHistory,
    PerBlock,
    PerRow,
    PerTensor,
    amax_per_block,
    parse_granularity,
    scale_from_amax,
)


def test_scale_shapes_and_labels():
    assert PerTensor().scale_shape((5, 7)) == ()
    assert PerRow().scale_shape((5, 7)) == (5, 1)
    assert PerBlock(2, 3).scale_shape((5, 7)) == (3, 3)  # ceil(5/2), ceil(7/3)
    assert PerBlock(128, 128).block_shape((1, 300)) == (1, 128)  # clamped to the tensor
    for label, g in (("per-tensor", PerTensor()), ("per-row", PerRow()), ("1x128", PerBlock(1, 128))):
        assert parse_granularity(label) == g and g.label == label
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="PerBlock"):
            PerBlock(bad, 1)
    with pytest.raises(ValueError, match="unknown granularity"):
        parse_granularity("diagonal")


def test_amax_per_block_matches_a_loop_over_uneven_blocks():
    x = torch.randn(7, 10, generator=torch.Generator().manual_seed(0))
    got = amax_per_block(x, PerBlock(3, 4))
    assert got.shape == (3, 3)
    for i in range(3):
        for j in range(3):
            assert got[i, j] == x[3 * i:3 * i + 3, 4 * j:4 * j + 4].abs().max()
    assert amax_per_block(x, PerTensor()).reshape(()) == x.abs().max()
    y = x.clone()
    y[0, 0] = math.nan
    nan_amax = amax_per_block(y, PerBlock(3, 4))
    assert math.isnan(nan_amax[0, 0]) and not nan_amax[1:].isnan().any()


def test_the_three_rules_follow_their_formulas():
    amax = torch.tensor([1.0, 300.0, 500.0, 0.0])
    exact = scale_from_amax(amax, E4M3, "exact").scale
    torch.testing.assert_close(exact[:3], amax[:3] / 448.0, rtol=2**-23, atol=0)
    assert exact[3] == 1.0  # an all-zero block gets scale 1
    rceil = scale_from_amax(amax, E4M3, "rceil").scale
    assert rceil.tolist() == [2.0 ** math.ceil(math.log2(a / 448)) for a in (1.0, 300.0, 500.0)] + [1.0]
    floor = scale_from_amax(amax, E4M3, "floor").scale
    assert floor.tolist() == [2.0 ** (math.floor(math.log2(a)) - 8) for a in (1.0, 300.0, 500.0)] + [1.0]
    # floor lets 500 clip (500 / 1 > 448); rceil never does
    assert 500 / floor[2] > 448 and 500 / rceil[2] <= 448
    # margin m divides the usable max by 2^m
    torch.testing.assert_close(scale_from_amax(amax[:1], E4M3, "exact", margin=2).scale,
                               torch.tensor([4.0 / 448.0]), rtol=2**-23, atol=0)
    # E8M0 scales: powers of two
    s = scale_from_amax(torch.tensor([3.0e-3, 7.0]), E4M3, "floor", scale_fmt=E8M0).scale
    assert torch.equal(torch.exp2(torch.log2(s).round()), s)


def test_nvfp4_block_scales_are_e4m3_values_under_a_tensor_scale():
    amax = torch.tensor([6.0, 60.0, 600.0])
    sc = scale_from_amax(amax, "e2m1", "exact", scale_fmt=E4M3, two_level=True)
    assert math.isclose(float(sc.tensor_scale), 600.0 / (448 * 6), rel_tol=1e-6)
    # the largest block's scale uses E4M3's top: amax / 6 / tensor_scale = 448
    assert float(sc.scale[2]) == 448.0
    assert set(sc.scale.tolist()) <= set(E4M3.values().tolist())


def test_amax_history_max_and_most_recent_and_replay():
    h = AmaxHistory(length=3, algo="max")
    assert h.amax() is None
    for a in (1.0, 5.0, 2.0, 3.0):
        h.record(a)
    assert h.history == [5.0, 2.0, 3.0] and h.amax() == 5.0
    h.record(1.0)  # 5 leaves the window of 3
    assert h.amax() == 3.0
    assert AmaxHistory(3, "most_recent").replay([1.0, 4.0, 2.0]) == [1.0, 1.0, 4.0]
    assert AmaxHistory(2, "max").replay([1.0, 4.0, 2.0, 1.0, 1.0]) == [1.0, 1.0, 4.0, 4.0, 2.0]
    h.record(math.nan)
    assert math.isnan(h.amax())
    with pytest.raises(ValueError):
        h.record(-1.0)
