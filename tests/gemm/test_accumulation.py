"""fp8lab.gemm.accumulation: the limited-precision accumulator truncates as its docstring's formulas say
(sums worked by hand), promotion to fp32 bounds the error, and the settings are checked.

DeepSeek-V3's "nearly 2%" at K = 4096: tests/notebooks/test_lessons.py (notebook 05).
"""

import pytest
import torch

from fp8lab.gemm.accumulation import AccumulatorModel, accumulation_error


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
