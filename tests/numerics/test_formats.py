"""Formats against ml_dtypes, an independent oracle (NumPy-level, no torch involved)."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import fp8lab
from fp8lab.numerics import kernels
from fp8lab.numerics.formats import BF16, E2M1, E4M3, E5M2, E8M0, FP16, cast, cast_reference, get_format, widen


def kernel_cast(x, fmt, dtype=torch.float32):
    """The C kernels' cast (the one quantize runs), for the formats whose codes they store."""
    if not kernels.engine().kernels:
        pytest.skip(f"kernels not built here: {kernels.status()[1]}")
    return kernels.cast(x, fmt, dtype)


def _casts(formats):
    """(fmt, impl) for the cast's twins, one signature and one test: cast_reference (teaching), cast (fast,
    torch) and the kernels' cast (for the formats whose codes they store: e4m3, e5m2, e2m1)."""
    return [pytest.param(fmt, impl, id=f"{fmt.name}-{name}")
            for fmt in formats
            for impl, name in ((cast, "cast"), (cast_reference, "cast_reference"), (kernel_cast, "kernels.cast"))
            if impl is not kernel_cast or fmt.name in ("e4m3", "e5m2", "e2m1")]

ORACLE = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e8m0": ml_dtypes.float8_e8m0fnu,
    "e2m1": ml_dtypes.float4_e2m1fn,
}
FORMATS = [E4M3, E5M2, E8M0, E2M1]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_every_code_decodes_like_ml_dtypes(fmt):
    codes = np.arange(2**fmt.bits, dtype=np.uint8)
    expected = codes.view(ORACLE[fmt.name]).astype(np.float64)
    ours = np.array([fmt.decode(int(c)) for c in codes])
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(expected))
    ok = ~np.isnan(ours)
    np.testing.assert_array_equal(ours[ok], expected[ok])
    np.testing.assert_array_equal(np.signbit(ours[ok]), np.signbit(expected[ok]))  # -0 too


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_derived_numbers_match_ml_dtypes(fmt):
    fi = ml_dtypes.finfo(ORACLE[fmt.name])
    assert fmt.max_value == float(fi.max)
    assert fmt.min_normal == float(fi.tiny)
    assert fmt.min_subnormal == float(fi.smallest_subnormal)
    assert fmt.bits == fi.bits
    assert fmt.mantissa_bits == fi.nmant


def test_the_numbers_in_facts_md():
    # Micikevicius et al. 2022, Table 1; OCP OFP8
    assert (E4M3.bias, E4M3.max_value, E4M3.min_normal, E4M3.min_subnormal) == (7, 448, 2**-6, 2**-9)
    assert (E5M2.bias, E5M2.max_value, E5M2.min_normal, E5M2.min_subnormal) == (15, 57344, 2**-14, 2**-16)
    assert (E8M0.bias, E8M0.max_value, E8M0.min_normal) == (127, 2.0**127, 2.0**-127)
    assert (E2M1.bias, E2M1.max_value, E2M1.min_normal, E2M1.min_subnormal) == (1, 6, 1, 0.5)
    assert not E4M3.has_inf and E5M2.has_inf and not E8M0.has_inf and not E2M1.has_inf
    assert round(E4M3.dynamic_range_binades) == 18 and round(E5M2.dynamic_range_binades) == 32
    assert E4M3.nan_codes == (0x7F, 0xFF)
    assert E5M2.nan_codes == (0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF)
    assert E8M0.nan_codes == (0xFF,) and E2M1.nan_codes == ()
    assert E2M1.values().tolist() == [-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert len(E4M3.values()) == 253 and len(E5M2.values()) == 247


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1, BF16, FP16], ids=lambda f: f.name)
def test_values_are_exactly_the_finite_codes(fmt):
    v = fmt.values()
    assert torch.all(v[1:] > v[:-1])
    assert v[-1] == fmt.max_value and v[0] == -fmt.max_value
    # every listed value is a fixed point of the cast
    assert torch.equal(cast_reference(v.float(), fmt).double(), v)


