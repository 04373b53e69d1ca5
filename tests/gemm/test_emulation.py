"""fp8lab.gemm.emulation: emulated_mm's definition and its fast twin against a float64 product of the
dequantized operands; bit-exact where every partial sum is exact; fp32 matmuls pinned to IEEE.

Every recipe and shape against the Higham bound: tests/gemm/test_gemm.py.
"""

import dataclasses
import itertools

import pytest
import torch

from fp8lab.gemm import emulation as emulation_module
from fp8lab.gemm.emulation import EMULATIONS, emulated_mm, ieee_fp32_matmul, quantize_operands
from fp8lab.numerics.formats import E4M3
from fp8lab.numerics.quantize import Derived, quantize, quantize_spec, quantize_transposed, quantize_with
from fp8lab.numerics.scaling import PerBlock, PerTensor


def _exact(a_q, b_q):
    return a_q.dequantize().double() @ b_q.dequantize().double().T


@pytest.mark.parametrize("emulation", EMULATIONS)
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4"])
def test_both_emulations_are_the_dequantized_product_within_the_higham_bound(recipe, emulation):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 256, generator=g), torch.randn(256, 12, generator=g)
    a_q, b_q = quantize_operands(a, b, recipe)
    assert a_q.shape == (8, 256) and b_q.shape == (12, 256)  # b in its [N, K] layout
    out = emulated_mm(a_q, b_q, emulation=emulation)
    assert out.dtype == torch.float32 and out.shape == (8, 12)
    exact = _exact(a_q, b_q)
    u, k = 2.0**-24, 256
    gamma = (k + 2) * u / (1 - (k + 2) * u)
    bound = gamma * (a_q.dequantize().double().abs() @ b_q.dequantize().double().abs().T) + u * exact.abs()
    assert bool(((out.double() - exact).abs() <= bound).all())


@pytest.mark.parametrize("emulation", EMULATIONS)
def test_operands_of_different_block_widths_sum_over_segments_where_both_scales_hold(emulation):
    # a's scales change every 32 along K, b's every 64: the definition sums over the 32-wide segments
    g = torch.Generator().manual_seed(2)
    a_q = quantize(torch.randn(6, 128, generator=g) * torch.logspace(-2, 2, 128), E4M3, PerBlock(1, 32))
    b_q = quantize(torch.randn(5, 128, generator=g), E4M3, PerBlock(1, 64))
    out = emulated_mm(a_q, b_q, emulation=emulation).double()
    exact = _exact(a_q, b_q)
    u = 2.0**-24
    magnitude = a_q.dequantize().double().abs() @ b_q.dequantize().double().abs().T
    assert bool(((out - exact).abs() <= 140 * u * magnitude).all())


def test_small_integers_with_power_of_two_scales_are_bit_exact_in_both():
    # values in E4M3 with power-of-two scales: every product and every partial sum is exact in fp32
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-8, 9, (4, 64), generator=g).float()
    b = torch.randint(-8, 9, (5, 64), generator=g).float()
    a_q = quantize(a, E4M3, PerBlock(1, 32), "rceil")
    b_q = quantize(b, E4M3, PerBlock(1, 32), "rceil")
    want = (a @ b.T)
    for emulation in EMULATIONS:
        assert torch.equal(emulated_mm(a_q, b_q, emulation=emulation), want)


def _rows_spanning(shape, g, lo=-30.0, hi=30.0) -> torch.Tensor:
    """Rows (and columns) whose magnitudes span 10^lo..10^hi, a few zero rows and negative zeros among them."""
    x = torch.randn(shape, generator=g) * torch.logspace(lo, hi, shape[0])[:, None] * torch.logspace(-3, 3, shape[1])
    x[1] = 0.0
    x[2, ::3] = -0.0
    return x


@pytest.mark.parametrize("extremes", [(-3.0, 3.0), (-10.0, 10.0), (-30.0, 30.0), (-38.0, -30.0)],
                         ids=["mild", "wide", "beyond", "tiny"])
def test_power_of_two_scales_folded_into_the_values_give_the_bits_of_scaling_the_output(extremes):
    """rowwise's operands (per-row, per-column and per-tensor power-of-two scales) as the quantize kernel folds
    them: the GEMM of the folded values equals the GEMM of the values with the scales applied to its output,
    bit for bit, negative zeros included; where a folded value would not be normal (tiny: scales near 2^-126) or
    a sum could pass 2^126 (beyond), the output is scaled instead, and the bits are the same."""
    g = torch.Generator().manual_seed(5)
    pow2 = {"per-row": quantize_spec("e4m3", "per-row", scale_rule="rceil"),
            "per-tensor": quantize_spec("e4m3", "per-tensor", scale_rule="rceil"),
            "e5m2 per-row": quantize_spec("e5m2", "per-row", scale_rule="floor")}
    folded = 0
    for (name_a, spec_a), (name_b, spec_b) in itertools.product(pow2.items(), repeat=2):
        a = _rows_spanning((37, 70), g, *extremes)
        b = _rows_spanning((70, 29), g, *extremes)  # b[K, N]: quantized down its columns, a transposed view
        a_q = quantize_with(a, spec_a, values=True)
        b_q = quantize_transposed(b, spec_b, values=True) if name_b != "per-tensor" else \
            quantize_with(b.t().contiguous(), spec_b, values=True)
        plain = [dataclasses.replace(q, derived=Derived(values=q.values())) for q in (a_q, b_q)]  # nothing folded
        assert plain[0].derived.scaled is None
        got, want = emulated_mm(a_q, b_q), emulated_mm(*plain)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (name_a, name_b)
        folded += emulation_module._folded_powers_of_two(a_q, b_q) is not None
    # (the test reaches the branch it is about, and its refusals)
    assert folded == (9 if extremes[1] <= 10 and extremes[0] >= -10 else 0)


