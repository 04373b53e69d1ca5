"""fp8lab.gemm.emulation: emulated_mm's definition and its fast twin against a float64 product of the
dequantized operands; bit-exact where every partial sum is exact; fp32 matmuls pinned to IEEE.

Every recipe and shape against the Higham bound: tests/gemm/test_gemm.py.
"""

import pytest
import torch

from fp8lab.gemm.emulation import EMULATIONS, emulated_mm, ieee_fp32_matmul, quantize_operands
from fp8lab.numerics.formats import E4M3
from fp8lab.numerics.quantize import quantize
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