def _oracle_inputs(fmt, n_random=70_000, seed=0):
    """>= 10^5 float32 inputs: every value, every exact tie between neighbours and one
    float32 ulp either side of it, subnormals, beyond max, +-0, NaN, inf, and random
    magnitudes over the whole range and a few binades beyond it."""
    v = fmt.values().float()
    if not fmt.signed:
        v = torch.tensor([fmt.decode(c) for c in range(255)], dtype=torch.float32)
    mids = (v[1:].double() + v[:-1].double()) / 2
    mids = mids.float()
    assert torch.equal(mids.double(), (v[1:].double() + v[:-1].double()) / 2), "ties must be exact in float32"
    up = torch.nextafter(mids, torch.tensor(math.inf))
    down = torch.nextafter(mids, torch.tensor(-math.inf))
    g = torch.Generator().manual_seed(seed)
    lo = math.log2(fmt.min_subnormal) - 3
    hi = math.log2(fmt.max_value) + 3
    if hi > 127:
        hi = 127.9
    mags = torch.exp2(torch.empty(n_random, dtype=torch.float64).uniform_(lo, hi, generator=g)).float()
    signs = torch.where(torch.rand(n_random, generator=g) < 0.5, -1.0, 1.0)
    sub = torch.rand(20_000, generator=g) * fmt.min_normal * 1.1
    special = torch.tensor([0.0, -0.0, math.nan, math.inf, -math.inf, 3.4e38, -3.4e38, 1e-45])
    x = torch.cat([v, mids, up, down, mags * signs, sub, -sub, special]).float()
    # repeat ties a few times so that the tie cases weigh in the count
    x = torch.cat([x, mids.repeat(4), up.repeat(2), down.repeat(2)])
    return x


def _ml_dtypes_cast(x: torch.Tensor, fmt) -> np.ndarray:
    # ml_dtypes does not saturate (448 -> NaN for e4m3fn, 1e6 -> inf for e5m2): clamp first
    a = x.numpy().astype(np.float32)
    if fmt.signed:
        a = np.clip(a, -fmt.max_value, fmt.max_value)
    else:
        a = np.clip(a, fmt.min_normal, fmt.max_value)
    return a.astype(ORACLE[fmt.name]).astype(np.float32)


@pytest.mark.parametrize(("fmt", "impl"), _casts(FORMATS))
def test_cast_matches_ml_dtypes_bit_exact(fmt, impl):
    x = _oracle_inputs(fmt)
    if not fmt.signed:  # E8M0: positive inputs only (no sign, no zero)
        x = x.abs()
        x = x[(x > 0) | torch.isnan(x)]
        # ml_dtypes and torch both send every float32 subnormal in (2^-127, 2^-126) up to
        # 2^-126; fp8lab rounds those to nearest like everything else (tested below)
        x = x[~((x > 2.0**-127) & (x < 2.0**-126))]
    if fmt is E2M1:  # ml_dtypes' E2M1 has no NaN to compare against (NaN is checked below)
        x = x[~torch.isnan(x)]
    assert x.numel() >= 100_000
    ours = impl(x, fmt).numpy()
    expected = _ml_dtypes_cast(x, fmt)
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), expected[~nan].view(np.uint32))


@pytest.mark.parametrize(("fmt", "impl"), _casts([E4M3, E5M2, E2M1, E8M0, BF16, FP16]))
def test_every_cast_equals_the_reference_cast_as_values_and_as_codes(fmt, impl):
    x = _oracle_inputs(fmt, n_random=20_000, seed=1)
    want = cast_reference(x, fmt)
    codes = () if fmt.name != "e2m1" and fmt.torch_dtype is None else (fmt.storage_dtype,)  # E8M0: torch >= 2.7
    for dtype in (torch.float32, *codes):  # the values, and the codes quantize keeps
        got = impl(x, fmt, dtype)
        assert got.dtype == dtype and got.shape == x.shape
        a, b = got.float(), want
        assert torch.equal(torch.isnan(a), torch.isnan(b))
        ok = ~torch.isnan(a)
        assert torch.equal(a[ok].view(torch.int32), b[ok].view(torch.int32))
    with pytest.raises(ValueError, match="storage dtype"):
        impl(x, fmt, torch.float64)


