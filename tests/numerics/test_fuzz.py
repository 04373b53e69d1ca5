"""Fuzzing the public API (hypothesis): the C kernels and the torch code on the same inputs.

Every case runs twice, on the kernels and under kernels.disabled() (the torch code, the
definition): the results must be the same bits (any NaN equals any NaN), or both calls must
raise the same exception type; nothing may crash. Inputs: shapes 0..300 per side, contiguous,
transposed, strided and sliced views, views with a pending negation and data at a misaligned
address (memory that is not the values as C reads them), float32/float64/bfloat16/float16, magnitudes from
float32's smallest subnormal to 1e38 (and float64 beyond), NaN, +-inf, +-0.
The default run is bounded (FP8LAB_FUZZ_EXAMPLES per test, 25); a long run:
    FP8LAB_FUZZ_EXAMPLES=2000 python -m pytest tests/numerics/test_fuzz.py   (random, not derandomized)
"""

import math
import os

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import fp8lab
from fp8lab import E2M1, E4M3, E5M2, E8M0, PerBlock, PerRow, PerTensor
from fp8lab.numerics import kernels
from fp8lab.numerics.formats import cast, cast_reference
from fp8lab.numerics.metrics import (
    overflow_fraction,
    overflow_underflow,
    relative_error,
    sqnr,
    subnormal_fraction,
    underflow_fraction,
)
from fp8lab.numerics.quantize import quantize_spec, quantize_with
from fp8lab.numerics.recipes import RECIPES, VARIANTS
from tests.numerics import same_bits

pytestmark = pytest.mark.skipif(not kernels.status()[0], reason=f"kernels not built here: {kernels.status()[1]}")

EXAMPLES = int(os.environ.get("FP8LAB_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 100,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SPECIALS = [0.0, -0.0, math.nan, -math.nan, 1e38, -3e38, 2.0**-149, -(2.0**-140), 2.0**-126]
RARE = [math.inf, -math.inf]  # (quantize refuses them: one case in ~8 has one)


def _both(fn):
    """fn() on the kernels and on the torch code: (result or exception, result or exception)."""
    out = []
    for off in (False, True):
        try:
            if off:
                with kernels.disabled():
                    out.append(fn())
            else:
                out.append(fn())
        except (ValueError, TypeError, RuntimeError) as err:
            out.append(err)
    return out


def _agree(got, want, what):
    """Both raised the same exception type (False), or both returned (True: compare them)."""
    if isinstance(got, Exception) or isinstance(want, Exception):
        assert type(got) is type(want), f"{what}: kernels {got!r} vs torch {want!r}"
        event(f"{what}: both raised {type(got).__name__}: {str(got)[:50]}")  # (--hypothesis-show-statistics)
        return False
    event(f"{what}: both returned")
    return True


# a side of 1..8 or 1..300 elements, 0 (empty) once in 20
_SIDES = st.integers(0, 19).flatmap(
    lambda i: st.just(0) if i == 0 else (st.integers(1, 8) if i < 8 else st.integers(1, 300)))


@st.composite
def tensors(draw, rows=None, cols=None):
    """A float tensor [rows, cols] of any layout, dtype and magnitude, with special values."""
    side = _SIDES
    m = draw(side) if rows is None else rows
    k = draw(side) if cols is None else cols
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided", "sliced", "negated view", "misaligned"]))
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float64, torch.bfloat16, torch.float16]))
    lo = draw(st.integers(-149, 126) if dtype != torch.float16 else st.integers(-24, 14))  # (float16: to 65504)
    span = draw(st.integers(0, 60 if dtype != torch.float16 else 10))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    shape = {"transposed": (k, m), "strided": (m, 2 * k), "sliced": (m + 1, k + 3)}.get(layout, (m, k))
    e = torch.rand(shape, generator=g, dtype=torch.float64) * span + lo
    x = torch.exp2(e.clamp(max=127.9)) * torch.sign(torch.randn(shape, generator=g, dtype=torch.float64))
    x = x.float().double()  # float32 values (subnormals included), kept in float64 for a moment
    if x.numel():
        flat = x.view(-1)
        rare = RARE + ([1e300] if dtype == torch.float64 else [])
        specials = st.one_of(*[st.sampled_from(SPECIALS)] * 12, st.sampled_from(rare))
        for v in draw(st.lists(specials, max_size=3)):
            flat[draw(st.integers(0, flat.numel() - 1))] = v
    x = x.to(dtype)
    if layout == "negated view":  # x's values, stored negated with a pending negation (what x.conj().imag gives)
        return torch._neg_view(-x)
    if layout == "misaligned" and x.numel():  # x's values at an address that is not a multiple of the element size
        memory = torch.zeros(x.numel() * x.element_size() + 1, dtype=torch.uint8)
        view = memory[1:].view(dtype).view(x.shape) if x.element_size() == 1 else _unaligned(memory, x)
        return view.copy_(x)
    return {"transposed": x.t(), "strided": x[:, ::2], "sliced": x[1:, 3:]}.get(layout, x)  # (empty: x itself)


