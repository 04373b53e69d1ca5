"""fp8lab.numerics.anatomy: one code's neighbours and gap, and what a typed value rounds to, from the formats'
definitions (E4M3: bias 7, 3 mantissa bits, max 448, smallest subnormal 2^-9).

Every code of every format against ml_dtypes: tests/numerics/test_anatomy_metrics.py.
"""

import math

from fp8lab.numerics.anatomy import anatomy, rounding
from fp8lab.numerics.formats import E4M3


def test_one_is_code_0x38_with_a_gap_of_one_eighth():
    a = anatomy("e4m3", 0x38)  # sign 0, exponent 0111 (= bias), mantissa 000
    assert a.value == 1.0 and not a.subnormal
    assert a.fields["exponent"] == 7 and a.fields["mantissa"] == 0
    assert a.below == 1.0 - 2.0**-4 and a.above == 1.0 + 2.0**-3
    assert a.gap == 2.0**-3 and a.relative_step == 2.0**-3


def test_the_ends_of_the_range():
    top = anatomy(E4M3, 0x7E)  # 448: no value above; its gap is the top binade's, 32
    assert top.value == 448.0 and top.above is None and top.gap == 32.0
    tiny = anatomy(E4M3, 0x01)  # the smallest subnormal
    assert tiny.subnormal and tiny.value == 2.0**-9 and tiny.below == 0.0 and tiny.gap == 2.0**-9
    zero = anatomy(E4M3, 0x00)
    assert zero.value == 0.0 and zero.gap == 2.0**-9 and zero.relative_step is None
    nan = anatomy(E4M3, 0x7F)
    assert math.isnan(nan.value) and nan.gap is None


def test_rounding_statuses():
    assert rounding(E4M3, 1.0).status == "exact"
    r = rounding(E4M3, 1.0 + 2.0**-4)  # a tie between 1 and 1.125: to even, 1.0
    assert r.status == "rounded" and r.rounded == 1.0 and r.error == -(2.0**-4)
    assert rounding(E4M3, 1.0 + 3 * 2.0**-5).rounded == 1.125
    assert rounding(E4M3, 2.0**-11).status == "flushed to zero"
    assert rounding(E4M3, 460.0).status == "rounded"  # below 448 + 16: rounds to 448
    s = rounding(E4M3, 465.0)
    assert s.status == "saturated" and s.rounded == 448.0 and s.code == 0x7E
    assert rounding(E4M3, math.nan).status == "NaN"
