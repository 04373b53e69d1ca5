"""Exercise 05 (notebook 05): the scaled FP8 GEMM, per tensor and with block scales along K.

Public: GemmOperand, check_scaled_gemm, hint_scaled_gemm, solution_scaled_gemm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fp8lab.data.synthetic import FLOAT32_CPU
from fp8lab.lab.exercises.base import Feedback, as_tensor, call_learner, not_a_function
from fp8lab.numerics.formats import E4M3
from fp8lab.numerics.quantize import QuantizedTensor, quantize
from fp8lab.numerics.scaling import PerBlock, PerTensor

__all__ = [
    "GemmOperand",
    "check_scaled_gemm",
    "hint_scaled_gemm",
    "solution_scaled_gemm",
]



@dataclass(frozen=True)
class GemmOperand:
    """One FP8 GEMM operand as a tensor core sees it: data[rows, K] (FP8 codes), scale[rows or 1,
    K // block] (float32 dequantization multipliers: x ~= data * scale, one per row per block of
    `block` elements along K; per tensor: scale (1, 1), block = K). No dequantize(): the
    exercise is to place the scales."""

    data: torch.Tensor
    scale: torch.Tensor
    block: int

    @classmethod
    def of(cls, q: QuantizedTensor) -> GemmOperand:
        rows, cols = q.block_shape
        k = q.shape[1]
        if rows not in (1, q.shape[0]) or (rows != 1 and cols != k):
            raise ValueError(f"an operand scaled per tensor or per 1 x block tile along K, not {q.granularity.label}")
        return cls(q.data, q.scale.reshape(-1, max(k // cols, 1)).float(), min(cols, k))


def _gemm_cases():
    g = torch.Generator().manual_seed(5)
    a3 = torch.randn(4, 64, generator=g, **FLOAT32_CPU)
    a3[:, :16] *= 1000  # the first K block holds large values: its scales differ from the others' by ~2^10
    return [("a[8, 32] @ b[32, 4], per tensor, amax 3 and 200", torch.randn(8, 32, generator=g, **FLOAT32_CPU) * 3,
             torch.randn(4, 32, generator=g, **FLOAT32_CPU) * 200, PerTensor()),
            ("a[2, 64] @ b[64, 5], per tensor, tiny values", torch.randn(2, 64, generator=g, **FLOAT32_CPU) * 1e-3,
             torch.randn(5, 64, generator=g, **FLOAT32_CPU), PerTensor()),
            ("a[4, 64] @ b[64, 3], 1x16 blocks along K (one K block 1000x larger)", a3,
             torch.randn(3, 64, generator=g, **FLOAT32_CPU), PerBlock(1, 16))]


def _reference_gemm(a: GemmOperand, b: GemmOperand) -> torch.Tensor:
    out = torch.zeros(a.data.shape[0], b.data.shape[0], dtype=torch.float64)
    for j in range(a.scale.shape[1]):
        k = slice(j * a.block, (j + 1) * a.block)
        out += (a.data[:, k].double() @ b.data[:, k].double().t()) * a.scale[:, j, None].double() * \
            b.scale[:, j][None, :].double()
    return out


def check_scaled_gemm(fn: Callable[[GemmOperand, GemmOperand], torch.Tensor]) -> Feedback:
    """fn(a_q, b_q) -> out[M, N] for GemmOperands a_q[M, K], b_q[N, K]: what torch's scaled_mm
    computes, per tensor and with 1x16 block scales along K (where only scales applied per K
    block give the right answer)."""
    if (wrong := not_a_function(fn, "check_scaled_gemm(fn)")) is not None:
        return wrong
    for name, a, b, gran in _gemm_cases():
        a_q, b_q = GemmOperand.of(quantize(a, E4M3, gran)), GemmOperand.of(quantize(b, E4M3, gran))
        blocked = a_q.scale.shape[1] > 1
        got, err = call_learner(fn, a_q, b_q)
        if err:
            extra = ""
            if "dequantize" in err:
                extra = " These operands have no dequantize(): build the product from .data and .scale."
            elif blocked:
                extra = (" Here scale is (rows, K // block): one scale per row per K block, so it cannot multiply "
                         "the [M, N] result directly.")
            return Feedback(False, f"{name}: {err}.{extra}")
        want = _reference_gemm(a_q, b_q)
        if got is None:
            return Feedback(False, "fn returned None: write the code that returns the product.")
        got, err = as_tensor(got, f"the product out[M, N], a tensor shaped {tuple(want.shape)}")
        if err:
            return Feedback(False, f"{name}: {err}.")
        if got.shape != want.shape:
            return Feedback(False, f"{name}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}. "
                                   "b_q is in [N, K] layout: contract with its transpose.")
        if torch.allclose(got, want, rtol=1e-4, atol=1e-6 * want.abs().max().item()):
            continue
        data = a_q.data.double() @ b_q.data.double().t()
        sa, sb = a_q.scale.double(), b_q.scale.double()
        msg = f"{name}: the values are off."
        if torch.allclose(got, data, rtol=1e-4):
            msg += " The FP8 codes' product must still be scaled back: multiply by both scales."
        elif not blocked and torch.allclose(got, data / (sa * sb), rtol=1e-4):
            msg += " scale is the DEQUANTIZATION multiplier: multiply by it, don't divide."
        elif not blocked and (torch.allclose(got, data * sa, rtol=1e-4) or torch.allclose(got, data * sb, rtol=1e-4)):
            msg += " You applied one operand's scale; each operand has its own."
        elif blocked:
            msg += (" With block scales along K, one scale cannot multiply the whole sum: multiply each K block's "
                    "partial sum (a.data[:, k] @ b.data[:, k].T) by that block's scales, then add the blocks.")
        return Feedback(False, msg)
    return Feedback(True, "each K block's products of FP8 codes, summed, times that block's two scales, added up: "
                          "per tensor that is one multiply at the end.")


def hint_scaled_gemm() -> str:
    return ("a ~ a_q.data * a_q.scale, one scale per row per K block of a_q.block elements. Expand (a @ b^T) block "
            "by block along K: which scales multiply which partial sum? (Per tensor there is one block.)")


def solution_scaled_gemm() -> str:
    return '''def fn(a_q, b_q):
    out = 0
    for j in range(a_q.scale.shape[1]):                               # one K block at a time
        k = slice(j * a_q.block, (j + 1) * a_q.block)
        acc = a_q.data[:, k].float() @ b_q.data[:, k].float().t()     # exact products, fp32 sums (the tensor core)
        out = out + acc * a_q.scale[:, j, None] * b_q.scale[:, j][None, :]   # (M, 1) and (1, N) scales
    return out'''
