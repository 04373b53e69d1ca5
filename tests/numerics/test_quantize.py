"""quantize / dequantize: properties (hypothesis), shapes, padding, NaN/inf, bad input."""

import contextlib
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import fp8lab
from fp8lab import E2M1, E4M3, E5M2, E8M0, PerBlock, PerRow, PerTensor, quantize
from fp8lab.numerics.quantize import block_amax, quantize_observing, quantize_with
from fp8lab.numerics.recipes import TensorScaling

# every test here runs on the C kernels and on the torch definition (conftest.both_paths)
pytestmark = pytest.mark.usefixtures("both_paths")


GRANULARITIES = [PerTensor(), PerRow(), PerBlock(1, 16), PerBlock(1, 32), PerBlock(1, 128), PerBlock(128, 128),
                 PerBlock(32, 32), PerBlock(3, 5)]


def _step(fmt, y):
    """Spacing of fmt's values at magnitude |y| (float64 tensors)."""
    a = y.abs().clamp(min=fmt.min_normal)
    e = torch.floor(torch.log2(a))
    # guard log2 rounding at exact powers of two
    e = torch.where(torch.exp2(e) > a, e - 1, e)
    e = torch.where(torch.exp2(e + 1) <= a, e + 1, e)
    return torch.exp2(e - fmt.mantissa_bits)


def _check_error_bound(x, q, may_clip):
    deq = q.dequantize()
    assert deq.shape == x.shape and deq.dtype == torch.float32
    assert torch.isfinite(deq).all()
    fmt = q.fmt
    s = q.expanded_scale().double()
    y = x.double() / s  # where each element sat on the format's axis
    d = q.data.double()
    top = fmt.max_value + 0.5 * 2.0 ** (fmt.max_exponent - fmt.mantissa_bits)
    clipped = y.abs() > top
    if not may_clip:
        assert not clipped.any(), "this rule never clips"
    # within half a step at the element's scaled magnitude (plus float32 rounding of x / s)
    bound = 0.5 * _step(fmt, y) * (1 + 1e-6) + y.abs() * 2.0**-22
    inside = ~clipped
    assert ((d - y).abs()[inside] <= bound[inside]).all()
    assert (d[clipped].abs() == fmt.max_value).all()
    assert (torch.sign(d[clipped]) == torch.sign(y[clipped])).all()


# every finite float32 up to 2^125: a rounding up of the largest element, times a power-of-two
# scale, must still fit in float32 when dequantized
LIMIT = 2.0**125
finite_f32 = st.floats(min_value=-LIMIT, max_value=LIMIT, allow_nan=False, allow_infinity=False, width=32)
matrices = st.tuples(st.integers(1, 40), st.integers(1, 70)).flatmap(
    lambda shape: arrays("float32", shape, elements=finite_f32)
)


@given(x=matrices, gran=st.sampled_from(GRANULARITIES), rule=st.sampled_from(["exact", "rceil", "floor"]),
       fmt=st.sampled_from([E4M3, E5M2]), margin=st.integers(0, 3))
def test_dequantize_is_close_and_only_floor_clips(x, gran, rule, fmt, margin):
    x = torch.from_numpy(x)
    q = quantize(x, fmt, gran, rule, margin)
    _check_error_bound(x, q, may_clip=(rule == "floor"))


@given(x=matrices, gran=st.sampled_from([PerBlock(1, 32), PerBlock(2, 32), PerBlock(1, 16)]),
       rule=st.sampled_from(["rceil", "floor"]))
def test_mx_scales_are_e8m0(x, gran, rule):
    x = torch.from_numpy(x)
    q = quantize(x, E4M3, gran, rule, scale_fmt=E8M0)
    _check_error_bound(x, q, may_clip=(rule == "floor"))
    assert torch.equal(fp8lab.cast(q.scale, E8M0), q.scale)  # every scale is an E8M0 value


