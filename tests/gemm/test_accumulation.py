"""fp8lab.gemm.accumulation: the limited-precision accumulator truncates as its docstring's formulas say
(sums worked by hand), promotion to fp32 bounds the error, the settings are checked, and the fast walk of many
models at once (accumulate_all) gives accumulate's bits.

DeepSeek-V3's "nearly 2%" at K = 4096: tests/notebooks/test_lessons.py (notebook 05).
"""

import pytest
import torch

from fp8lab.gemm.accumulation import (
    ALIGNMENTS,
    MEASURES,
    AccumulatorModel,
    GroupedProducts,
    accumulate_all,
    accumulation_curves,
    accumulation_error,
)
from fp8lab.numerics.formats import E4M3


def test_running_alignment_truncates_small_products_by_hand():
    # the group's largest product is 1: ulp = 2^(0 - mantissa_bits); 2^-5 survives with 5 bits, not with 3
    p = torch.tensor([[1.0, 2.0**-5]])
    assert AccumulatorModel(3, group=2, promote_every=None).accumulate(p).tolist() == [1.0]
    assert AccumulatorModel(5, group=2, promote_every=None).accumulate(p).tolist() == [1.0 + 2.0**-5]
    # truncation, not rounding: 3 * 2^-5 is 0.75 of an ulp of 2^-3 and is dropped; toward zero for negatives too
    q = torch.tensor([[1.0, 3 * 2.0**-5]])
    assert AccumulatorModel(3, group=2, promote_every=None).accumulate(q).tolist() == [1.0]
    assert AccumulatorModel(3, group=2, promote_every=None).accumulate(-q).tolist() == [-1.0]


def test_the_running_sum_takes_part_in_the_alignment_and_promotion_resets_it():
    # group 1: after 8 ones the sum is 8, so ulp = 2^(3 - 2) = 2 and each further 1 is dropped (running);
    # with promotion every 4 the accumulator never exceeds 4 and nothing is lost
    p = torch.ones(1, 16)
    assert AccumulatorModel(2, group=1, promote_every=None).accumulate(p).item() == 8.0
    assert AccumulatorModel(2, group=1, promote_every=4).accumulate(p).item() == 16.0


def test_wide_accumulator_is_the_fp32_sum():
    p = torch.randn(3, 256, generator=torch.Generator().manual_seed(0))
    got = AccumulatorModel(50, group=32, promote_every=None).accumulate(p)
    torch.testing.assert_close(got.double(), p.double().sum(-1), atol=1e-5, rtol=1e-6)


def test_promotion_lowers_the_error_of_a_long_same_sign_sum():
    k = 512
    short = accumulation_error(k, AccumulatorModel(13, 32, None))
    promoted = accumulation_error(k, AccumulatorModel(13, 32, 128))
    fp32 = accumulation_error(k, None)
    assert fp32 < promoted < short
    assert fp32 < 1e-6


@pytest.mark.parametrize("kwargs", [dict(alignment="sideways"), dict(mantissa_bits=0), dict(group=0),
                                    dict(group=32, promote_every=100)])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        AccumulatorModel(**kwargs)


# ---- the fast walk: accumulate_all against accumulate, bit for bit ---------------------------------------------


