"""The bit clicker's anatomy of a value against ml_dtypes, and the ordinary-channel metrics
against plain loops."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from fp8lab.data.synthetic import sample
from fp8lab.numerics.anatomy import anatomy, rounding
from fp8lab.numerics.formats import get_format
from fp8lab.numerics.metrics import channel_sqnr, quantization_report, sqnr
from fp8lab.numerics.quantize import quantize

ORACLE = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e2m1": ml_dtypes.float4_e2m1fn,
          "e8m0": ml_dtypes.float8_e8m0fnu}


def _oracle_values(name: str) -> np.ndarray:
    codes = np.arange(2 ** get_format(name).bits, dtype=np.uint8)  # FP4: one code per byte, high bits 0
    vals = codes.view(ORACLE[name]).astype(np.float64)
    return np.unique(vals[np.isfinite(vals)])


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e2m1", "e8m0"])
def test_neighbours_and_gap_of_every_code_match_ml_dtypes(name):
    f = get_format(name)
    vals = _oracle_values(name)
    for code in range(2**f.bits):
        a = anatomy(f, code)
        if not math.isfinite(a.value):
            assert a.gap is None and a.below is None
            continue
        i = int(np.searchsorted(vals, a.value))
        below = float(vals[i - 1]) if i > 0 else None
        j = int(np.searchsorted(vals, a.value, side="right"))
        above = float(vals[j]) if j < len(vals) else None
        assert (a.below, a.above) == (below, above), (name, code)
        if a.value > 0:  # the gap is to the next value up, or (at the top) down
            assert a.gap == (above - a.value if above is not None else a.value - below), (name, code)
            assert a.relative_step == a.gap / a.value


def test_normal_relative_step_is_two_to_the_minus_mantissa_bits_at_each_binade_start():
    for name in ("e4m3", "e5m2"):
        f = get_format(name)
        for e in range(-4, 5):
            a = anatomy(f, f.encode(2.0**e))
            assert a.relative_step == 2.0**-f.mantissa_bits and not a.subnormal


def test_rounding_status_and_error():
    assert rounding("e4m3", 464.0).status == "rounded"  # exactly halfway to 480: ties to even, 448
    assert rounding("e4m3", 464.1).status == "saturated"
    assert rounding("e4m3", -1e9).rounded == -448.0 and rounding("e4m3", -1e9).status == "saturated"
    assert rounding("e4m3", 2.0**-11).status == "flushed to zero"
    r = rounding("e5m2", 1.1)
    assert r.status == "rounded" and r.rounded == 1.0 and r.error == pytest.approx(-0.1)
    assert rounding("e8m0", -1.0).status == "NaN"
    for name in ("e4m3", "e5m2"):
        for v in (0.3, 3.7, 100.0, -0.01):
            want = float(np.array(v).astype(ORACLE[name]))
            assert rounding(name, v).rounded == want


def _loop_channel_sqnr(x, y, skip=()):
    ratios = []
    for c in range(x.shape[1]):
        if c in skip:
            continue
        s = sum(float(v) ** 2 for v in x[:, c].double())
        n = sum(float(a - b) ** 2 for a, b in zip(x[:, c].double(), y[:, c].double(), strict=True))
        if s > 0:
            ratios.append(n / s)
    return -10 * math.log10(sum(ratios) / len(ratios))


def test_channel_sqnr_against_a_loop_and_its_limits():
    x, idx = sample("channel scales", (16, 64), 1e4, seed=3, return_outliers=True)
    q = quantize(x)
    assert channel_sqnr(x, q, idx) == pytest.approx(_loop_channel_sqnr(x, q.dequantize(), set(idx.tolist())),
                                                    rel=1e-9)
    y = torch.randn(64, 32)  # channels alike: it agrees with the whole-tensor SQNR within a fraction of a dB
    assert channel_sqnr(y, quantize(y)) == pytest.approx(sqnr(y, quantize(y)), abs=0.3)
    z = y.clone()
    z[:, :8] = 0  # a quarter of the channels flushed: capped at -10 log10(1/4) = 6 dB
    assert channel_sqnr(y, z) < -10 * math.log10(0.25) + 1e-9
    assert channel_sqnr(y, y) == math.inf
    assert math.isnan(channel_sqnr(y, torch.full_like(y, math.nan)))


def test_the_report_separates_ordinary_values_from_outliers():
    x, idx = sample("normal", (128, 1024), 1e6, return_outliers=True)
    r = quantization_report(x, quantize(x), idx)
    assert r["sqnr_db"] > 30  # the outliers' energy: the whole tensor looks fine ...
    assert r["ordinary_sqnr_db"] < 1 and r["ordinary_underflow"] > 0.99  # ... and every ordinary value is gone
    y = sample("normal", (128, 1024))
    clean = quantization_report(y, quantize(y))  # without outlier channels every value is ordinary
    assert clean["ordinary_underflow"] == clean["underflow"]
    assert clean["ordinary_sqnr_db"] == pytest.approx(clean["sqnr_db"], abs=0.3)


@pytest.mark.parametrize("case", ["normal", "outliers", "channel scales", "zeros", "nan", "e2m1 blocks"])
def test_the_report_in_one_pass_equals_the_separate_functions(case):
    from fp8lab.numerics.metrics import (
        flushed_fraction,
        overflow_fraction,
        relative_error,
        subnormal_fraction,
        underflow_fraction,
    )
    from fp8lab.numerics.scaling import PerBlock

    x, idx = sample("channel scales" if case == "channel scales" else "normal", (32, 256),
                    1e5 if case == "outliers" else 0.0, return_outliers=True)
    q = quantize(x)
    if case == "zeros":
        x = torch.zeros(8, 16)
        q = quantize(x)
    elif case == "nan":
        x = x.clone()
        x[1, 2] = math.nan
        q = quantize(x, granularity=PerBlock(1, 32))
    elif case == "e2m1 blocks":
        q = quantize(x, "e2m1", PerBlock(1, 16), "floor", scale_fmt="e8m0")
    r = quantization_report(x, q, idx)
    want = {"sqnr_db": sqnr(x, q), "relative_error": relative_error(x, q), "overflow": overflow_fraction(x, q),
            "underflow": underflow_fraction(x, q), "subnormal": subnormal_fraction(q),
            "ordinary_sqnr_db": channel_sqnr(x, q, idx), "ordinary_underflow": flushed_fraction(x, q, idx)}
    for k, v in want.items():
        if math.isnan(v):
            assert math.isnan(r[k]), (case, k)
        else:
            assert r[k] == pytest.approx(v, rel=1e-12, abs=0), (case, k, r[k], v)