@given(x=matrices, floor=st.sampled_from(["zero", "min_normal"]))
def test_nvfp4_two_level_bound(x, floor):
    x = torch.from_numpy(x)
    q = quantize(x, E2M1, PerBlock(1, 16), scale_fmt="e4m3", two_level=True, scale_floor=floor)
    assert torch.equal(fp8lab.cast(q.scale, E4M3), q.scale)
    assert (q.scale >= E4M3.min_normal).all() if floor == "min_normal" else (q.scale >= 0).all()
    deq = q.dequantize()
    assert torch.isfinite(deq).all() and deq.shape == x.shape
    s = q.expanded_scale().double()
    # a zero scale (the training floor: a block below half E4M3's smallest subnormal scale) holds
    # nothing: its values are 0, each below 6 x 2^-10 x the tensor scale
    zero = s == 0
    assert (deq[zero] == 0).all()
    assert (x.double().abs()[zero] <= 6 * 2**-10 * float(q.tensor_scale) * (1 + 1e-6)).all()
    # E4M3 rounding of a normal block scale can push the block max up to 1/16 over 6, which clips; a
    # subnormal scale (a grid of 2^-9, the training floor) rounds down by up to a third: 6 x 1.5
    y = torch.where(zero, 0.0, x.double() / s)
    subnormal = (s > 0) & (s < E4M3.min_normal * float(q.tensor_scale))
    assert (y.abs()[~subnormal] <= 6 * (1 + 2**-3) + 1e-6).all() and (y.abs()[subnormal] <= 9 + 1e-6).all()
    # and the values come back: within half an E2M1 step of each element's scaled magnitude, plus what clipped
    err = torch.where(zero, 0.0, (deq.double() - x.double()).abs())
    bound = s * (torch.clamp(y.abs() / 4, min=0.25) + (y.abs() - 6).clamp(min=0))
    assert (err <= bound * (1 + 1e-6) + 1e-30).all()


def test_zero_blocks_get_scale_one_and_zeros():
    x = torch.zeros(4, 64)
    x[0, :32] = 3.0
    for rule in ("exact", "rceil", "floor"):
        q = quantize(x, E4M3, PerBlock(1, 32), rule)
        assert q.scale[1:].eq(1).all() and q.scale[0, 1] == 1
        assert q.data.float()[1:].eq(0).all()
    assert quantize(torch.zeros(3, 3)).scale == 1


def test_scale_rules_are_the_formulas_in_design_md():
    amax = torch.tensor([1.0, 3.0, 448.0, 500.0, 1e-3, 7e4])
    x = torch.diag(amax)  # one nonzero per row: per-row amax is the diagonal
    for rule, expected in {
        "exact": amax / 448,
        "rceil": torch.exp2(torch.ceil(torch.log2(amax.double() / 448))).float(),
        "floor": torch.exp2(torch.floor(torch.log2(amax.double())) - 8).float(),
    }.items():
        q = quantize(x, E4M3, PerRow(), rule)
        torch.testing.assert_close(q.scale.flatten(), expected, rtol=2**-23, atol=0)
    # margin m divides the usable max by 2**m
    q = quantize(x, E4M3, PerRow(), "exact", margin=2)
    torch.testing.assert_close(q.scale.flatten(), amax / 112, rtol=2**-23, atol=0)


def test_shapes_that_do_not_divide_are_padded_not_refused():
    x = torch.randn(130, 200)
    for gran, scale_shape in [(PerBlock(1, 128), (130, 2)), (PerBlock(128, 128), (2, 2)), (PerRow(), (130, 1)),
                              (PerBlock(7, 9), (19, 23)), (PerTensor(), ())]:
        q = quantize(x, E4M3, gran)
        assert q.scale.shape == scale_shape and q.data.shape == x.shape
        assert fp8lab.sqnr(x, q) > 25
    # the padded and the cropped agree: a block's scale comes from its real elements only
    q_pad = quantize(x, E4M3, PerBlock(128, 128))
    q_crop = quantize(x[128:, 128:].contiguous(), E4M3, PerTensor())
    assert torch.equal(q_pad.scale[1, 1], q_crop.scale)
    assert torch.equal(q_pad.codes()[128:, 128:], q_crop.codes())


def test_per_tensor_takes_any_shape():
    x = torch.randn(2, 3, 5, 7)
    q = quantize(x, E5M2)
    assert q.data.shape == x.shape and q.scale.shape == ()
    assert torch.allclose(q.dequantize(), x, rtol=0.13, atol=1e-3)


def test_nan_propagates_to_its_block_only():
    x = torch.randn(4, 64)
    x[1, 5] = math.nan
    q = quantize(x, E4M3, PerBlock(1, 32))
    deq = q.dequantize()
    assert torch.isnan(deq[1, :32]).all() and torch.isfinite(deq[1, 32:]).all()
    assert torch.isfinite(deq[[0, 2, 3]]).all()
    assert torch.isnan(q.scale[1, 0])
    # per tensor, one NaN poisons everything: the lesson of notebook 02
    assert torch.isnan(quantize(x).dequantize()).all()
    # MX: the block's E8M0 scale is the NaN code 0xFF
    qm = quantize(x, E4M3, PerBlock(1, 32), "rceil", scale_fmt=E8M0)
    assert qm.scale_codes()[1, 0] == 0xFF