def test_a_value_folded_below_floats_normal_range_is_left_unfolded():
    """Tiny rows (scales 2^-126) times huge columns: every product is normal, but the tiny rows' folded values
    would not be, and a CPU that flushes subnormals (torch.set_flush_denormal) would read them as zeros: the
    output is scaled instead, and equals the unfolded GEMM there too."""
    spec = quantize_spec("e4m3", "per-row", scale_rule="rceil")
    g = torch.Generator().manual_seed(7)
    a_q = quantize_with(torch.randn(6, 40, generator=g) * 1e-37, spec, values=True)
    b_q = quantize_with(torch.randn(5, 40, generator=g) * 1e30, spec, values=True)
    assert a_q.scale_range()[0] * a_q.fmt.min_subnormal < 2.0**-126
    plain = [dataclasses.replace(q, derived=Derived(values=q.values())) for q in (a_q, b_q)]
    assert torch.set_flush_denormal(True)
    try:
        got, want = emulated_mm(a_q, b_q), emulated_mm(*plain)
    finally:
        torch.set_flush_denormal(False)
    assert bool((want != 0).all()) and torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_exact_scales_are_not_folded_where_they_span_whole_rows():
    g = torch.Generator().manual_seed(6)
    spec = quantize_spec("e4m3", "per-row")
    q = quantize_with(torch.randn(8, 64, generator=g), spec, values=True)
    assert q.derived.scaled is None and emulation_module._folded_powers_of_two(q, q) is None


def test_operands_must_share_k():
    a_q = quantize(torch.ones(2, 4), E4M3, PerTensor())
    b_q = quantize(torch.ones(3, 5), E4M3, PerTensor())
    with pytest.raises(ValueError, match="share K"):
        emulated_mm(a_q, b_q)
    with pytest.raises(ValueError, match="unknown emulation"):
        emulated_mm(a_q, a_q, emulation="approximate")
    with pytest.raises(ValueError, match=r"a\.shape\[1\] == b\.shape\[0\]"):
        quantize_operands(torch.ones(2, 4), torch.ones(5, 3))


def test_ieee_fp32_matmul_pins_and_restores_the_precision():
    setting = torch.backends.mkldnn.matmul  # where a CPU run would take bf16 for float32 matmuls
    before = setting.fp32_precision
    setting.fp32_precision = "bf16"
    try:
        with ieee_fp32_matmul():
            with ieee_fp32_matmul():  # nested: the outer one restores
                assert setting.fp32_precision == "ieee"
            assert setting.fp32_precision == "ieee"
        assert setting.fp32_precision == "bf16"
    finally:
        setting.fp32_precision = before


@pytest.mark.parametrize("recipe", ["tensorwise", "nvfp4"])
def test_a_one_value_output_scale_is_torchs_multiply_where_torch_runs_it_alone(monkeypatch, recipe):
    """Per tensor scales (and NVFP4's tensor factor) are one value on each side: the fast twin multiplies the output
    by torch's mul_ where torch runs it on the calling thread (kernels.torch_runs_alone: fewer elements than its
    grain, or one thread; a kernel call's checks cost more there) and by the kernels' scale_outer_ where torch would
    split it over its threads; the same bits as the torch code either way."""
    from fp8lab.numerics import kernels, kernels_gemm

    if not kernels.engine().kernels:
        pytest.skip(f"kernels not built here: {kernels.status()[1]}")
    calls = []
    scale_outer_ = kernels_gemm.scale_outer_
    monkeypatch.setattr(kernels_gemm, "scale_outer_",
                        lambda *args: calls.append(args[0].numel()) or scale_outer_(*args))
    g = torch.Generator().manual_seed(5)
    threads = torch.get_num_threads()
    try:
        for n_threads, m, split in ((2, 16, False), (2, 256, True), (1, 256, False)):
            torch.set_num_threads(n_threads)
            a, b = torch.randn(m, 64, generator=g), torch.randn(64, 256, generator=g)
            a_q, b_q = quantize_operands(a, b, recipe)
            calls.clear()
            got = emulated_mm(a_q, b_q)
            assert kernels.torch_runs_alone(got) != split, (n_threads, m)
            assert calls == ([m * 256] if split else []), (n_threads, m)  # (NVFP4: its blocks folded, the factor left)
            with kernels.disabled():
                want = emulated_mm(*quantize_operands(a, b, recipe))
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (n_threads, m)
    finally:
        torch.set_num_threads(threads)
