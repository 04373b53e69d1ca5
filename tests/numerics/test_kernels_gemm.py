"""fp8lab.numerics.kernels_gemm: each of the emulated GEMM's C kernels against its torch twin, bit for bit."""

import itertools
import math

import pytest
import torch

from fp8lab import E2M1, E4M3, PerBlock, PerRow, PerTensor, quantize
from fp8lab.gemm import emulated_mm, emulation
from fp8lab.numerics import kernels, kernels_gemm
from fp8lab.numerics.formats import widen
from fp8lab.numerics.recipes import RECIPES, get_recipe
from tests.numerics import same_bits

pytestmark = pytest.mark.skipif(not kernels.status()[0], reason=f"kernels not built here: {kernels.status()[1]}")


@pytest.mark.skipif(not kernels.engine().kernels, reason="the fused kernels are not built here")
def test_scale_outer_takes_scales_per_row_one_for_all_or_none_with_the_torch_twins_bits():
    """Every form the emulated GEMM's output scales take (per row x per column, per row x one value, one x one,
    one side missing: a tensor factor alone), with and without a K segment's partial sums, over NaN, infinite,
    zero and negative-zero factors: the kernel's bits are the torch twin's."""
    g = torch.Generator().manual_seed(9)
    m, n = 37, 70
    out, part = torch.randn(m, n, generator=g) * 1e3, torch.randn(m, n, generator=g)
    out[0, :4] = torch.tensor([0.0, -0.0, math.inf, math.nan])
    rows, cols = torch.rand(m, generator=g) * 4, torch.rand(n, generator=g) * 4
    rows[:3], cols[:3] = torch.tensor([math.nan, 0.0, -0.0]), torch.tensor([math.inf, 1e-30, -2.0])
    sides = {"per row": (rows, cols), "one": (torch.tensor(0.375), torch.tensor(-3.0)), "none": (None, None)}
    forms = 0
    for (name_a, (a, _)), (name_b, (_, b)) in itertools.product(sides.items(), repeat=2):
        if a is None and b is None:
            continue
        for p in (None, part):
            got = kernels_gemm.scale_outer_(out.clone(), a, b, p)
            want = emulation._scale_outer_(out.clone(), a, b, p)
            assert same_bits(got, want), (name_a, name_b, p is None)
            forms += 1
    assert forms == 16
    with pytest.raises(ValueError, match="not both None"):
        kernels_gemm.scale_outer_(out, None, None)


@pytest.mark.skipif(not kernels.engine().kernels, reason="the fused kernels are not built here")
def test_add_row_adds_a_bias_with_torchs_bits():
    """A layer's bias added by the kernel (an FP8 layer's output, on the calling thread): torch's add_, bit for
    bit, over rows of zeros, negative zeros, infinities and NaNs, one row and one column too; other shapes refused."""
    g = torch.Generator().manual_seed(10)
    for m, n in ((37, 70), (1, 5), (6, 1), (300, 257)):
        out, row = torch.randn(m, n, generator=g) * 1e30, torch.randn(n, generator=g) * 1e30
        out[0, : min(n, 4)] = torch.tensor([-0.0, math.inf, math.nan, 3e38])[: min(n, 4)]
        row[: min(n, 4)] = torch.tensor([-0.0, -math.inf, 1.0, 3e38])[: min(n, 4)]
        assert same_bits(kernels_gemm.add_row_(out.clone(), row), out.clone().add_(row)), (m, n)
    with pytest.raises(ValueError, match=r"row\[N\]: got \(4, 3\), 4"):
        kernels_gemm.add_row_(torch.ones(4, 3), torch.ones(4))
    with pytest.raises(ValueError, match="add_row_ takes out"):
        kernels_gemm.add_row_(torch.ones(4, 3).t(), torch.ones(4))  # (a view it cannot write in place)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_the_reference_gemms_segments_match_with_and_without_kernels(recipe):
    """emulation="reference" adds each K segment's scaled partial sums with the kernel's scale_outer_ (given part)
    where the kernels run: the torch code's bits, also where NVFP4 block scales are 0 (sinks far above ordinary
    values), the case that sends the fast emulation to the reference."""
    r = get_recipe(recipe)
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(96, 320, generator=g), torch.randn(80, 320, generator=g)
    a[:, 7] = 1e6  # (a sink channel: NVFP4's tensor scale leaves the ordinary blocks' E4M3 scales at 0)
    sa, sb = r.scaling("input", "fprop"), r.scaling("weight", "fprop")
    got = emulated_mm(quantize(a, sa), quantize(b, sb), emulation="reference")
    with kernels.disabled():
        want = emulated_mm(quantize(a, sa), quantize(b, sb), emulation="reference")
    assert same_bits(got, want)
    if r.name == "nvfp4":
        assert float(quantize(a, sa).scale.min()) == 0.0 and emulated_mm(quantize(a, sa), quantize(b, sb)).equal(got)


