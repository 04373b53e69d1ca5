"""fp8lab.training.armour: the helpers that let FP8Linear stand in for nn.Linear (the layer-level behaviour they
guard is tested in test_hardening.py, test_hardening_models.py and test_convert_truthfully.py)."""

import math

import pytest
import torch

from fp8lab.numerics.quantize import quantize_with
from fp8lab.numerics.recipes import get_recipe
from fp8lab.numerics.scaling import PerBlock, PerRow, PerTensor, TensorScaling
from fp8lab.training.armour import all_finite, at_least_one_row, quantize_if_finite

SPECIALS = [math.inf, -math.inf, math.nan, -math.nan]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_all_finite_says_what_isfinite_says(dtype):
    """Every special value at the first, a middle and the last position, alone and beside another, in tensors of
    several shapes (one value too: a per-tensor amax, read as a number): all_finite(t) == torch.isfinite(t).all()."""
    g = torch.Generator().manual_seed(0)
    for shape in [(), (1,), (7,), (3, 5), (64, 129), (2, 3, 40)]:
        base = torch.randn(shape, generator=g).to(dtype)
        assert all_finite(base) and bool(torch.isfinite(base).all())
        flat_n = base.numel()
        for special in SPECIALS:
            for where in {0, flat_n // 2, flat_n - 1}:
                t = base.clone().reshape(-1)
                t[where] = special
                t = t.reshape(shape)
                assert not bool(torch.isfinite(t).all()) and not all_finite(t)
                t.reshape(-1)[0] = -math.inf  # a second special beside it
                assert not all_finite(t)
    big = torch.full((4, 4), torch.finfo(dtype).max, dtype=dtype)
    assert all_finite(big) and all_finite(-big)  # the largest finite values are finite


def test_all_finite_of_an_empty_tensor_and_a_strided_view():
    assert all_finite(torch.empty(0, 5))
    t = torch.randn(8, 6)
    t[7, 0] = math.nan
    assert all_finite(t[:7].t()) and not all_finite(t.t())


def test_an_empty_batch_becomes_one_row_of_zeros():
    t = torch.randn(0, 5, dtype=torch.bfloat16)
    one = at_least_one_row(t, 0)
    assert one.shape == (1, 5) and one.dtype == torch.bfloat16 and not one.any()
    full = torch.randn(3, 5)
    assert at_least_one_row(full, 3) is full


@pytest.mark.parametrize("scaling", [TensorScaling("e5m2"), TensorScaling("e4m3", granularity=PerRow()),
                                     TensorScaling("e4m3", granularity=PerBlock(1, 32)),
                                     get_recipe("nvfp4").scaling("grad_output", "dgrad")],
                         ids=["e5m2-tensor", "e4m3-row", "e4m3-1x32", "nvfp4"])
def test_a_gradient_quantized_where_finite_is_quantize_with_and_none_where_it_holds_an_inf_or_nan(scaling):
    """quantize_if_finite: a finite gradient's QuantizedTensor is quantize_with's, code for code; an inf, a -inf, a
    NaN (its block's amax), an inf beside a NaN (quantize's refusal) give None; a refusal that is not an
    infinity's (a float64 value beyond float32) is raised; stochastic rounding, which would draw first, is refused."""
    g = torch.Generator().manual_seed(6)
    dy = torch.randn(24, 64, generator=g) * torch.logspace(-3, 3, 64)
    q = quantize_if_finite(dy, scaling)
    want = quantize_with(dy, scaling)
    assert torch.equal(q.data.view(torch.uint8), want.data.view(torch.uint8)) and torch.equal(q.scale, want.scale)
    for specials in ({(0, 0): math.inf}, {(23, 63): -math.inf}, {(5, 9): math.nan},
                     {(5, 9): math.nan, (5, 10): math.inf}):
        bad = dy.clone()
        for (row, col), value in specials.items():
            bad[row, col] = value
        assert quantize_if_finite(bad, scaling) is None, specials
    with pytest.raises(ValueError, match="beyond float32's range"):
        quantize_if_finite(torch.full((2, 32), 1e300, dtype=torch.float64), scaling)
    with pytest.raises(ValueError, match="rounds to nearest"):
        quantize_if_finite(dy, TensorScaling("e4m3", rounding="stochastic"))
    assert quantize_if_finite(torch.zeros(2, 32), TensorScaling("e4m3", granularity=PerTensor())) is not None
