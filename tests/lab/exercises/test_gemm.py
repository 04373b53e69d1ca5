"""fp8lab.lab.exercises.gemm: exercise 05, the scaled FP8 GEMM: scales applied per K block, not after the sum."""

from __future__ import annotations

import torch

from fp8lab.lab.exercises.gemm import GemmOperand, check_scaled_gemm
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.scaling import PerBlock, PerRow


def _right(a: GemmOperand, b: GemmOperand) -> torch.Tensor:
    out = 0
    for j in range(a.scale.shape[1]):  # each K block's partial sum, scaled before it is added
        k = slice(j * a.block, (j + 1) * a.block)
        out = out + (a.data[:, k].double() @ b.data[:, k].double().t()) * a.scale[:, j:j + 1].double() \
            * b.scale[:, j].double()[None, :]
    return out


def test_scales_per_k_block_pass_and_scaling_after_the_sum_fails():
    assert check_scaled_gemm(_right)

    def after_the_sum(a, b):  # right per tensor, wrong once the scales change along K
        return (a.data.double() @ b.data.double().t()) * a.scale[:, :1].double() * b.scale[:, 0].double()[None, :]

    fb = check_scaled_gemm(after_the_sum)
    assert not fb and "1x16" in fb.message


def test_an_operand_is_its_codes_scales_and_block():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    op = GemmOperand.of(quantize(x, "e4m3", PerBlock(1, 16)))
    assert op.block == 16 and op.scale.shape == (4, 4) and op.data.dtype == torch.float8_e4m3fn
    row = GemmOperand.of(quantize(x, "e4m3", PerRow()))
    assert row.block == 64 and row.scale.shape == (4, 1)