def test_the_reference_gemms_exact_segments_run_in_one_call_with_the_loops_bits(monkeypatch):
    """Where every partial sum is exact (E2M1 operands), emulation="reference" runs the whole loop over K segments
    in one kernel call (segment_mm): the loop's bits, over shapes the kernel's tiles of 6 x 64 outputs do not
    divide, K that the segments do not divide, blocks of different widths, per-tensor and per-row scales beside
    blocks, zero block scales (a sink) and tensor scales; and it did run (a spy counts its calls)."""
    g = torch.Generator().manual_seed(5)
    cases = [((96, 320), (80, 320), PerBlock(1, 16), PerBlock(16, 16)), ((7, 40), (65, 40), PerBlock(1, 16),
             PerBlock(1, 32)), ((130, 1000), (70, 1000), PerBlock(1, 16), PerTensor()), ((1, 16), (1, 16),
             PerBlock(1, 16), PerBlock(1, 16)), ((200, 24), (129, 24), PerBlock(1, 16), PerRow()),
             ((64, 512), (300, 512), PerBlock(1, 32), PerBlock(1, 16))]
    calls, segment_mm = [], kernels_gemm.segment_mm
    monkeypatch.setattr(kernels_gemm, "segment_mm", lambda *args: calls.append(args[:2]) or segment_mm(*args))
    for (m, k), (n, _), ga, gb in cases:
        a = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-8, 8, (m, 1), generator=g).float())
        b = -torch.randn(n, k, generator=g)
        a[:, min(7, k - 1)] = 1e6  # ordinary blocks' E4M3 scales 0 beside the sink
        qa = quantize(a, E2M1, ga, scale_fmt=E4M3, two_level=True)
        qb = quantize(b, E2M1, gb, scale_fmt=E4M3, two_level=True)
        got = emulated_mm(qa, qb, emulation="reference")
        with kernels.disabled():
            want = emulated_mm(qa, qb, emulation="reference")
        assert same_bits(got, want), (m, n, k, ga, gb)
    assert len(calls) == len(cases)
    # operands whose values the quantize pass did not write (it wrote them folded) go in as their codes
    assert all(t.dtype == torch.float8_e4m3fn for t in calls[0]) and calls[2][1].dtype == torch.float32
    # E4M3 operands' partial sums are not exact: they keep the loop
    emulated_mm(quantize(a, E4M3, PerBlock(1, 32)), quantize(b, E4M3, PerBlock(1, 16)), emulation="reference")
    assert len(calls) == len(cases)