def test_inf_is_refused_with_a_way_out():
    x = torch.randn(4, 4)
    x[0, 0] = math.inf
    with pytest.raises(ValueError, match=r"infinite.*nan_to_num"):
        quantize(x)
    with pytest.raises(ValueError, match=r"beyond float32's range \(largest \|x\| 1e\+300"):
        quantize(torch.tensor([1e300], dtype=torch.float64))  # finite, but not in float32: not "infinite"


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.complex64, torch.bool])
def test_non_float_tensors_are_refused(dtype):
    with pytest.raises(TypeError, match="floating-point"):
        quantize(torch.zeros(4, 4, dtype=dtype))


def test_other_dtypes_are_accepted():
    x = torch.randn(8, 32)
    for dtype in (torch.float64, torch.bfloat16, torch.float16):
        q = quantize(x.to(dtype), E4M3, PerBlock(1, 32))
        assert q.dequantize().dtype == torch.float32


@pytest.mark.parametrize("rows,cols", [(0, 128), (1, 0), (-1, 32), (1.5, 32), (True, 32)])
def test_bad_block_sizes(rows, cols):  # (and beyond 2**31 - 1: tests/numerics/test_hardening.py)
    with pytest.raises(ValueError, match="positive integer"):
        PerBlock(rows, cols)


def test_more_than_2d_with_a_2d_granularity_says_what_to_reshape():
    x = torch.randn(2, 3, 64)
    with pytest.raises(ValueError, match=r"reshape\(-1, 64\)"):
        quantize(x, E4M3, PerBlock(1, 32))
    with pytest.raises(ValueError, match="2-D"):
        quantize(torch.randn(64), E4M3, PerRow())


def test_bad_names_list_the_valid_choices():
    x = torch.randn(4, 4)
    with pytest.raises(ValueError, match="valid rules: exact, rceil, floor"):
        quantize(x, E4M3, PerTensor(), "round")
    with pytest.raises(ValueError, match="'per-tensor', 'per-row'"):
        quantize(x, E4M3, "blocky")
    with pytest.raises(ValueError, match="scale-only"):
        quantize(x, E8M0)
    with pytest.raises(ValueError, match="'rceil' or 'floor'"):
        quantize(x, E4M3, PerBlock(1, 2), "exact", scale_fmt=E8M0)
    with pytest.raises(ValueError, match="non-negative integer"):
        quantize(x, E4M3, margin=-1)
    with pytest.raises(ValueError, match="empty"):
        quantize(torch.zeros(0, 4))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        quantize([1.0, 2.0])


def test_granularity_labels_round_trip():
    for g in GRANULARITIES:
        assert fp8lab.parse_granularity(g.label) == g
    assert fp8lab.parse_granularity("1x128") == PerBlock(1, 128)


def test_e2m1_codes_and_packing():
    x = torch.tensor([[0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]])
    q = quantize(x, E2M1, PerTensor(), "rceil")  # amax 6 -> scale 1
    assert q.scale == 1
    assert q.codes().tolist() == [list(range(16))]
    assert q.packed().view(torch.uint8).tolist() == [[0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]]


def test_scale_overhead_bits():
    x = torch.randn(256, 256)
    assert quantize(x, E4M3, PerBlock(1, 128)).scale_bits_per_element == 32 / 128
    assert quantize(x, E4M3, PerBlock(1, 32), "rceil", scale_fmt=E8M0).scale_bits_per_element == 8 / 32
    q = quantize(x, E2M1, PerBlock(1, 16), scale_fmt=E4M3, two_level=True)
    assert q.scale_bits_per_element == pytest.approx(8 / 16 + 32 / 65536)


def test_large_tensor_chunks_agree_with_small():
    # the scale-and-cast loop works in chunks: the answer cannot depend on them
    x = torch.randn(1000, 1000)
    big = quantize(x, E4M3, PerBlock(1, 128))
    rows = torch.cat([quantize(x[i : i + 1], E4M3, PerBlock(1, 128)).codes() for i in range(0, 1000, 97)])
    assert torch.equal(big.codes()[::97], rows)