def _products(kind: str) -> torch.Tensor:
    """Products (..., K) float64 that stress a walk: same sign, mixed signs over many binades, ties (powers of two that
    land on a kept bit's edge), E4M3 subnormals times E4M3 values, a long K, groups whose sums pass 2^53 ulps, a K
    that is no multiple of the group, all zeros, and float64 products too small or too large for the fast walk
    (accumulate runs for those and for sums that could round)."""
    g = torch.Generator().manual_seed(39)
    values = E4M3.values()
    if kind == "uniform":
        return torch.rand(3, 5, 1024, generator=g, dtype=torch.float64)
    if kind == "mixed":
        return torch.randn(4, 512, generator=g, dtype=torch.float64) * torch.exp2(
            torch.randint(-20, 20, (4, 512), generator=g).double())
    if kind == "ties":
        signs = torch.where(torch.rand(6, 640, generator=g) < 0.3, -1.0, 1.0).double()
        return signs * torch.exp2(torch.randint(-8, 3, (6, 640), generator=g).double())
    if kind == "e4m3 subnormals":
        small = values[(values.abs() < E4M3.min_normal) & (values != 0)].double()
        a = small[torch.randint(len(small), (8, 768), generator=g)]
        b = values.double()[torch.randint(len(values), (8, 768), generator=g)]
        return a * b
    if kind == "long":
        return torch.rand(2, 16384, generator=g, dtype=torch.float64)
    if kind == "wide groups":  # same sign near 1: a group of 8192 sums past 2^53 ulps of a 41-bit accumulator
        return 0.5 + torch.rand(2, 3, 16384, generator=g, dtype=torch.float64) / 2
    if kind == "ragged":
        return torch.randn(5, 1000, generator=g, dtype=torch.float64)
    if kind == "zeros":
        return torch.zeros(2, 256, dtype=torch.float64)
    if kind == "float64 extremes":
        return torch.tensor([[1e-310, 1e-300, 3.0, -2e-308] * 16, [1e300, -1e299, 7.0, 1.0] * 16], dtype=torch.float64)
    if kind == "nan":
        return torch.tensor([[1.0, float("nan"), 2.0] * 32, [1.0, float("inf"), -3.0] * 32], dtype=torch.float64)
    raise ValueError(kind)


KINDS = ["uniform", "mixed", "ties", "e4m3 subnormals", "long", "wide groups", "ragged", "zeros", "float64 extremes",
         "nan"]
MODELS = [AccumulatorModel(bits - 1, group, promote, alignment)
          for bits in (8, 14, 24) for alignment in ALIGNMENTS
          for group, promote in ((32, None), (32, 32), (32, 128), (16, 64))] + [
    AccumulatorModel(45, 32, 128), AccumulatorModel(50, 32, 128),  # sums exact / sums that could round
    AccumulatorModel(40, 4095, None), AccumulatorModel(40, 8192, None), AccumulatorModel(40, 8192, None, "group")]


@pytest.mark.parametrize("kind", KINDS)
def test_all_models_at_once_give_each_models_accumulate_bit_for_bit(kind):
    """accumulate_all (every model in one walk per alignment, numpy) against AccumulatorModel.accumulate, the
    definition, over accumulator widths, both readings, promotions and group sizes: the same float32 bits (NaN
    where accumulate gives NaN)."""
    products = _products(kind)
    for model, got in zip(MODELS, accumulate_all(MODELS, products), strict=True):
        want = model.accumulate(products)
        assert got.shape == want.shape and got.dtype == want.dtype == torch.float32
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan), model
        assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32)), (kind, model)


def test_the_fast_walk_takes_tame_products_and_leaves_the_rest_to_accumulate():
    assert GroupedProducts(_products("uniform"), 32).fast_for(AccumulatorModel(13))
    # a group's sum reaches (group + 1) * 2^(mantissa_bits + 1) ulps: exact within 2^53, and it may round past it
    assert GroupedProducts(_products("uniform"), 32).fast_for(AccumulatorModel(45))
    assert not GroupedProducts(_products("uniform"), 32).fast_for(AccumulatorModel(50))
    assert GroupedProducts(_products("wide groups"), 4095).fast_for(AccumulatorModel(40, 4095, None))
    assert not GroupedProducts(_products("wide groups"), 8192).fast_for(AccumulatorModel(40, 8192, None))
    assert not GroupedProducts(_products("uniform"), 16).fast_for(AccumulatorModel(13))  # another group size
    assert not GroupedProducts(_products("float64 extremes"), 32).fast_for(AccumulatorModel(13))
    assert not GroupedProducts(_products("nan"), 32).fast_for(AccumulatorModel(13))


@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_curves_of_many_models_are_each_models_errors(dist):
    ks = [128, 256, 512, 1024, 96]
    models = [AccumulatorModel(13, 32, None, "running"), AccumulatorModel(7, 32, 128, "group"),
              AccumulatorModel(9, 16, 64, "running")]
    want = {measure: [[accumulation_error(k, m, dist, measure=measure) for k in ks] for m in models]
            for measure in MEASURES}
    assert accumulation_curves(ks, models, dist) == want
