"""FP8 GEMMs: real (torch scaled_mm on a GPU that has the kernel) or emulated (anywhere).

Public: matmul, quantize_operands, emulated_mm, AccumulatorModel; the real path: real_mm,
plan_gemm (which kernel, decided from the two operands and the GPU generation), KernelPlan,
KernelUnavailable, prepare_real_mm; GemmBackend (the one switch between real and emulated,
with its counts), default_backend, resolve_backend, BackendChoice, BACKENDS.
Shapes: a[M, K] @ b[K, N] -> out[M, N]. Operands are quantized in their [rows, K] layout:
a as a[M, K] (role "input"), b as b^T[N, K] (role "weight"), like w[N, K] in nn.Linear.
The emulation computes what the hardware computes: the same FP8 codes and scales, exact
products, fp32 sums, scales applied per K block; AccumulatorModel adds the Hopper tensor
core's ~14-bit accumulator and DeepSeek-V3's promotion to fp32 every 128 elements.
Notebook 05 introduces this file; `python -m fp8lab doctor` prints the backend table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from fp8lab import kernels
from fp8lab.formats import E2M1, E4M3, E5M2, E8M0
from fp8lab.quantize import QuantizedTensor
from fp8lab.recipes import Recipe, get_recipe
from fp8lab.scaling import PerBlock, PerRow, PerTensor

__all__ = [
    "BACKENDS",
    "KERNEL_KINDS",
    "AccumulatorModel",
    "BackendChoice",
    "GemmBackend",
    "KernelPlan",
    "KernelUnavailable",
    "PreparedGemm",
    "accumulation_error",
    "accumulation_errors",
    "agrees_with_emulation",
    "default_backend",
    "emulated_mm",
    "matmul",
    "operand_scaling",
    "plan_gemm",
    "prepare_real_mm",
    "quantize_operands",
    "real_mm",
    "resolve_backend",
    "swizzle_scales",
]

BACKENDS: tuple[str, ...] = ("auto", "emulated", "scaled_mm")
EMULATIONS: tuple[str, ...] = ("fast", "reference")


# ---- the accumulation model ---------------------------------------------------------------------


@dataclass(frozen=True)
class AccumulatorModel:
    """A limited-precision tensor-core accumulator, and the fix of promoting to fp32.

    DeepSeek-V3 (arXiv 2412.19437, sections 3.3 and 3.5.2) reports that Hopper's FP8 MMA
    adds products in groups of 32, aligned to the largest exponent, keeping only the top
    ~14 bits (bits below are truncated), so that K = 4096 loses up to ~2% relative error.
    Their fix: copy the partial sum to an fp32 accumulator every N_C = 128 elements.

    Model, per output element, walking K in groups of `group` products:
      e   = exponent of the largest of |group's products| and |accumulator|
      ulp = 2^(e - mantissa_bits)         (keep mantissa_bits + 1 bits: 14 by default)
      accumulator = trunc_ulp(accumulator) + sum(trunc_ulp(product))   (toward zero)
    and every `promote_every` elements (None: never) the accumulator is added to an fp32
    total (round to nearest) and reset. Products are exact; block scales are applied to
    the products first (exact for power-of-two scales).
    """

    mantissa_bits: int = 13
    group: int = 32
    promote_every: int | None = 128

    def __post_init__(self) -> None:
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
        return f"{self.mantissa_bits + 1}-bit accumulator, groups of {self.group}, {promo}"

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
            top = torch.maximum(gmax, acc.abs())
            e = torch.frexp(top).exponent - 1  # floor(log2(top)), exact; 0 -> -1 (then all is 0)
            ulp = torch.ldexp(torch.ones_like(top), e - self.mantissa_bits)
            acc = torch.trunc(acc / ulp) * ulp + (torch.trunc(grp / ulp[..., None]) * ulp[..., None]).sum(-1)
            end = start + self.group
            if end % interval == 0 or end >= k:
                total = total + acc.to(torch.float32)  # promotion: one fp32 add
                acc = torch.zeros_like(acc)
        return total


# ---- operands -----------------------------------------------------------------------------------


def quantize_operands(
    a: torch.Tensor, b: torch.Tensor, recipe: Recipe | str = "tensorwise"
) -> tuple[QuantizedTensor, QuantizedTensor]:
    """Quantize a[M, K] as the recipe's input and b[K, N] as its weight, in b^T[N, K] layout.

    b is quantized down its columns in place (TensorScaling.quantize_transposed): b_q is the
    QuantizedTensor of b^T as a transposed view, so no copy of b^T is made and the GEMM reads
    b in its own row-major layout. A b given as a transposed [N, K] tensor's view is contiguous
    as b^T: it is quantized as it lies. On the CPU the kernel writes each operand's float32
    values (scale-folded where the GEMM folds them) in the same pass, whatever their size: the
    emulated GEMM reads them next."""
    recipe = get_recipe(recipe)
    _check_matmul_shapes(a, b)
    if b.t().is_contiguous() and not b.is_contiguous():  # b = w.t() of a contiguous w[N, K]
        return recipe.input.quantize(a, values=True), recipe.weight.quantize(b.t(), values=True)
    return recipe.input.quantize(a, values=True), recipe.weight.quantize_transposed(b, values=True)


def _check_matmul_shapes(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(
            f"matmul takes 2-D a[M, K] and b[K, N], got {tuple(a.shape)} and {tuple(b.shape)}; "
            "reshape batches to (-1, K)"
        )
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a[M, K] @ b[K, N] needs a.shape[1] == b.shape[0], got {tuple(a.shape)} @ {tuple(b.shape)}")


def _k_blocks(q: QuantizedTensor) -> tuple[torch.Tensor, int]:
    """An operand's scales as (rows, K blocks) float32 and the block width along K.

    q[R, K] per tensor -> (R, 1) with width K; per row -> (R, 1); per block (r, c) ->
    (R, ceil(K/c)) with each block's scale repeated over its r rows.
    """
    rows, k = q.shape
    g = q.granularity
    if isinstance(g, PerTensor):
        return q.scale.reshape(1, 1).expand(rows, 1), k
    if isinstance(g, PerRow):
        return q.scale.reshape(rows, 1), k
    assert isinstance(g, PerBlock)
    s = q.scale.repeat_interleave(g.rows, 0)[:rows]  # (R, KB)
    return s, min(g.cols, k)


def _tensor_factor(a_q: QuantizedTensor, b_q: QuantizedTensor) -> torch.Tensor | None:
    ta, tb = a_q.tensor_scale, b_q.tensor_scale
    if ta is None and tb is None:
        return None
    one = torch.ones((), device=a_q.data.device)
    return (ta if ta is not None else one) * (tb if tb is not None else one)


# ---- emulation ------------------------------------------------------------------------------------------


def _segments(k: int, width_a: int, width_b: int) -> int:
    """The K segments over which both operands' scales are constant: gcd of the block widths."""
    return math.gcd(width_a, width_b) if width_a < k or width_b < k else k