def test_an_explicit_amax_per_block_sets_each_scale():
    """One amax per block, shaped like the scale (fp8lab.training.distributed passes amaxes reduced over ranks)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 96, generator=g)
    for gran in (PerRow(), PerBlock(1, 32)):
        own = quantize(x, E4M3, gran)
        doubled = quantize(x, E4M3, gran, amax=own.amax * 2)
        torch.testing.assert_close(doubled.scale, own.scale * 2, rtol=0, atol=0)
        assert doubled.amax.shape == own.amax.shape
    with pytest.raises(ValueError, match=r"one amax per block, shaped \(40, 1\)"):
        quantize(x, E4M3, PerRow(), amax=torch.ones(3))


@pytest.mark.parametrize("margin", [-1, 1.5, True])
def test_a_bad_margin_is_refused_for_every_scale_format(margin):
    x = torch.randn(4, 32)
    for kw in ({}, {"scale_rule": "rceil", "scale_fmt": E8M0}, {"scale_fmt": E4M3, "two_level": True}):
        with pytest.raises(ValueError, match="margin must be a non-negative integer"):
            quantize(x, E2M1 if kw.get("scale_fmt") is E4M3 else E4M3, PerBlock(1, 16), margin=margin, **kw)


def test_transpose_can_name_its_blocks_per_row_and_refuses_other_blocks():
    """One block per column of x (PerBlock(M, 1)) is per-row scaling of x^T: t(PerRow()) says so."""
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    q = quantize(x, granularity=PerBlock(6, 1))
    qt = q.t(PerRow())
    direct = quantize(x.t().contiguous(), granularity=PerRow())
    assert qt.granularity == PerRow()
    assert torch.equal(qt.data.view(torch.uint8), direct.data.view(torch.uint8))
    assert torch.equal(qt.scale, direct.scale)
    with pytest.raises(ValueError, match="the transpose's blocks are 1x6, not 2x2"):
        q.t(PerBlock(2, 2))


# ---- the definition and its fast twins (quantize_fast): the same bits -----------------------------------------

TWIN_SETTINGS = [
    dict(fmt="e4m3"), dict(fmt="e5m2"), dict(fmt="e4m3", scale_rule="rceil"), dict(fmt="e4m3", margin=2),
    dict(fmt="e4m3", scale_rule="floor", scale_fmt="e8m0"), dict(fmt="e5m2", scale_rule="rceil", scale_fmt="e8m0"),
    dict(fmt="e2m1", scale_fmt="e4m3", two_level=True),
    dict(fmt="e2m1", scale_fmt="e4m3", two_level=True, scale_floor="min_normal"),
    dict(fmt="e2m1", scale_fmt="e4m3", two_level=True, rounding="stochastic"), dict(fmt="e5m2", rounding="stochastic"),
]


def _same_floats(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit where a number, NaN where NaN (the kernel's NaN and torch's carry different payloads)."""
    nan = torch.isnan(a)
    return (a.shape == b.shape and torch.equal(nan, torch.isnan(b))
            and torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32)))


def _bits_equal(a, b) -> bool:
    same_tensor_scale = (a.tensor_scale is None and b.tensor_scale is None) or _same_floats(a.tensor_scale,
                                                                                           b.tensor_scale)
    return (torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)) and _same_floats(a.scale, b.scale)
            and _same_floats(a.amax, b.amax) and same_tensor_scale)


