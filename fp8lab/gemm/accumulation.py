"""The accumulation model: a limited-precision tensor-core accumulator, and promotion to fp32.

Public: AccumulatorModel (DeepSeek-V3's ~14-bit accumulator and its fix, in either reading of their
sentence, ALIGNMENTS), accumulation_error, accumulation_errors (the relative error of a GEMM against its
exact product, for one K or many: over the whole output, MEASURES "frobenius", or the largest over its
elements, "max", the measure DeepSeek-V3 quotes), operand_rounding_error (what rounding the same inputs
to E4M3 costs, against their unquantized product), deepseek_check (both readings against DeepSeek-V3's
"nearly 2%", per inputs and measure).
The emulation (fp8lab.gemm.emulation) sums in fp32 unless given an AccumulatorModel. Notebook 05
introduces it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from fp8lab.gemm.emulation import emulated_mm, quantize_operands, scale_output, scaled_products
from fp8lab.numerics.quantize import QuantizedTensor

__all__ = ["ALIGNMENTS", "DEEPSEEK_ERROR", "DEEPSEEK_K", "MEASURES", "NEAR", "AccumulatorModel", "accumulation_error",
           "accumulation_errors", "accumulation_operands", "deepseek_check",
           "operand_rounding_error"]

# how a GEMM's error against its exact product is summed up: ||got - exact|| / ||exact|| over the whole
# output (Frobenius), or max_ij |got - exact| / |exact| (the largest relative error of one output element)
MEASURES = ("frobenius", "max")
# the two readings of DeepSeek-V3's sentence (section 3.5.2), AccumulatorModel.alignment:
#   "running": each group of products is aligned, together with the running sum, to the largest exponent
#              among them, and the bits below the top ones are dropped from all of them (the sum included)
#   "group":   each group is aligned to its own largest product, the group's sum is then added into a
#              register that keeps the top bits of the result
ALIGNMENTS = ("running", "group")


# ---- the model ---------------------------------------------------------------------


@dataclass(frozen=True)
class AccumulatorModel:
    """A limited-precision tensor-core accumulator, and the fix of promoting to fp32.

    DeepSeek-V3 (arXiv 2412.19437, section 3.5.2): "After aligning 32 mantissa products by
    right-shifting based on the maximum exponent, the Tensor Core only uses the highest 14 bits
    of each mantissa product for addition ... The accumulation of addition results into registers
    also employs 14-bit precision." Their fix (section 3.3.2): copy the partial sum to an fp32
    accumulator every N_C = 128 elements. The sentence has two readings, `alignment`:

    "running" (the default): per output element, walking K in groups of `group` products,
      e   = exponent of the largest of |group's products| and |accumulator|
      ulp = 2^(e - mantissa_bits)         (keep mantissa_bits + 1 bits: 14 by default)
      accumulator = trunc_ulp(accumulator) + sum(trunc_ulp(product))   (toward zero)
    "group": the running sum takes no part in the alignment,
      ulp_g = 2^(exponent of the largest of |group's products| - mantissa_bits)
      accumulator = trunc14(accumulator + sum(trunc_ulp_g(product)))
      where trunc14 keeps the top mantissa_bits + 1 bits of the result (toward zero).
    Either way, every `promote_every` elements (None: never) the accumulator is added to an fp32
    total (round to nearest) and reset. Products are exact; block scales are applied to the
    products first (exact for power-of-two scales).
    """

    mantissa_bits: int = 13
    group: int = 32
    promote_every: int | None = 128
    alignment: str = "running"

    def __post_init__(self) -> None:
        if self.alignment not in ALIGNMENTS:
            raise ValueError(f"unknown alignment {self.alignment!r}; valid: {', '.join(ALIGNMENTS)}")
        if not (isinstance(self.mantissa_bits, int) and 1 <= self.mantissa_bits <= 50):
            raise ValueError(f"mantissa_bits must be an integer in 1..50, got {self.mantissa_bits!r}")
        if not (isinstance(self.group, int) and self.group >= 1):
            raise ValueError(f"group must be a positive integer, got {self.group!r}")
        if self.promote_every is not None and not (
            isinstance(self.promote_every, int) and self.promote_every >= 1 and self.promote_every % self.group == 0
        ):
            raise ValueError(
                f"promote_every must be None or a positive multiple of group ({self.group}), got {self.promote_every!r}"
            )

    @property
    def label(self) -> str:
        promo = f"promote every {self.promote_every}" if self.promote_every else "no promotion"
        aligned = "aligned with the running sum" if self.alignment == "running" else "each group aligned alone"
        return f"{self.mantissa_bits + 1}-bit accumulator, groups of {self.group} {aligned}, {promo}"

    def accumulate(self, products: torch.Tensor) -> torch.Tensor:
        """Sum products[..., K] along the last dim through the model; returns float32 [...]."""
        p = products.double()
        k = p.shape[-1]
        total = torch.zeros(p.shape[:-1], dtype=torch.float32, device=p.device)
        acc = torch.zeros(p.shape[:-1], dtype=torch.float64, device=p.device)
        interval = self.promote_every or k
        starts = range(0, k, self.group)
        group_max = [p[..., s : s + self.group].abs().amax(-1) for s in starts]  # independent of acc
        for start, gmax in zip(starts, group_max, strict=True):
            grp = p[..., start : start + self.group]  # (..., group)
            if self.alignment == "running":  # the running sum takes part in the alignment
                ulp = self._ulp(torch.maximum(gmax, acc.abs()))
                acc = torch.trunc(acc / ulp) * ulp + (torch.trunc(grp / ulp[..., None]) * ulp[..., None]).sum(-1)
            else:  # the group alone, then a register that keeps the top bits of the sum
                ulp = self._ulp(gmax)
                acc = acc + (torch.trunc(grp / ulp[..., None]) * ulp[..., None]).sum(-1)
                ulp = self._ulp(acc.abs())
                acc = torch.trunc(acc / ulp) * ulp
            end = start + self.group
            if end % interval == 0 or end >= k:
                total = total + acc.to(torch.float32)  # promotion: one fp32 add
                acc = torch.zeros_like(acc)
        return total

    def _ulp(self, top: torch.Tensor) -> torch.Tensor:
        """2^(floor(log2(top)) - mantissa_bits): the last bit kept of a value as large as `top` (exact; top 0 ->
        2^(-1 - mantissa_bits), and what it truncates is 0 anyway)."""
        e = torch.frexp(top).exponent - 1  # floor(log2(top)), exact
        return torch.ldexp(torch.ones_like(top), e - self.mantissa_bits)


def accumulation_errors(
    ks: Sequence[int],
    accumulation: AccumulatorModel | None = None,
    distribution: str = "uniform",
    size: int = 8,
    measure: str = "frobenius",
) -> list[float]:
    """[accumulation_error(k, accumulation, distribution, size, measure=measure) for k in ks], the same floats,
    with the accumulator model walking all the K at once (one pass over the largest).

    Each K's products are padded with zeros in front: the model's accumulator stays exactly 0
    through them (a zero group truncates nothing) and adds 0 at each promotion, so the padded
    walk is the unpadded one, provided the padding is a whole number of groups and, where a
    promotion falls inside a K, of promotion intervals (true for the powers of two the panels
    use; other K are walked one by one). tests/test_gemm.py checks the equality bit for bit."""
    ks = list(ks)
    if accumulation is None or not ks:
        return [accumulation_error(k, accumulation, distribution, size, measure=measure) for k in ks]
    longest = max(ks)
    every = accumulation.promote_every

    def aligned(k: int) -> bool:  # the padded walk promotes where the unpadded one does
        pad = longest - k
        if pad % accumulation.group:
            return False
        if every is None or pad % every == 0:
            return True
        return every > k and (longest % every == 0 or every > longest)  # no promotion inside K either way

    together = [k for k in ks if aligned(k)]
    errors = {k: accumulation_error(k, accumulation, distribution, size, measure=measure)
              for k in ks if not aligned(k)}
    if together:
        operands = [accumulation_operands(k, distribution, size) for k in together]
        products = torch.stack([torch.nn.functional.pad(scaled_products(a_q, b_q), (longest - k, 0))
                                for k, (a_q, b_q, _) in zip(together, operands, strict=True)])
        outs = accumulation.accumulate(products)  # (len(together), M, N)
        for k, out, (a_q, b_q, exact) in zip(together, outs, operands, strict=True):
            errors[k] = _relative_error(scale_output(out, a_q, b_q), exact, measure)
    return [errors[k] for k in ks]


@lru_cache(maxsize=64)
def accumulation_operands(k: int, distribution: str, size: int):
    """a_q[size, K], b_q[size, K] (tensorwise, drawn from a generator seeded by K) and their exact product a_q @ b_q.T
    (float64): the operands notebook 05's accumulation panel sums."""
    # seeded by k: the same operands every time (cached, as a panel asks for them again and again)
    a_q, b_q, _ = _accumulation_inputs(k, distribution, size)
    return a_q, b_q, a_q.dequantize().double() @ b_q.dequantize().double().t()


@lru_cache(maxsize=64)
def _accumulation_inputs(k: int, distribution: str, size: int):
    """The unquantized a[size, K] and b[K, size] drawn from a generator seeded by K, quantized tensorwise, and
    their exact unquantized product (float64)."""
    g = torch.Generator().manual_seed(k)
    draw = torch.rand if distribution == "uniform" else torch.randn
    a, b = draw(size, k, generator=g), draw(k, size, generator=g)
    a_q, b_q = quantize_operands(a, b, "tensorwise")
    return a_q, b_q, a.double() @ b.double()


def operand_rounding_error(k: int, distribution: str = "uniform", size: int = 8, measure: str = "frobenius") -> float:
    """What rounding the inputs to E4M3 (tensorwise) costs on accumulation_error's inputs: the exact product of the
    quantized operands against the exact product of the unquantized ones, in `measure` (MEASURES). The
    accumulation errors are measured against the first, so the two add up to what a GEMM of these inputs loses."""
    if measure not in MEASURES:
        raise ValueError(f"unknown measure {measure!r}; valid: {', '.join(MEASURES)}")
    _, _, exact = accumulation_operands(k, distribution, size)
    _, _, unquantized = _accumulation_inputs(k, distribution, size)
    return _relative_error(exact, unquantized, measure)


def accumulation_error(
    k: int,
    accumulation: AccumulatorModel | None = None,
    distribution: str = "uniform",
    size: int = 8,
    gemm: Callable[[QuantizedTensor, QuantizedTensor], torch.Tensor] | None = None,
    measure: str = "frobenius",
) -> float:
    """Relative error of a GEMM of FP8 operands against their exact product (measure: MEASURES).

    a[size, K] @ b[K, size], drawn uniform in [0, 1) (same sign: the sum grows like K, the
    worst case for a short accumulator) or normal (mixed signs), quantized tensorwise. The
    GEMM is the emulation with `accumulation` unless `gemm(a_q, b_q)` is given (the GPU's).
    measure "frobenius": ||got - exact|| / ||exact|| over the size x size output; "max": the largest
    |got - exact| / |exact| of one element (with mixed signs an output near zero decides it).
    """
    if distribution not in ("uniform", "normal"):
        raise ValueError(f"unknown distribution {distribution!r}; valid: uniform, normal")
    if measure not in MEASURES:
        raise ValueError(f"unknown measure {measure!r}; valid: {', '.join(MEASURES)}")
    a_q, b_q, exact = accumulation_operands(k, distribution, size)
    if gemm is None:
        got = emulated_mm(a_q, b_q, emulation="reference", accumulation=accumulation)
    else:
        got = gemm(a_q, b_q)
    return _relative_error(got, exact, measure)


def _relative_error(got: torch.Tensor, exact: torch.Tensor, measure: str = "frobenius") -> float:
    """||got - exact|| / ||exact|| (Frobenius), or max |got - exact| / |exact| over the elements ("max"),
    in float64 on the CPU."""
    got = got.double().cpu()
    if measure == "max":
        return ((got - exact).abs() / exact.abs()).max().item()
    return (torch.linalg.norm(got - exact) / torch.linalg.norm(exact)).item()


# DeepSeek-V3 (section 3.3.2): "a maximum relative error of nearly 2%" at K = 4096 with the limited accumulator
DEEPSEEK_ERROR, DEEPSEEK_K = 0.02, 4096
NEAR = 1.5  # "nearly 2%": within this factor of it (1.33% to 3%)


def deepseek_check(bits: int = 14, k: int = DEEPSEEK_K, size: int = 8):
    """Both readings of the accumulator (ALIGNMENTS), `bits` bits, no promotion (the fast mode DeepSeek-V3
    measured), at K = `k`, on both inputs of accumulation_error and in both MEASURES, beside what rounding the same
    inputs to E4M3 costs: a DataFrame with columns alignment, inputs, measure, error, operand_rounding,
    vs_deepseek (error / 2%) and meets (within NEAR of 2%)."""
    import pandas as pd

    rows = []
    for alignment in ALIGNMENTS:
        model = AccumulatorModel(bits - 1, 32, None, alignment)
        for distribution in ("uniform", "normal"):
            for measure in MEASURES:
                err = accumulation_error(k, model, distribution, size, measure=measure)
                ratio = err / DEEPSEEK_ERROR
                rows.append({"alignment": alignment, "inputs": distribution, "measure": measure, "error": err,
                             "operand_rounding": operand_rounding_error(k, distribution, size, measure),
                             "vs_deepseek": ratio, "meets": 1 / NEAR <= ratio <= NEAR})
    return pd.DataFrame(rows)