def emulated_mm(
    a_q: QuantizedTensor,
    b_q: QuantizedTensor,
    *,
    emulation: str = "fast",
    accumulation: AccumulatorModel | None = None,
) -> torch.Tensor:
    """Emulated FP8 GEMM of a_q[M, K] and b_q[N, K] (b in its [N, K] layout): out[M, N] float32.

    The definition, the hardware's order for per-block scaling (the code after the switch):
        out[m, n] = sum_s (sum_{k in s} a[m, k] * b[n, k]) * sa[m, s] * sb[n, s]   (* tensor scales)
    over the K segments s on which both operands' scales are constant: exact products (FP8
    values times FP8 values fit float32), summed in fp32 within a segment, each partial sum
    scaled and added in fp32. With `accumulation`, the scaled products go through the
    AccumulatorModel (a limited-precision tensor-core accumulator) instead.
    emulation "fast" (the default) runs the fast twin, _emulated_fast, where it applies: block
    scales folded into the values and one fp32 GEMM over all of K. "reference" runs the
    definition. Both equal dequantize(a_q) @ dequantize(b_q).T up to fp32 rounding: the Higham
    bound |out - exact| <= gamma * (|a| @ |b|.T), gamma = (K + 2) u / (1 - (K + 2) u),
    u = 2^-24, plus u * |exact| for folding float32 scales (tests/test_gemm.py, one test for both).
    """
    if emulation not in EMULATIONS:
        raise ValueError(f"unknown emulation {emulation!r}; valid: {', '.join(EMULATIONS)}")
    if a_q.shape[1] != b_q.shape[1]:
        raise ValueError(
            f"operands must share K: a_q is {tuple(a_q.shape)} (M, K), b_q is {tuple(b_q.shape)} (N, K); "
            "quantize b as b.t() (its [N, K] layout), e.g. with fp8lab.gemm.quantize_operands"
        )
    if emulation == "fast" and accumulation is None:  # the one switch: the fast twin where it applies
        on_cpu = a_q.data.device.type == "cpu"
        out = _emulated_fast(a_q, b_q, kernels.scale_outer_ if on_cpu and kernels.engine().kernels else _scale_outer_)
        if out is not None:
            return out

    if accumulation is not None:
        return _scale_output(accumulation.accumulate(_scaled_products(a_q, b_q)), a_q, b_q)  # (M, N, K) -> (M, N)
    a = a_q.values()  # (M, K) exact FP8 values, float32
    b = b_q.values()  # (N, K)
    m, k = a.shape
    n = b.shape[0]
    sa, wa = _k_blocks(a_q)  # (M, KBa), block width along K
    sb, wb = _k_blocks(b_q)  # (N, KBb)
    seg = _segments(k, wa, wb)
    out = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    for start in range(0, k, seg):
        part = a[:, start : start + seg] @ b[:, start : start + seg].t()  # (M, N), fp32 sums
        factor = sa[:, start // wa, None] * sb[None, :, start // wb]  # (M, N)
        out += part * factor
    return _scale_output(out, a_q, b_q)


def _scale_output(out: torch.Tensor, a_q: QuantizedTensor, b_q: QuantizedTensor) -> torch.Tensor:
    """out times the operands' tensor scales (NVFP4's two-level scaling), where they have them."""
    factor = _tensor_factor(a_q, b_q)
    return out if factor is None else out * factor


def _scaled_products(a_q: QuantizedTensor, b_q: QuantizedTensor) -> torch.Tensor:
    """Every product a[m, k] * sa[m, k] * b[n, k] * sb[n, k], exact in float64: (M, N, K), what
    the accumulator model sums (tensor scales excepted: they scale the output)."""
    k = a_q.shape[1]
    sa, wa = _k_blocks(a_q)
    sb, wb = _k_blocks(b_q)
    a_s = a_q.values().double() * sa.double().repeat_interleave(wa, 1)[:, :k]
    b_s = b_q.values().double() * sb.double().repeat_interleave(wb, 1)[:, :k]
    return a_s[:, None, :] * b_s[None, :, :]


def _scale_outer_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """out[M, N] *= a[M, None] * b[None, N] (the factor rounded to float32 first, as the reference
    forms it); fp8lab.kernels.scale_outer_ is its twin (the same bits without the [M, N] factor)."""
    return out.mul_(a[:, None] * b[None, :])


def _emulated_fast(a_q: QuantizedTensor, b_q: QuantizedTensor, scale_outer_=_scale_outer_) -> torch.Tensor | None:
    """emulated_mm's fast twin: one fp32 GEMM over all of K.

    Scales that vary along K (blocks narrower than K) are folded into the operand's values
    (QuantizedTensor.scaled_values: exact for power-of-two scales and for E4M3 scales of E4M3
    or E2M1 elements, else one float32 rounding per element); scales constant along K (per
    tensor, per row) are applied to the output, sa[m] * sb[n], as the reference and the
    hardware's epilogue form them (scale_outer_: torch's or the kernel's, the same bits).
    Equal to the reference up to the order of fp32 additions (and that rounding). None where
    folded products could leave float32's normal range: the reference runs instead.
    """
    operands = []
    for q in (a_q, b_q):  # each as (values[R, K], scale per row or tensor or None, smallest, largest magnitude)
        if isinstance(q.granularity, PerBlock) and q.block_shape[1] < q.shape[1]:
            smallest, largest = q.scale_range()
            operands.append((q.scaled_values(), None, q.fmt.min_subnormal * smallest, q.fmt.max_value * largest))
        else:
            post = q.scale.reshape(()) if isinstance(q.granularity, PerTensor) else _k_blocks(q)[0][:, 0]
            operands.append((q.values(), post, q.fmt.min_subnormal, q.fmt.max_value))
    (a, post_a, lo_a, hi_a), (b, post_b, lo_b, hi_b) = operands
    if not (lo_a * lo_b >= 2.0**-126 and hi_a * hi_b * a.shape[1] < 2.0**126):
        return None  # folded products would leave float32's normal range
    out = a @ b.t()  # (M, N)
    # one scale factor per output, sa[m] * sb[n]; per-tensor scales are 0-d, so an [M, N] factor
    # exists only when both operands scale per row
    if post_a is not None and post_b is not None and post_a.dim() and post_b.dim():
        scale_outer_(out, post_a, post_b)
    elif post_a is not None and post_b is not None:
        out.mul_((post_a[:, None] if post_a.dim() else post_a) * (post_b[None, :] if post_b.dim() else post_b))
    elif post_a is not None:
        out.mul_(post_a[:, None] if post_a.dim() else post_a)
    elif post_b is not None:
        out.mul_(post_b[None, :] if post_b.dim() else post_b)
    factor = _tensor_factor(a_q, b_q)
    return out if factor is None else out.mul_(factor)


def bf16_fast_path() -> tuple[bool, str]:
    """Whether the fast emulation runs its GEMM with bfloat16 inputs (oneDNN's bf16 math mode), and why.

    Never, decided here for every process: on the CPU torch offers bf16 inputs with fp32
    accumulation only through oneDNN's process-wide fp32 precision setting, and flipping it
    around a GEMM would make another thread's fp32 matmuls (the training panel runs in one)
    silently compute in bf16. The fast emulation runs fp32 GEMMs: exact products, fp32 sums.
    """
    return False, ("oneDNN's bf16 math mode is a process-wide setting, which fp8lab never flips "
                   "(another thread's fp32 matmuls would run in bf16)")


def accumulation_errors(
    ks: Sequence[int],
    accumulation: AccumulatorModel | None = None,
    distribution: str = "uniform",
    size: int = 8,
) -> list[float]:
    """[accumulation_error(k, accumulation, distribution, size) for k in ks], the same floats,
    with the accumulator model walking all the K at once (one pass over the largest).

    Each K's products are padded with zeros in front: the model's accumulator stays exactly 0
    through them (a zero group truncates nothing) and adds 0 at each promotion, so the padded
    walk is the unpadded one, provided the padding is a whole number of groups and, where a
    promotion falls inside a K, of promotion intervals (true for the powers of two the panels
    use; other K are walked one by one). tests/test_gemm.py checks the equality bit for bit."""
    ks = list(ks)
    if accumulation is None or not ks:
        return [accumulation_error(k, accumulation, distribution, size) for k in ks]
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
    errors = {k: accumulation_error(k, accumulation, distribution, size) for k in ks if not aligned(k)}
    if together:
        operands = [_accumulation_operands(k, distribution, size) for k in together]
        products = torch.stack([torch.nn.functional.pad(_scaled_products(a_q, b_q), (longest - k, 0))
                                for k, (a_q, b_q, _) in zip(together, operands, strict=True)])
        outs = accumulation.accumulate(products)  # (len(together), M, N)
        for k, out, (a_q, b_q, exact) in zip(together, outs, operands, strict=True):
            errors[k] = _relative_error(_scale_output(out, a_q, b_q), exact)
    return [errors[k] for k in ks]


@lru_cache(maxsize=64)
def _accumulation_operands(k: int, distribution: str, size: int):
    # seeded by k: the same operands every time (cached, as a panel asks for them again and again)
    g = torch.Generator().manual_seed(k)
    draw = torch.rand if distribution == "uniform" else torch.randn
    a_q, b_q = quantize_operands(draw(size, k, generator=g), draw(k, size, generator=g), "tensorwise")
    return a_q, b_q, a_q.dequantize().double() @ b_q.dequantize().double().t()


def accumulation_error(
    k: int,
    accumulation: AccumulatorModel | None = None,
    distribution: str = "uniform",
    size: int = 8,
    gemm: Callable[[QuantizedTensor, QuantizedTensor], torch.Tensor] | None = None,
) -> float:
    """Relative error (Frobenius) of a GEMM of FP8 operands against their exact product.

    a[size, K] @ b[K, size], drawn uniform in [0, 1) (same sign: the sum grows like K, the
    worst case for a short accumulator) or normal (mixed signs), quantized tensorwise. The
    GEMM is the emulation with `accumulation` unless `gemm(a_q, b_q)` is given (the GPU's).
    """
    if distribution not in ("uniform", "normal"):
        raise ValueError(f"unknown distribution {distribution!r}; valid: uniform, normal")
    a_q, b_q, exact = _accumulation_operands(k, distribution, size)
    if gemm is None:
        got = emulated_mm(a_q, b_q, emulation="reference", accumulation=accumulation)
    else:
        got = gemm(a_q, b_q)
    return _relative_error(got, exact)


def _relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    """||got - exact|| / ||exact|| (Frobenius), in float64 on the CPU."""
    got = got.double().cpu()
    return (torch.linalg.norm(got - exact) / torch.linalg.norm(exact)).item()


# ---- the real backend: torch's scaled matmuls, as each GPU generation accepts them ----------------------
#
# What torch's CUDA kernels accept (aten/src/ATen/native/cuda/ScaledBlas.cpp, RowwiseScaledMM.cu):
#   - mat_a [M, K] row-major and mat_b [K, N] column-major (cuBLASLt FP8 multiplies "TN" only;
#     CUTLASS rowwise checks a.stride(1) == 1 and b.stride(0) == 1): a transposed view is not
#     contiguous, so operands are copied into that layout; M, N, K divisible by 16;
#   - TensorWise: one float32 scale each; never two E5M2 operands;
#   - RowWise: scale_a (M, 1), scale_b (1, N), float32, contiguous; cuBLAS on sm_90 with
#     cuBLAS >= 12.9, else CUTLASS (sm_89, sm_100+), which wants an E4M3 b and a bf16 output;
#   - BlockWise1x128 / 128x128 (DeepSeek-V3): sm_90 only, cuBLAS >= 12.9, E4M3 both; a 1x128
#     operand's scales (rows, ceil(K/128)) outer-dim-major (strides (1, rows)); a 128x128
#     operand's scales (round_up(ceil(K/128), 4), ceil(rows/128)) with strides (1, round_up(...));
#   - BlockWise1x32 (MX: E4M3 elements, E8M0 scales) and BlockWise1x16 (NVFP4: packed E2M1,
#     E4M3 scales, plus a float32 tensor scale): sm_100+, scales in the 32x4x4 swizzled
#     (128-row x 4-column tile) layout, one scale per row per K block, contiguous.

Arch = tuple[int, int]


class KernelUnavailable(RuntimeError):
    """No torch scaled_mm kernel takes this pair of operands on this GPU; str() is the reason."""


# how one operand [rows, K] is scaled, in scaled_mm's vocabulary
TENSORWISE, ROWWISE = "TensorWise", "RowWise"
B1X128, B128X128, B1X32, B1X16 = "BlockWise1x128", "BlockWise128x128", "BlockWise1x32", "BlockWise1x16"
BLOCKWISE_KINDS = (f"{B1X128} x {B128X128}", f"{B128X128} x {B1X128}", f"{B1X128} x {B1X128}")
KERNEL_KINDS = (TENSORWISE, ROWWISE, *BLOCKWISE_KINDS, B1X32, B1X16)
_OUT_DTYPE = {TENSORWISE: torch.float32, ROWWISE: torch.bfloat16, B1X32: torch.bfloat16, B1X16: torch.bfloat16,
              **dict.fromkeys(BLOCKWISE_KINDS, torch.float32)}
_K_MULTIPLE = {TENSORWISE: 16, ROWWISE: 16, B1X32: 32, B1X16: 32, **dict.fromkeys(BLOCKWISE_KINDS, 128)}


def _describe(q: QuantizedTensor) -> str:
    scales = q.scale_fmt.name if q.scale_fmt is not None else "float32"
    extra = ", +tensor scale" if q.tensor_scale is not None else ""
    return f"{q.fmt.name} {q.granularity.label} ({scales} scales{extra})"


def operand_scaling(q: QuantizedTensor) -> str | None:
    """How scaled_mm would name the scaling of an operand q[rows, K], or None if it has no name.

    PerTensor -> TensorWise; PerRow -> RowWise; float32 blocks 128 wide along K -> BlockWise1x128
    (BlockWise128x128 for 128x128 blocks); E8M0-scaled blocks 32 wide -> BlockWise1x32 and
    E4M3-scaled E2M1 blocks 16 wide -> BlockWise1x16. Blocks taller than one row (NVFP4's 16x16
    weight blocks, say) reach the kernel as one scale per row per K block: the same numbers.
    """
    g = q.granularity
    if isinstance(g, PerTensor | PerRow):
        if q.scale_fmt is None and q.tensor_scale is None:
            return TENSORWISE if isinstance(g, PerTensor) else ROWWISE
        return None
    if q.scale_fmt is None and q.tensor_scale is None and q.fmt in (E4M3, E5M2) and g.cols == 128:
        return B128X128 if g.rows == 128 else B1X128
    if q.scale_fmt is E8M0 and q.tensor_scale is None and g.cols == 32 and q.fmt in (E4M3, E5M2):
        return B1X32
    if q.scale_fmt is E4M3 and q.fmt is E2M1 and g.cols == 16:
        return B1X16
    return None


def _pair_kind(a_q: QuantizedTensor, b_q: QuantizedTensor) -> str:
    """The kernel family for a pair, or KernelUnavailable naming both scalings.

    Where a coarser operand meets a finer one, its scales are restated at the finer grain, all
    equal within each old block (exact): per tensor beside per row -> RowWise; per tensor or per
    row beside 1x128/128x128 blocks -> 1x128; two 128x128 operands -> a as 1x128 (torch has no
    128x128 x 128x128 kernel)."""
    sa, sb = operand_scaling(a_q), operand_scaling(b_q)
    coarse, deepseek = {TENSORWISE, ROWWISE}, {B1X128, B128X128}
    if sa in coarse and sb in coarse:
        return TENSORWISE if sa == sb == TENSORWISE else ROWWISE
    if sa in coarse | deepseek and sb in coarse | deepseek:
        ka = B128X128 if sa == B128X128 and sb != B128X128 else B1X128
        kb = B128X128 if sb == B128X128 else B1X128
        return f"{ka} x {kb}"
    if sa == sb and sa in (B1X32, B1X16):
        return sa
    raise KernelUnavailable(
        f"no scaled_mm kernel multiplies {_describe(a_q)} by {_describe(b_q)} (torch's kernels take "
        "per-tensor/per-row pairs, 1x128 with 128x128 or 1x128 float32 blocks, 1x32 E8M0 pairs, 1x16 NVFP4 pairs)")


def _scales_along_k(q: QuantizedTensor, width: int) -> torch.Tensor:
    """q's scales as one per row per `width`-wide K block: (R, ceil(K/width)) float32. Valid where
    q's own scales are constant on each such block (per tensor, per row, blocks whose width is a
    multiple of `width` or spans K); rows of taller blocks repeat their block's scale."""
    s, w = _k_blocks(q)  # (R, K blocks of q), q's block width along K
    k = q.shape[1]
    if w < k and w % width:
        raise KernelUnavailable(f"{_describe(q)}: scales {w} wide cannot be restated {width} wide")
    reps = -(-w // width)
    return s.float().repeat_interleave(reps, 1)[:, : -(-k // width)]


def _sm(arch: Arch) -> str:
    return f"sm_{arch[0]}{arch[1]}"


def _version(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(text).split(".")[:2])
    except ValueError:
        return ()


@dataclass(frozen=True)
class KernelPlan:
    """How fp8lab calls torch's scaled matmul for one pair of operands on one GPU generation.

    kind: the kernel family (KERNEL_KINDS); entry: "torch._scaled_mm" (TensorWise, RowWise) or
    "torch.nn.functional.scaled_mm" (block scalings); k_multiple: K is zero-padded to a multiple
    of it (M and N to 16); out_dtype: what the kernel writes (float32 where the kernel offers
    it, else bfloat16); fast_accum: whether use_fast_accum means anything to it.
    """

    kind: str
    arch: Arch
    entry: str
    k_multiple: int
    out_dtype: torch.dtype
    fast_accum: bool
    library: str  # "cuBLASLt" or "CUTLASS"

    @property
    def label(self) -> str:
        return f"{self.kind} on {_sm(self.arch)} ({self.library})"


def plan_gemm(a_q: QuantizedTensor, b_q: QuantizedTensor, arch: Arch, cuda: str | None) -> KernelPlan:
    """The kernel call for a_q[M, K] @ b_q[N, K].T on a GPU of compute capability `arch` with
    torch built for CUDA `cuda`; raises KernelUnavailable with the reason where there is none.
    Decided from the two operands (their scalings and formats), never from a recipe name."""
    arch = (int(arch[0]), int(arch[1]))
    if a_q.shape[1] != b_q.shape[1]:
        raise ValueError(f"operands must share K: a_q is {tuple(a_q.shape)} (M, K), b_q is {tuple(b_q.shape)} (N, K)")
    if arch < (8, 9):
        raise KernelUnavailable(f"FP8 GEMMs need sm_89 or newer, this is {_sm(arch)}")
    kind = _pair_kind(a_q, b_q)
    fa, fb = a_q.fmt, b_q.fmt
    if fa is E5M2 and fb is E5M2:
        raise KernelUnavailable("cuBLASLt has no E5M2 x E5M2 FP8 GEMM")
    v2 = "torch.nn.functional.scaled_mm"
    has_v2 = hasattr(torch.nn.functional, "scaled_mm")
    cublas_129 = _version(cuda) >= (12, 9)
    if kind == TENSORWISE:
        return KernelPlan(kind, arch, "torch._scaled_mm", 16, torch.float32, True, "cuBLASLt")
    if kind == ROWWISE:
        cublas = arch[0] == 9 and cublas_129  # torch: cuBLAS from 12.9 on sm_90, CUTLASS elsewhere
        if not cublas and fb is not E4M3:
            raise KernelUnavailable(f"the CUTLASS rowwise kernel ({_sm(arch)}) needs an E4M3 b, got {fb.name}")
        return KernelPlan(kind, arch, "torch._scaled_mm", 16, torch.bfloat16, True, "cuBLASLt" if cublas else "CUTLASS")
    if kind in BLOCKWISE_KINDS:
        if arch[0] != 9:
            raise KernelUnavailable(
                f"DeepSeek-style 1x128/128x128 scaling runs on sm_90 (Hopper) only, this is {_sm(arch)}")
        if not cublas_129:
            raise KernelUnavailable(f"1x128/128x128 scaling needs cuBLAS >= 12.9, this torch has CUDA {cuda}")
        if fa is not E4M3 or fb is not E4M3:
            raise KernelUnavailable(f"1x128/128x128 scaling needs E4M3 operands, got {fa.name} and {fb.name}")
    elif kind == B1X32:
        if arch < (10, 0):
            raise KernelUnavailable(
                f"MX block scaling (1x32, E8M0) needs sm_100 (Blackwell) or newer, this is {_sm(arch)}")
        if fa is not E4M3 or fb is not E4M3:
            raise KernelUnavailable(f"torch's MXFP8 kernel takes E4M3 operands, got {fa.name} and {fb.name}")
    elif kind == B1X16 and arch < (10, 0):
        raise KernelUnavailable(f"NVFP4 block scaling (1x16, E4M3 scales) needs sm_100 (Blackwell) or newer, "
                                f"this is {_sm(arch)}")
    if not has_v2:
        raise KernelUnavailable(f"{kind} needs torch.nn.functional.scaled_mm (torch >= 2.9), this is torch "
                                f"{torch.__version__}")
    return KernelPlan(kind, arch, v2, _K_MULTIPLE[kind], _OUT_DTYPE[kind], kind in BLOCKWISE_KINDS, "cuBLASLt")


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


def _padded(t: torch.Tensor, rows: int, cols: int, value: float, device: torch.device) -> torch.Tensor:
    """t[r, c] in a fresh contiguous [rows, cols] tensor on `device`, the rest `value`."""
    if tuple(t.shape) == (rows, cols) and t.is_contiguous() and t.device == device:
        return t
    out = torch.full((rows, cols), value, dtype=t.dtype, device=device)
    out[: t.shape[0], : t.shape[1]].copy_(t)
    return out


def _codes(q: QuantizedTensor, rows: int, k: int, device: torch.device) -> torch.Tensor:
    """q's FP8 codes as a row-major contiguous [rows, k] tensor (zero-padded) on `device`."""
    return _padded(q.data.view(torch.uint8), rows, k, 0, device).view(q.data.dtype)


def _fp4_packed(q: QuantizedTensor, rows: int, k: int, device: torch.device) -> torch.Tensor:
    """q's E2M1 codes zero-padded to [rows, k], two per byte along K (low nibble first)."""
    codes = _padded(q.codes(), rows, k, 0, device)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous().view(torch.float4_e2m1fn_x2)


def _row_scales(q: QuantizedTensor, rows: int, device: torch.device) -> torch.Tensor:
    """One float32 scale per row, [rows, 1] contiguous, 1 in padding (per tensor: repeated)."""
    s = q.scale.float()
    s = s.reshape(1, 1).expand(q.shape[0], 1) if s.dim() == 0 else s.reshape(q.shape[0], 1)
    return _padded(s, rows, 1, 1.0, device)


def _e8m0_codes(scale: torch.Tensor) -> torch.Tensor:
    """Power-of-two float32 scales -> their E8M0 codes (uint8): 2^e -> e + 127; NaN -> 255."""
    _, exp = torch.frexp(scale)  # scale = 0.5 * 2^exp exactly (2^-127, a float32 subnormal, included)
    codes = (exp - 1 + 127).clamp(0, 254).to(torch.uint8)
    return torch.where(torch.isnan(scale), torch.full_like(codes, 255), codes)


def _swizzled(codes: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Scale codes (rows, K blocks) as uint8 -> the 32x4x4 layout, viewed as `dtype`, on device."""
    return swizzle_scales(codes.to(device)).view(dtype)


@dataclass
class PreparedGemm:
    """One scaled_mm call with every argument made: run() replays the kernel alone (what a
    benchmark times), result() runs it and returns a @ b.T unpadded, in the kernel's dtype."""

    plan: KernelPlan
    fn: Callable[..., torch.Tensor]
    args: tuple
    kwargs: dict
    m: int
    n: int

    def run(self) -> torch.Tensor:
        return self.fn(*self.args, **self.kwargs)

    def result(self) -> torch.Tensor:
        return self.run()[: self.m, : self.n]


def prepare_real_mm(a_q: QuantizedTensor, b_q: QuantizedTensor, plan: KernelPlan, device: torch.device,
                    use_fast_accum: bool = False) -> PreparedGemm:
    """Make every argument of the scaled_mm call `plan` describes, on `device`.

    Operands: a as mat_a [M, K] row-major; b [N, K] row-major, so that mat_b = b.t() is the
    column-major [K, N] the kernels want (transposed views are copied into that layout).
    M and N are zero-padded to multiples of 16 and K to plan.k_multiple; padded rows get
    scale 1 (zero codes contribute nothing whatever their scale)."""
    import torch.nn.functional as F

    if use_fast_accum and not plan.fast_accum:
        raise ValueError(f"use_fast_accum has no meaning for the {plan.kind} kernel (torch refuses or ignores it)")
    m, k = a_q.shape
    n = b_q.shape[0]
    mp, np_, kp = _up(m, 16), _up(n, 16), _up(k, plan.k_multiple)
    kind = plan.kind
    if kind == B1X16:
        mat_a, b_rows = _fp4_packed(a_q, mp, kp, device), _fp4_packed(b_q, np_, kp, device)
    else:
        mat_a, b_rows = _codes(a_q, mp, kp, device), _codes(b_q, np_, kp, device)
    mat_b = b_rows.t()  # (K, N), column-major
    if kind in (TENSORWISE, ROWWISE):
        if kind == TENSORWISE:
            sa, sb = (q.scale.float().reshape(1).to(device) for q in (a_q, b_q))
        else:
            sa, sb = _row_scales(a_q, mp, device), _row_scales(b_q, np_, device).t().contiguous()  # (M, 1), (1, N)
        kwargs = {"scale_a": sa, "scale_b": sb, "out_dtype": plan.out_dtype, "use_fast_accum": use_fast_accum}
        return PreparedGemm(plan, torch._scaled_mm, (mat_a, mat_b), kwargs, m, n)
    ST, SW = F.ScalingType, F.SwizzleType
    if kind in BLOCKWISE_KINDS:
        kb = kp // 128
        l4 = _up(kb, 4)

        def outer_major(q: QuantizedTensor, rows: int) -> torch.Tensor:  # 1x128: (rows, K/128), strides (1, rows)
            return _padded(_scales_along_k(q, 128), rows, kb, 1.0, device).t().contiguous().t()

        def k_major(q: QuantizedTensor, rows: int) -> torch.Tensor:  # 128x128: (L4, rows/128), strides (1, L4)
            return _padded(q.scale.float(), _up(rows, 128) // 128, l4, 1.0, device).t()

        kinds = kind.split(" x ")
        sa = outer_major(a_q, mp) if kinds[0] == B1X128 else k_major(a_q, mp)
        sb = outer_major(b_q, np_) if kinds[1] == B1X128 else k_major(b_q, np_)
        args = (mat_a, mat_b, sa, getattr(ST, kinds[0]), sb, getattr(ST, kinds[1]))
        kwargs = {"output_dtype": plan.out_dtype, "use_fast_accum": use_fast_accum}
        return PreparedGemm(plan, F.scaled_mm, args, kwargs, m, n)
    if kind == B1X32:
        sa = _swizzled(_e8m0_codes(_scales_along_k(a_q, 32)), torch.float8_e8m0fnu, device)
        sb = _swizzled(_e8m0_codes(_scales_along_k(b_q, 32)), torch.float8_e8m0fnu, device)
        kwargs = {"swizzle_a": SW.SWIZZLE_32_4_4, "swizzle_b": SW.SWIZZLE_32_4_4, "output_dtype": plan.out_dtype}
        return PreparedGemm(plan, F.scaled_mm, (mat_a, mat_b, sa, ST.BlockWise1x32, sb, ST.BlockWise1x32), kwargs, m, n)
    # BlockWise1x16 (NVFP4): E4M3 block scales, one per row per 16 elements, and the tensor scales
    sa, sb = (_swizzled(_scales_along_k(q, 16).to(torch.float8_e4m3fn).view(torch.uint8), torch.float8_e4m3fn, device)
              for q in (a_q, b_q))
    if (a_q.tensor_scale is None) != (b_q.tensor_scale is None):
        raise KernelUnavailable("NVFP4 operands must both have a tensor scale (two-level) or neither")
    if a_q.tensor_scale is None:
        args = (mat_a, mat_b, sa, ST.BlockWise1x16, sb, ST.BlockWise1x16)
        kwargs = {"swizzle_a": SW.SWIZZLE_32_4_4, "swizzle_b": SW.SWIZZLE_32_4_4, "output_dtype": plan.out_dtype}
    else:
        ta, tb = (q.tensor_scale.float().reshape(()).to(device) for q in (a_q, b_q))
        recipe = [ST.BlockWise1x16, ST.TensorWise]
        args = (mat_a, mat_b, [sa, ta], recipe, [sb, tb], recipe)
        kwargs = {"swizzle_a": [SW.SWIZZLE_32_4_4, SW.NO_SWIZZLE], "swizzle_b": [SW.SWIZZLE_32_4_4, SW.NO_SWIZZLE],
                  "output_dtype": plan.out_dtype}
    return PreparedGemm(plan, F.scaled_mm, args, kwargs, m, n)


def _target(a_q: QuantizedTensor, arch: Arch | None, cuda: str | None) -> tuple[Arch, str | None, torch.device]:
    device = a_q.data.device
    if arch is None:
        if device.type != "cuda":
            raise KernelUnavailable(
                "no CUDA device" if not torch.cuda.is_available() else f"the operands are on {device.type}, not a GPU")
        arch = torch.cuda.get_device_capability(device)
    return (int(arch[0]), int(arch[1])), (torch.version.cuda if cuda is None else cuda), device


def real_mm(a_q: QuantizedTensor, b_q: QuantizedTensor, arch: Arch | None = None, cuda: str | None = None,
            use_fast_accum: bool = False) -> torch.Tensor:
    """a_q[M, K] @ b_q[N, K].T through torch's scaled matmul, called exactly as on a GPU of
    compute capability `arch` ((9, 0) ...; None: the tensors' own device) with torch built for
    CUDA `cuda` ("12.9"; None: torch.version.cuda), on the tensors' own device.

    Returns [M, N] unpadded in the kernel's output dtype (KernelPlan.out_dtype). Raises
    KernelUnavailable, whose message is the reason doctor shows, where that architecture has no
    kernel for the pair. See plan_gemm for the choice and prepare_real_mm for the call.
    """
    arch, cuda, device = _target(a_q, arch, cuda)
    plan = plan_gemm(a_q, b_q, arch, cuda)
    return prepare_real_mm(a_q, b_q, plan, device, use_fast_accum).result()


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """Block scales [R, KB] in cuBLAS's tiled layout for 1x32 / 1x16 block scaling.

    The matrix is padded (zeros) to 128-row x 4-column tiles; tiles are stored one after
    another (row tiles outer); inside a tile, element (r, c) with r = 32 i + j sits at offset
    16 j + 4 i + c. Returns a flat contiguous tensor of ceil(R/128)*128 * ceil(KB/4)*4.
    Works on any dtype by moving bytes: float8 scales (E8M0, E4M3) are permuted as uint8.
    """
    if scales.dtype in (torch.float8_e8m0fnu, torch.float8_e4m3fn, torch.float8_e5m2):
        return swizzle_scales(scales.view(torch.uint8)).view(scales.dtype)
    r, kb = scales.shape
    rt, ct = math.ceil(r / 128), math.ceil(kb / 4)
    padded = torch.zeros(rt * 128, ct * 4, dtype=scales.dtype, device=scales.device)
    padded[:r, :kb] = scales
    # (row tile, 4 row groups of 32, 32 rows, col tile, 4 cols) -> (row tile, col tile, 32, 4 groups, 4 cols)
    tiles = padded.reshape(rt, 4, 32, ct, 4).permute(0, 3, 2, 1, 4)
    return tiles.contiguous().flatten()


# ---- one decision per GEMM: real or emulated, counted ------------------------------------------------------------


@dataclass(frozen=True)
class BackendChoice:
    """Which backend runs a GEMM, and why. plan is set where the real kernel runs."""

    backend: str  # "scaled_mm" or "emulated"
    kernel: str  # e.g. "scaled_mm BlockWise1x128 x BlockWise128x128", "emulated fast (bf16 math)"
    reason: str
    plan: KernelPlan | None = None

    def __str__(self) -> str:
        return self.reason


def _emulated_kernel() -> str:
    return "emulated fast (bf16 math)" if bf16_fast_path()[0] else "emulated fast (fp32)"


@lru_cache(maxsize=1)
def _cpu_choice() -> BackendChoice:
    why = "the operands are on the CPU" if torch.cuda.is_available() else "no CUDA device"
    return BackendChoice("emulated", _emulated_kernel(), f"emulated: {why}")


_PROBE_SCALINGS: dict[str, tuple[dict, dict]] = {
    TENSORWISE: ({}, {}),
    ROWWISE: ({"granularity": PerRow(), "scale_rule": "rceil"},) * 2,
    f"{B1X128} x {B128X128}": ({"granularity": PerBlock(1, 128)}, {"granularity": PerBlock(128, 128)}),
    f"{B128X128} x {B1X128}": ({"granularity": PerBlock(128, 128)}, {"granularity": PerBlock(1, 128)}),
    f"{B1X128} x {B1X128}": ({"granularity": PerBlock(1, 128)},) * 2,
    B1X32: ({"granularity": PerBlock(1, 32), "scale_rule": "rceil", "scale_fmt": E8M0},) * 2,
    B1X16: ({"fmt": E2M1, "granularity": PerBlock(1, 16), "scale_fmt": E4M3, "two_level": True},) * 2,
}


class GemmBackend:
    """The one place a GEMM is sent to torch's scaled matmul or to the emulation.

    mode: "auto" (real where the GPU has the kernel for the two operands, else emulated),
          "emulated" (always), "scaled_mm" (real or KernelUnavailable).
    arch, cuda: None reads them from the operands' device and torch.version.cuda; set, they
          make the real path act as that GPU generation would (tests run torch's functions
          replaced by a stand-in with torch's checks, on CPU tensors).
    probe: before a kernel family's first real use on a device, run it once on a small problem
          and compare with the emulation; a family whose probe fails is emulated, with the
          probe's reason. A family that passed is never switched off: a later failure falls
          back to the emulation for that call only, and is counted and reported once.
    Every decision is counted per (layer, gemm, kernel, backend, reason): report() and summary().
    """

    def __init__(self, mode: str = "auto", arch: Arch | None = None, cuda: str | None = None,
                 probe: bool = True, verbose: bool = True) -> None:
        if mode not in BACKENDS:
            raise ValueError(f"unknown backend {mode!r}; valid: {', '.join(BACKENDS)}")
        if arch is not None and not (isinstance(arch, tuple) and len(arch) == 2
                                     and all(isinstance(v, int) for v in arch)):
            raise ValueError(f"arch is a compute capability like (9, 0), got {arch!r}")
        self.mode, self.arch, self.cuda, self.probe, self.verbose = mode, arch, cuda, probe, verbose
        self.probes: dict[tuple[str, str], tuple[bool, str]] = {}
        self.counts: dict[tuple[str, str, str, str, str], int] = {}
        self._announced: set[tuple] = set()

    def __repr__(self) -> str:
        where = f", simulating {_sm(self.arch)} CUDA {self.cuda}" if self.arch is not None else ""
        return f"GemmBackend({self.mode}{where})"

    def fresh(self) -> GemmBackend:
        """A backend that decides alike (same mode, target, probe results) with counts of its own."""
        other = GemmBackend(self.mode, self.arch, self.cuda, self.probe, self.verbose)
        other.probes = self.probes
        return other

    def __deepcopy__(self, memo: dict) -> GemmBackend:
        return self  # a backend is the process's (or a test's) decision, shared by every copy of a model

    # ---- the decision ----
    def choose(self, a_q: QuantizedTensor, b_q: QuantizedTensor) -> BackendChoice:
        """Real or emulated for this pair, and why (probing the kernel family once on a GPU)."""
        if self.mode == "emulated":
            return BackendChoice("emulated", _emulated_kernel(), "emulated: asked for")
        if self.arch is None and a_q.data.device.type != "cuda" and self.mode == "auto":
            return _cpu_choice()  # the common case on a laptop, answered without building a plan
        try:
            arch, cuda, device = _target(a_q, self.arch, self.cuda)
            plan = plan_gemm(a_q, b_q, arch, cuda)
            if self.probe and device.type == "cuda":
                ok, why = self._probe(plan, device)
                if not ok:
                    raise KernelUnavailable(why)
        except KernelUnavailable as err:
            if self.mode == "scaled_mm":
                raise
            return BackendChoice("emulated", _emulated_kernel(), f"emulated: {err}")
        return BackendChoice("scaled_mm", f"scaled_mm {plan.kind}", f"real: scaled_mm {plan.label}", plan)

    def _probe(self, plan: KernelPlan, device: torch.device) -> tuple[bool, str]:
        key = (str(device), plan.kind)
        if key not in self.probes:
            sa, sb = _PROBE_SCALINGS[plan.kind]
            g = torch.Generator().manual_seed(0)
            a, b = torch.randn(96, 384, generator=g), torch.randn(80, 384, generator=g) * 3
            from fp8lab.quantize import quantize

            a_q, b_q = quantize(a.to(device), **sa), quantize(b.to(device), **sb)
            try:
                got = prepare_real_mm(a_q, b_q, plan, device).result().double().cpu()
            except Exception as exc:  # a kernel that fails its probe is emulated, with the reason
                self.probes[key] = (False, f"{plan.kind} failed its probe: {type(exc).__name__}: "
                                           f"{str(exc).splitlines()[0][:160]}")
            else:
                ok, worst = agrees_with_emulation(got, a_q, b_q, plan.out_dtype)
                self.probes[key] = (ok, "probe ok" if ok else
                                    f"{plan.kind} disagreed with the emulation in its probe (worst {worst:.2g})")
        return self.probes[key]

    # ---- running ----
    def mm(self, a_q: QuantizedTensor, b_q: QuantizedTensor, *, layer: str = "", gemm: str = "matmul",
           use_fast_accum: bool = False, out_device: torch.device | None = None) -> torch.Tensor:
        """a_q @ b_q.T as float32, real or emulated as choose() says; counts the decision."""
        choice = self.choose(a_q, b_q)
        if choice.plan is not None:
            device = _target(a_q, self.arch, self.cuda)[2]
            try:
                out = prepare_real_mm(a_q, b_q, choice.plan, device, use_fast_accum).result().float()
            except Exception as exc:  # never stop a workshop: emulate this call, count it, say why once
                if self.mode == "scaled_mm":
                    raise
                reason = f"emulated: scaled_mm {choice.plan.kind} failed ({type(exc).__name__}: " \
                         f"{str(exc).splitlines()[0][:160]})"
                self._count(layer, gemm, choice.kernel, "fallback", reason)
                self._say(("fallback", choice.plan.kind, reason), f"fp8lab: {layer or gemm}: {reason}")
            else:
                self._count(layer, gemm, choice.kernel, "scaled_mm", choice.reason)
                return out if out_device is None else out.to(out_device)
        else:
            self._count(layer, gemm, choice.kernel, "emulated", choice.reason)
        out = emulated_mm(a_q, b_q)
        return out if out_device is None else out.to(out_device)

    def _count(self, layer: str, gemm: str, kernel: str, backend: str, reason: str) -> None:
        key = (layer, gemm, kernel, backend, reason)
        self.counts[key] = self.counts.get(key, 0) + 1

    def _say(self, key: tuple, line: str) -> None:
        if key not in self._announced:
            self._announced.add(key)
            if self.verbose:
                print(line)

    def fallbacks(self) -> int:
        """GEMMs that were planned real, failed at run time and were emulated instead."""
        return sum(c for k, c in self.counts.items() if k[3] == "fallback")

    def report(self) -> list[dict]:
        """One row per (layer, gemm, kernel, backend, reason) with its number of calls."""
        cols = ("layer", "gemm", "kernel", "backend", "reason")
        return [{**dict(zip(cols, k, strict=True)), "calls": c} for k, c in self.counts.items()]

    def summary(self) -> str:
        """Which backend each GEMM used, one line per (gemm, backend, reason), layers pooled."""
        pooled: dict[tuple[str, str, str], int] = {}
        for (_, gemm, _, backend, reason), c in self.counts.items():
            pooled[(gemm, backend, reason)] = pooled.get((gemm, backend, reason), 0) + c
        if not pooled:
            return "no FP8 GEMMs ran"
        return "\n".join(f"{gemm:>6}: {c} calls {backend}: {reason.split(': ', 1)[-1]}"
                         for (gemm, backend, reason), c in sorted(pooled.items()))

    def reset(self) -> None:
        self.counts.clear()


def agrees_with_emulation(real: torch.Tensor, a_q: QuantizedTensor, b_q: QuantizedTensor,
                          out_dtype: torch.dtype) -> tuple[bool, float]:
    """The real kernel's a @ b.T against the exact emulation, at the precision of its output.

    float32 outputs: within 2^-12 * (|a| @ |b|.T). bfloat16 outputs: within one bf16 ulp of the
    emulation rounded to bf16, plus what fp32 accumulation may differ by where a sum cancels
    (the kernel and the emulation each within gamma_K * (|a| @ |b|.T), gamma_K = K u / (1 - K u),
    u = 2^-24: Higham's bound; negligible unless the output is far smaller than |a| @ |b|).
    Returns (ok, worst ratio of the difference to what is allowed)."""
    a_q, b_q = a_q.to("cpu"), b_q.to("cpu")
    emu = emulated_mm(a_q, b_q).double()
    got = real.double().cpu()
    magnitude = a_q.dequantize().double().abs() @ b_q.dequantize().double().abs().t()
    if out_dtype == torch.bfloat16:
        ref = emu.to(torch.bfloat16).double()
        _, e = torch.frexp(ref.abs().clamp(min=2.0**-133))
        k = a_q.shape[1] + 4
        gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
        allowed = torch.ldexp(torch.ones_like(ref), e - 8) + 2 * gamma * magnitude  # one bf16 ulp at ref
    else:
        allowed = 2.0**-12 * magnitude + 2.0**-149
        ref = emu
    diff = (got - ref).abs()
    worst = float((diff / allowed).max()) if diff.numel() else 0.0
    return bool((diff <= allowed).all()), worst


_DEFAULT_BACKENDS: dict[str, GemmBackend] = {}


def default_backend(mode: str = "auto") -> GemmBackend:
    """The process's GemmBackend for `mode` (made once; matmul and FP8Linear use it unless given one)."""
    if isinstance(mode, GemmBackend):
        return mode
    if mode not in BACKENDS:
        raise ValueError(f"unknown backend {mode!r}; valid: {', '.join(BACKENDS)}, or a GemmBackend")
    if mode not in _DEFAULT_BACKENDS:
        _DEFAULT_BACKENDS[mode] = GemmBackend(mode)
    return _DEFAULT_BACKENDS[mode]


def resolve_backend(recipe: Recipe | str = "tensorwise", device: torch.device | str | None = None,
                    backend: str | GemmBackend = "auto", probe: bool = True) -> BackendChoice:
    """What fp8lab.matmul(a, b, recipe) would run on `device` (its fprop pair: the recipe's input and weight)."""
    recipe = get_recipe(recipe)
    engine = default_backend(backend) if probe else GemmBackend(backend if isinstance(backend, str) else backend.mode,
                                                                  probe=False)
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    a_q, b_q = quantize_operands(torch.randn(32, 256, generator=g).to(device),
                                 torch.randn(256, 32, generator=g).to(device), recipe)
    return engine.choose(a_q, b_q)


# ---- matmul ---------------------------------------------------------------------------------------------------


def matmul(
    a: torch.Tensor | QuantizedTensor,
    b: torch.Tensor | QuantizedTensor,
    recipe: Recipe | str = "tensorwise",
    backend: str | GemmBackend = "auto",
    *,
    emulation: str = "fast",
    accumulation: AccumulatorModel | None = None,
    use_fast_accum: bool = False,
    verbose: bool = True,
) -> torch.Tensor:
    """a[M, K] @ b[K, N] with both operands quantized as `recipe` says; returns float32 [M, N].

    a and b may be tensors (quantized here: a as the recipe's input, b as its weight in
    b^T[N, K] layout) or QuantizedTensors (a_q[M, K]; b_q[N, K], i.e. quantize(b.t())).
    backend "auto" runs torch's scaled matmul where the GPU has the kernel for the two
    operands and emulates otherwise (a GemmBackend may be passed instead of a mode); the
    choice and its reason are printed the first time per (device, kernel, shapes). A kernel
    that fails at run time falls back to emulation for that call, counted, with the reason.
    The real kernels' bf16 outputs (rowwise, MX, NVFP4) are returned as float32.
    """
    if emulation not in EMULATIONS:
        raise ValueError(f"unknown emulation {emulation!r}; valid: {', '.join(EMULATIONS)}")
    engine = default_backend(backend)
    recipe = get_recipe(recipe)
    if isinstance(a, QuantizedTensor) != isinstance(b, QuantizedTensor):
        raise TypeError("pass both operands as tensors, or both as QuantizedTensors")
    if isinstance(a, QuantizedTensor):
        a_q, b_q = a, b
        home = a.data.device
    else:
        home = a.device
        a_q, b_q = quantize_operands(a.detach(), b.detach(), recipe)
    if a_q.shape[1] != b_q.shape[1]:
        raise ValueError(
            f"operands must share K: a_q is {tuple(a_q.shape)} (M, K), b_q is {tuple(b_q.shape)} (N, K); "
            "quantize b as b.t() (its [N, K] layout), e.g. with fp8lab.gemm.quantize_operands")
    if accumulation is not None and engine.mode == "scaled_mm":
        raise ValueError("the accumulation model is an emulation; use backend='emulated' or 'auto'")
    if accumulation is not None or emulation == "reference":
        if verbose:
            engine._say(("emulated", recipe.name, tuple(a_q.shape), tuple(b_q.shape), emulation),
                        f"fp8lab.matmul {recipe.name}: emulated ({emulation}"
                        f"{', ' + accumulation.label if accumulation else ''})")
        return emulated_mm(a_q, b_q, emulation=emulation, accumulation=accumulation)
    # CPU tensors on a machine with a GPU still get the real kernel: the same notebook cell
    # runs real FP8 on a GPU box and emulates on a laptop
    if home.type != "cuda" and torch.cuda.is_available() and engine.arch is None and engine.mode != "emulated":
        a_q, b_q = a_q.to("cuda"), b_q.to("cuda")
    if verbose:
        choice = engine.choose(a_q, b_q)
        m, k = a_q.shape
        engine._say((str(a_q.data.device), choice.kernel, tuple(a_q.shape), tuple(b_q.shape)),
                    f"fp8lab.matmul {recipe.name} [{m}x{k}] @ [{k}x{b_q.shape[0]}]: {choice}")
    return engine.mm(a_q, b_q, gemm="matmul", use_fast_accum=use_fast_accum, out_device=home)