@pytest.mark.parametrize("settings", TWIN_SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch"])
def test_quantize_with_gives_the_definitions_bits(settings, kernel):
    """quantize_with (the C kernel, or the torch code a chunk at a time) and quantize_definition agree code for
    code and scale for scale: every granularity, shapes that do not divide the blocks, zeros, a NaN, a given
    amax, stochastic rounding from the same seed, a bfloat16 x."""
    from fp8lab.numerics import kernels
    from fp8lab.numerics.quantize import quantize_definition, quantize_spec, quantize_with

    torch.manual_seed(0)
    for granularity in ("per-tensor", "per-row", "1x32", "16x16", "1x128", "128x128", "7x5"):
        spec = quantize_spec(granularity=granularity, **settings)
        for shape in ((64, 96), (33, 250), (300, 1030)):
            x = torch.randn(shape) * torch.rand(shape[0], 1) * 10
            x[0, :5] = 0.0
            cases = [(x, None), (x.to(torch.bfloat16), None)]
            if granularity == "per-tensor":
                cases.append((x, torch.tensor(3.0)))  # delayed scaling's amax: values beyond it clip
            nan = x.clone()
            nan[-1, -1] = math.nan
            cases.append((nan, None))
            for xi, amax in cases:
                with contextlib.nullcontext() if kernel else kernels.disabled():
                    fast = quantize_with(xi, spec, amax, generator=torch.Generator().manual_seed(7))
                want = quantize_definition(xi, spec, amax, generator=torch.Generator().manual_seed(7))
                assert _bits_equal(fast, want), (settings, granularity, shape, xi.dtype, amax)


@pytest.mark.parametrize("nan", [False, True], ids=["inf", "inf beside a nan"])
def test_a_refused_infinity_takes_no_stochastic_draws(nan):
    """quantize_definition refuses an x with an infinity before it draws: quantize_with's generator (the C kernel's
    path and the torch code's, both_paths) goes on with the stream of a generator seeded alike and never used (a
    loop that catches the ValueError draws the same numbers after it as with the definition)."""
    from fp8lab.numerics.quantize import quantize_definition, quantize_spec, quantize_with

    spec = quantize_spec(fmt="e5m2", granularity="1x32", rounding="stochastic")
    x = torch.randn(16, 64)
    x[3, 7] = math.inf
    if nan:
        x[3, 8] = math.nan  # the block's amax is NaN: the infinity is found beside it
    unused = torch.rand(100, generator=torch.Generator().manual_seed(5))
    for quantize_x in (quantize_definition, quantize_with):
        generator = torch.Generator().manual_seed(5)
        with pytest.raises(ValueError, match="infinite"):
            quantize_x(x, spec, generator=generator)
        assert torch.equal(torch.rand(100, generator=generator), unused), quantize_x.__name__


def _derived_equal(a, b) -> bool:
    """The float32 copies a QuantizedTensor carries (values, or values times block scales) and its scale range."""
    same = [(x is None and y is None) or (x is not None and y is not None and _same_floats(x, y))
            for x, y in ((a.derived.values, b.derived.values), (a.derived.scaled, b.derived.scaled))]
    return all(same) and _same_floats(torch.tensor(a.scale_range()), torch.tensor(b.scale_range()))


@pytest.mark.parametrize("settings", [dict(fmt="e4m3"), dict(fmt="e5m2", scale_rule="floor"),
                                      dict(fmt="e4m3", scale_rule="rceil", scale_fmt="e8m0"),
                                      dict(fmt="e2m1", scale_fmt="e4m3", two_level=True)],
                         ids=["e4m3", "e5m2-floor", "mx", "nvfp4"])
def test_the_plain_pass_is_the_kernel_branchs_pass(settings, monkeypatch):
    """quantize_with's pass for a GEMM operand (quantize_fast.plain_pass: x a plain 2-D float32 CPU tensor, no
    amax given, nothing counted, rounding to nearest) makes the QuantizedTensor the general kernel branch makes,
    field for field: codes, scales, amaxes, the tensor scale, the float32 values written beside the codes (folded
    with the block scales where the blocks are narrower than both sides), the scale range, and x's own amaxes;
    a NaN propagates to its block in the one pass. It stands aside for bfloat16 and an infinity (beside a NaN
    too), which the branch widens or refuses as before; with the torch code it stands aside for everything."""
    from fp8lab.numerics import kernels, quantize_fast
    from fp8lab.numerics.quantize import quantize_definition, quantize_observing, quantize_spec

    def general_branch(x, spec, values):
        with monkeypatch.context() as patch:
            patch.setattr(quantize_fast, "plain_pass", lambda *args: None)
            return quantize_observing(x, spec, None, values=values)

    torch.manual_seed(0)
    for granularity in ("per-tensor", "per-row", "1x32", "16x16", "128x128", "7x5"):
        spec = quantize_spec(granularity=granularity, **settings)
        for shape in ((64, 96), (33, 250)):
            x = torch.randn(shape) * torch.rand(shape[0], 1) * 10
            nan = x.clone()
            nan[-1, -1] = math.nan
            if not kernels.engine().kernels:  # (the torch code: the pass is the kernel's, so it stands aside)
                assert quantize_fast.plain_pass(x, spec, None) is None
                continue
            for xi, values in ((x, None), (x, True), (x, False), (nan, None), (x.t(), None)):
                assert quantize_fast.plain_pass(xi, spec, values) is not None, (granularity, shape)
                got, own = quantize_observing(xi, spec, None, values=values)
                want, want_own = general_branch(xi, spec, values)
                assert _bits_equal(got, want) and _same_floats(own, want_own), (settings, granularity, shape)
                assert _derived_equal(got, want), (settings, granularity, shape, values)
                assert _bits_equal(got, quantize_definition(xi, spec)), (settings, granularity, shape)
            inf = x.clone()
            inf[0, 0] = math.inf
            beside_nan = inf.clone()
            beside_nan[0, 1] = math.nan  # (the block's amax is NaN: only a look at x finds the infinity)
            for aside in (x.to(torch.bfloat16), inf, beside_nan):
                assert quantize_fast.plain_pass(aside, spec, None) is None
            for refused in (inf, beside_nan):
                with pytest.raises(ValueError, match="infinite"):
                    quantize_with(refused, spec)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_the_plain_pass_takes_delayed_scalings_one_amax_as_the_kernel_branch_does(fmt, monkeypatch):
    """Delayed scaling's pass (one amax for the whole tensor, from its history) takes the plain pass: the
    QuantizedTensor and x's own amax the general kernel branch makes, field for field, for an amax below x's (codes
    clip), above it, zero and NaN, and for a NaN in x; an amax the branch refuses (negative, infinite), one for a
    per-block spec and one that is not float32 leave it to the branch, which refuses or converts as before. (With the
    torch code it stands aside.)"""
    from fp8lab.numerics import kernels, quantize_fast
    from fp8lab.numerics.quantize import quantize_definition

    def general_branch(x, spec, amax):
        with monkeypatch.context() as patch:
            patch.setattr(quantize_fast, "plain_pass", lambda *args: None)
            return quantize_observing(x, spec, amax)

    spec = TensorScaling(fmt)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(48, 80, generator=g) * torch.logspace(-4, 2, 80)
    nan = x.clone()
    nan[3, 7] = math.nan
    own = float(x.abs().max())
    if not kernels.engine().kernels:  # (the torch code: the pass is the kernel's, so it stands aside)
        assert quantize_fast.plain_pass(x, spec, None, torch.tensor(own)) is None
        return
    for xi in (x, nan, x.t()):
        for value in (own / 8, own * 3, 0.0, math.nan):
            amax = torch.tensor(value)
            assert quantize_fast.plain_pass(xi, spec, None, amax) is not None, value
            got, got_own = quantize_observing(xi, spec, amax)
            want, want_own = general_branch(xi, spec, amax)
            assert _bits_equal(got, want) and _same_floats(got_own, want_own), value
            assert _derived_equal(got, want) and _same_floats(got.amax, want.amax), value
            assert _bits_equal(got, quantize_definition(xi, spec, amax)), value
    for refused in (-1.0, math.inf):
        assert quantize_fast.plain_pass(x, spec, None, torch.tensor(refused)) is None
        with pytest.raises(ValueError, match="an amax is max"):
            quantize_with(x, spec, torch.tensor(refused))
    blocks = TensorScaling(fmt, granularity=PerBlock(1, 32))
    assert quantize_fast.plain_pass(x, blocks, None, torch.tensor(own)) is None
    with pytest.raises(ValueError, match="one amax per block"):
        quantize_with(x, blocks, torch.tensor(own))
    double = torch.tensor(own / 8, dtype=torch.float64)
    assert quantize_fast.plain_pass(x, spec, None, double) is None
    assert _bits_equal(quantize_with(x, spec, double), quantize_with(x, spec, torch.tensor(own / 8)))


@pytest.mark.parametrize("granularity", [PerTensor(), PerBlock(1, 32)])
def test_quantize_observing_is_quantize_with_a_given_amax_and_reads_xs_own_amax(granularity):
    """Delayed scaling's one pass: the codes and scales of quantize_with(x, spec, amax), and x's own amax per
    block, bit for bit block_amax(x) (on both paths: both_paths)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 96, generator=g) * torch.logspace(-3, 3, 96)
    spec = TensorScaling("e4m3", granularity=granularity)
    given = block_amax(x * 0.25, granularity)  # (a history's amax: smaller than x's, so some codes clip)
    q, own = quantize_observing(x, spec, given)
    ref = quantize_with(x, spec, given)
    assert torch.equal(q.data, ref.data) and torch.equal(q.scale, ref.scale) and torch.equal(q.amax, ref.amax)
    assert torch.equal(q.amax.reshape(given.shape), given)  # the amax it was scaled from
    assert torch.equal(own.reshape(given.shape), block_amax(x, granularity))
    with pytest.raises(ValueError, match="inf"):
        quantize_observing(torch.where(x > 2, torch.inf, x), spec, given)