def test_segment_mm_skips_only_the_segments_that_add_nothing():
    """segment_mm skips a tile's segment whose factors sa * sb are all zero: the loop's bits where the zero scales
    meet finite ones, and a zero scale times an infinite or NaN one still gives the loop's NaN; operands in any
    layout."""
    g = torch.Generator().manual_seed(7)
    m, n, k, seg = 13, 70, 48, 16
    a = torch.randint(-12, 13, (m, k), generator=g).float() / 2  # E2M1-like values: exact partial sums
    b = torch.randint(-12, 13, (n, k), generator=g).float() / 2
    sa, sb = torch.rand(3, m, generator=g) + 0.5, torch.rand(3, n, generator=g) + 0.5
    sa[0], sa[1, :7], sb[2, 64:] = 0.0, 0.0, 0.0  # whole segments, a tile's rows, the last tile's columns
    sb_inf = sb.clone()
    sb_inf[0, 3], sb_inf[1, 65] = float("inf"), float("nan")
    for scales in (sb, sb_inf):
        want = torch.zeros(m, n)
        for s in range(3):
            part = a[:, s * seg:(s + 1) * seg] @ b[:, s * seg:(s + 1) * seg].t()
            want.add_(part * (sa[s, :, None] * scales[s, None, :]))
        assert same_bits(kernels_gemm.segment_mm(a, b, sa, scales, seg), want)
        # transposed views (read in their layout, wgrad's operands), a pending negation (resolved first)
        a_t, b_t = a.t().contiguous().t(), b.t().contiguous().t()
        assert same_bits(kernels_gemm.segment_mm(a_t, b_t, sa, scales, seg), want)
        assert same_bits(kernels_gemm.segment_mm(torch._neg_view(-a_t), torch._neg_view(-b), sa, scales, seg), want)
    assert kernels_gemm.segment_mm(a, b, sa, sb_inf, seg).isnan().any()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_the_widen_twin_gives_formats_widens_bits_for_every_code(dtype):
    """kernels_gemm.widen_codes against formats.widen: every one of the 256 codes (NaN codes, -0, subnormals) bit for
    bit, alone, inside a tensor of codes split over threads and in transposed views (their layout too)."""
    every = torch.arange(256, dtype=torch.uint8).view(dtype)
    assert kernels_gemm.widens(every) and same_bits(kernels_gemm.widen_codes(every), widen(every))
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (300, 700), dtype=torch.uint8, generator=g)
    codes[codes == 0x7F] = 0  # (no E4M3 NaN: formats.widen then takes its fast path, whose bits the table holds)
    data = codes.view(dtype)
    assert same_bits(kernels_gemm.widen_codes(data), widen(data))
    assert kernels_gemm.widen_codes(data).shape == data.shape and not kernels_gemm.widens(data[:, ::2])
    assert not kernels_gemm.widens(torch._efficientzerotensor((4, 4), dtype=dtype))  # no memory of its own (accepts')
    for view in (data.t(), data[:100].t()):  # transposed views: the same bits, laid out as formats.widen lays them
        got, want = kernels_gemm.widen_codes(view), widen(view)
        assert kernels_gemm.widens(view) and same_bits(got, want) and got.stride() == want.stride()
    q = quantize(torch.randn(64, 96), E2M1, PerBlock(1, 16), scale_fmt=E4M3)  # values() through the twin
    with kernels.disabled():
        assert not kernels_gemm.widens(q.data)
    assert same_bits(q.values(), widen(q.data))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_segment_mm_reads_fp8_codes_as_their_values(dtype):
    """segment_mm given one-byte codes for a, b or both (contiguous, or transposed views as wgrad's operands are)
    reads each code's value from widen_codes' table: the bits its float32 values give, every code but NaN's,
    over shapes the 6 x 64 tiles do not divide."""
    g = torch.Generator().manual_seed(8)
    m, n, k, seg = 13, 70, 48, 16
    raw = torch.randint(0, 256, (m + n, k), dtype=torch.uint8, generator=g)
    raw[widen(raw.view(dtype)).isnan()] = 0  # (NaN codes: a NaN in every sum they meet)
    codes = raw.view(dtype)
    a, b = codes[:m], codes[m:]
    sa, sb = torch.rand(3, m, generator=g) + 0.5, torch.rand(3, n, generator=g) + 0.5
    want = kernels_gemm.segment_mm(widen(a), widen(b), sa, sb, seg)
    for a_in, b_in in ((a, b), (a, widen(b)), (widen(a), b), (a.t().contiguous().t(), b.t().contiguous().t())):
        assert kernels_gemm.widens(a_in) or a_in.dtype == torch.float32
        assert same_bits(kernels_gemm.segment_mm(a_in, b_in, sa, sb, seg), want), (a_in.dtype, b_in.dtype)