def _unaligned(memory: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A tensor like x whose data starts one byte into `memory` (torch.frombuffer keeps any offset)."""
    buffer = memory.numpy().data.cast("B")
    return torch.frombuffer(buffer, dtype=x.dtype, offset=1, count=x.numel()).view(x.shape)


granularities = st.one_of(
    st.sampled_from([PerTensor(), PerRow(), PerBlock(1, 16), PerBlock(1, 32), PerBlock(1, 128), PerBlock(128, 128),
                     PerBlock(16, 16), PerBlock(32, 1), PerBlock(3, 5)]),
    st.builds(PerBlock, st.integers(1, 400), st.integers(1, 400)),
)
_VALID = st.sampled_from([
    {"fmt": E4M3}, {"fmt": E5M2}, {"fmt": E2M1}, {"fmt": E4M3, "scale_rule": "rceil"},
    {"fmt": E5M2, "scale_rule": "floor"}, {"fmt": E4M3, "scale_rule": "rceil", "scale_fmt": E8M0},
    {"fmt": E4M3, "scale_rule": "floor", "scale_fmt": E8M0}, {"fmt": E2M1, "scale_fmt": E4M3},
    {"fmt": E2M1, "scale_fmt": E4M3, "two_level": True}, {"fmt": E4M3, "scale_fmt": E4M3, "two_level": True},
])
_INVALID = [{"fmt": E4M3, "scale_fmt": E8M0}, {"fmt": E8M0}]  # E8M0 with "exact"; a scale-only format
scalings = st.integers(0, 19).flatmap(lambda i: st.sampled_from(_INVALID) if i == 0 else _VALID)  # 1 in 20 invalid


@FUZZ
@given(x=tensors(), fmt=st.sampled_from([E4M3, E5M2, E2M1]))
def test_cast_agrees(x, fmt):
    want = cast_reference(x, fmt)
    for impl in (cast, kernels.cast):
        for dtype in (torch.float32, fmt.storage_dtype):
            got = impl(x, fmt, dtype)
            assert same_bits(got.float(), want), (impl, dtype)


@FUZZ
@given(x=tensors(), granularity=granularities, scaling=scalings,
       margin=st.one_of(st.just(0), st.integers(0, 3), st.integers(0, 20)),
       amax=st.sampled_from([None, None, None, None, "own", "half", "nan", "negative", "inf", "wrong shape"]),
       count=st.booleans())
def test_quantize_dequantize_and_the_metrics_agree(x, granularity, scaling, margin, amax, count):
    def run():
        spec = quantize_spec(granularity=granularity, margin=margin, **scaling)
        given_amax = None
        if amax is not None:
            own = quantize_with(x, spec).amax  # (also raises what quantize raises)
            given_amax = {"own": own, "half": own / 2, "negative": -own - 1, "inf": own + math.inf,
                          "nan": own * math.nan, "wrong shape": torch.ones(own.numel() + 1)}[amax]
        q = quantize_with(x, spec, given_amax, count=count)
        metrics = (sqnr(x.float(), q), relative_error(x.float(), q), overflow_fraction(x.float(), q),
                   underflow_fraction(x.float(), q), subnormal_fraction(q), overflow_underflow(x.float(), q))
        return q, metrics

    got, want = _both(run)
    if not _agree(got, want, "quantize"):
        return
    (q, m_got), (w, m_want) = got, want
    for name in ("data", "scale", "amax", "tensor_scale"):
        assert same_bits(getattr(q, name), getattr(w, name)), name
    assert same_bits(q.values(), w.values()) and same_bits(q.dequantize(), w.dequantize())
    assert same_bits(q.scale_range(), w.scale_range())
    assert same_bits(tuple(m_got[:5]), tuple(m_want[:5])) and same_bits(m_got[5], m_want[5])
    assert (q.counts is not None) == count  # counted in the kernel's pass where asked ...
    assert w.counts is None  # ... and left to the metrics by the torch code


@FUZZ
@given(data=st.data(), recipe=st.sampled_from([*RECIPES, *VARIANTS]), emulation=st.sampled_from(["fast", "reference"]))
def test_matmul_agrees_for_every_recipe(data, recipe, emulation):
    m, k, n = (data.draw(_SIDES) for _ in range(3))
    a = data.draw(tensors(rows=m, cols=k))
    b = data.draw(tensors(rows=k, cols=n))
    got, want = _both(lambda: fp8lab.matmul(a, b, recipe, backend="emulated", emulation=emulation, verbose=False))
    if _agree(got, want, "matmul"):
        assert got.shape == (m, n) and same_bits(got, want)