def test_cast_saturates_and_keeps_nan():
    x = torch.tensor([1000.0, -1e6, math.inf, -math.inf, math.nan, -0.0])
    assert cast(x, E4M3)[:4].tolist() == [448, -448, 448, -448]
    assert cast(x, E5M2)[:4].tolist() == [1024, -57344, 57344, -57344]  # torch's own cast gives inf here
    assert cast(x, E2M1)[:4].tolist() == [6, -6, 6, -6]
    for fmt in (E4M3, E5M2, E2M1):
        y = cast(x, fmt)
        assert math.isnan(y[4]) and y[5] == 0 and math.copysign(1, y[5]) == -1


def test_e8m0_has_no_sign_or_zero():
    y = cast(torch.tensor([0.0, -1.0, 1e-45, 3.0, 3e38]), E8M0)
    assert math.isnan(y[0]) and math.isnan(y[1])
    assert y[2] == 2.0**-127  # below the smallest value: rounds to it
    assert y[3] == 4.0  # ties round up: 1.5 * 2^k -> 2^(k+1), as ml_dtypes and torch do
    assert y[4] == 2.0**127  # saturates
    # float32 subnormals round to nearest too (ml_dtypes and torch round this band up)
    band = torch.tensor([2.0**-127 * 1.2, 2.0**-127 * 1.5, 2.0**-127 * 1.7])
    assert cast(band, E8M0).tolist() == [2.0**-127, 2.0**-126, 2.0**-126]


def test_torch_dtypes_hold_the_codes():
    for fmt in (f for f in (E4M3, E5M2, E8M0) if f.torch_dtype is not None):  # E8M0: torch >= 2.7
        codes = torch.arange(256, dtype=torch.uint8)
        vals = codes.view(fmt.torch_dtype).float()
        for c in (0, 1, 0x38, 0x7E, 0xFE):
            d = fmt.decode(c)
            assert (math.isnan(d) and math.isnan(vals[c])) or vals[c] == d
    assert E2M1.torch_dtype == getattr(torch, "float4_e2m1fn_x2", None) and E2M1.storage_dtype == torch.float8_e4m3fn
    # every E2M1 value is exactly an E4M3 value, so the unpacked storage is lossless
    assert torch.equal(E2M1.values().float().to(torch.float8_e4m3fn).float(), E2M1.values().float())


def test_encode_decode_round_trip():
    for fmt in (E4M3, E5M2, E2M1):
        for code in range(2**fmt.bits):
            v = fmt.decode(code)
            if math.isnan(v) or (v == 0 and math.copysign(1, v) < 0):
                continue
            if math.isinf(v):
                continue
            assert fmt.encode(v) == code
    assert E4M3.encode(1000) == 0x7E  # saturates to the largest code
    assert E4M3.fields(0x7E) == {"sign": 0, "exponent": 15, "mantissa": 6}


@pytest.mark.parametrize("bad", ["e3m4", "fp8", "", "E4M3X"])
def test_unknown_format_names_the_valid_ones(bad):
    with pytest.raises(ValueError, match="valid formats: e4m3, e5m2, e8m0, e2m1"):
        get_format(bad)
    with pytest.raises(ValueError, match="valid formats"):
        fp8lab.quantize(torch.ones(4, 4), bad)


def test_format_names_and_aliases():
    assert get_format("E4M3") is E4M3 and get_format("float8_e4m3fn") is E4M3
    assert get_format("e8m0fnu") is E8M0 and get_format(E5M2) is E5M2


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.complex64, torch.bool])
def test_cast_refuses_non_float_tensors(dtype):
    with pytest.raises(TypeError, match="floating-point"):
        cast(torch.zeros(3, dtype=dtype), E4M3)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_widen_equals_torch_cast_on_every_code(dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    finite = codes[~torch.isnan(codes.view(dtype).float())]
    for data in (finite.view(dtype), codes.view(dtype), codes.view(dtype).reshape(16, 16).t()):
        got, want = widen(data), data.float()
        assert got.dtype == torch.float32
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan)
        assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))  # bits: -0 too
    # signed zeros keep their sign bit
    zeros = torch.tensor([0x00, 0x80], dtype=torch.uint8).view(dtype)
    assert torch.equal(widen(zeros).view(torch.int32), torch.tensor([0.0, -0.0]).view(torch.int32))


def test_widen_passes_other_dtypes_through():
    x = torch.randn(5).bfloat16()
    assert torch.equal(widen(x), x.float())
