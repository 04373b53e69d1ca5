"""The emulated FP8 GEMM: the same codes and scales as the hardware, exact products, fp32 sums.

Public: emulated_mm(a_q, b_q) (a_q[M, K] @ b_q[N, K].T, bit-exact where every partial sum is),
quantize_operands(a, b, recipe) (both operands in their [rows, K] layouts), ieee_fp32_matmul()
(the context every emulated matmul runs in), MAX_ACCUMULATED_PRODUCTS, EMULATIONS.
The definition (emulation="reference") and its fast twin (one fp32 GEMM over all of K, block
scales folded into the values) share one signature and one test. Notebook 05 introduces it.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

import torch

from fp8lab.numerics import kernels, kernels_gemm
from fp8lab.numerics.quantize import QuantizedTensor, quantize_transposed, quantize_with
from fp8lab.numerics.recipes import Recipe, get_recipe

__all__ = ["EMULATIONS", "MAX_ACCUMULATED_PRODUCTS", "Accumulator", "check_matmul_shapes", "emulated_mm",
           "ieee_fp32_matmul", "k_blocks", "quantize_operands", "scale_output", "scaled_products"]


class Accumulator(Protocol):
    """What emulated_mm's `accumulation` does: sums products (..., K) along K as a tensor core would,
    (...) float32 (gemm.accumulation.AccumulatorModel is one)."""

    def accumulate(self, products: torch.Tensor) -> torch.Tensor: ...


EMULATIONS: tuple[str, ...] = ("fast", "reference")

# the accumulation model walks every product a[m, k] * b[n, k] in float64 (~17 bytes each with its
# temporaries): it takes problems of at most this many products, a chunk of rows of a at a time
MAX_ACCUMULATED_PRODUCTS = 1 << 30
_PRODUCTS_PER_CHUNK = 1 << 22


# ---- fp32 matmuls as IEEE float32 ---------------------------------------------------------------------

_PIN_LOCK = threading.Lock()
_pinned: list = []  # [depth, saved settings] while some thread is inside ieee_fp32_matmul()


def _precision_settings() -> list:
    """The objects whose fp32_precision lets torch run float32 matmuls in lower precision (TF32 on
    CUDA, bf16 through oneDNN on the CPU): torch.backends.cuda.matmul, torch.backends.mkldnn.matmul
    (found once: which objects torch has does not change while it runs)."""
    if not _FOUND:
        found = [torch.backends.cuda.matmul, getattr(torch.backends.mkldnn, "matmul", None)]
        _FOUND.append([m for m in found if m is not None and hasattr(m, "fp32_precision")])
    return _FOUND[0]


_FOUND: list = []  # _precision_settings' answer, once found


@contextlib.contextmanager
def ieee_fp32_matmul() -> Iterator[None]:
    """Inside, float32 matmuls are IEEE float32 (products and sums rounded to float32), whatever the
    process set: torch.backends.cuda.matmul.allow_tf32, set_float32_matmul_precision("high" or
    "medium") or the backends' fp32_precision would run them in TF32 (10-bit mantissas) or bf16,
    which is not what an emulation of FP8 products summed in fp32 may compute. The settings in
    force are restored when the last thread inside leaves."""
    _pin()
    try:
        yield
    finally:
        _unpin()


def _pin() -> None:
    """ieee_fp32_matmul's entry (emulated_mm calls it and _unpin directly, in try/finally)."""
    with _PIN_LOCK:
        if not _pinned:
            settings = _precision_settings()
            if settings:  # (each set where it is not "ieee" already, and only those restored)
                saved = [(m, value) for m in settings if (value := m.fp32_precision) != "ieee"]
                for m, _ in saved:
                    m.fp32_precision = "ieee"
            else:  # a torch without the per-backend settings: the legacy switch
                saved = torch.get_float32_matmul_precision()
                torch.set_float32_matmul_precision("highest")
            _pinned[:] = [0, saved]
        _pinned[0] += 1


def _unpin() -> None:
    """ieee_fp32_matmul's exit: the settings restored when the last thread inside leaves."""
    with _PIN_LOCK:
        _pinned[0] -= 1
        if _pinned[0] == 0:
            saved = _pinned[1]
            if isinstance(saved, str):
                torch.set_float32_matmul_precision(saved)
            else:
                for m, value in saved:
                    m.fp32_precision = value
            _pinned.clear()


# ---- operands -----------------------------------------------------------------------------------


def quantize_operands(
    a: torch.Tensor, b: torch.Tensor, recipe: Recipe | str = "tensorwise"
) -> tuple[QuantizedTensor, QuantizedTensor]:
    """Quantize a[M, K] as the recipe's input and b[K, N] as its weight, in b^T[N, K] layout.

    b is quantized down its columns in place (quantize.quantize_transposed): b_q is the
    QuantizedTensor of b^T as a transposed view, so no copy of b^T is made and the GEMM reads
    b in its own row-major layout. A b given as a transposed [N, K] tensor's view is contiguous
    as b^T: it is quantized as it lies. On the CPU the kernel writes each operand's float32
    values (scale-folded where the GEMM folds them) in the same pass, whatever their size: the
    emulated GEMM reads them next."""
    recipe = get_recipe(recipe)
    check_matmul_shapes(a, b)
    if b.t().is_contiguous() and not b.is_contiguous():  # b = w.t() of a contiguous w[N, K]
        return quantize_with(a, recipe.input, values=True), quantize_with(b.t(), recipe.weight, values=True)
    return quantize_with(a, recipe.input, values=True), quantize_transposed(b, recipe.weight, values=True)


def check_matmul_shapes(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(
            f"matmul takes 2-D a[M, K] and b[K, N], got {tuple(a.shape)} and {tuple(b.shape)}; "
            "reshape batches to (-1, K)"
        )
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a[M, K] @ b[K, N] needs a.shape[1] == b.shape[0], got {tuple(a.shape)} @ {tuple(b.shape)}")


def k_blocks(q: QuantizedTensor) -> tuple[torch.Tensor, int]:
    """An operand's scales as (rows, K blocks) float32 and the block width along K.

    q[R, K] per tensor -> (R, 1) with width K; per row -> (R, 1); per block (r, c) ->
    (R, ceil(K/c)) with each block's scale repeated over its r rows.
    """
    return q.granularity.row_scales(q.scale, tuple(q.shape))


def _tensor_factor(a_q: QuantizedTensor, b_q: QuantizedTensor) -> torch.Tensor | None:
    """Both operands' tensor scales (NVFP4's second level) multiplied, the one where the other has none, else None."""
    ta, tb = a_q.tensor_scale, b_q.tensor_scale
    if ta is None or tb is None:
        return ta if tb is None else tb
    return ta * tb


# ---- emulation ------------------------------------------------------------------------------------------


def _segments(k: int, width_a: int, width_b: int) -> int:
    """The K segments over which both operands' scales are constant: gcd of the block widths."""
    return math.gcd(width_a, width_b) if width_a < k or width_b < k else k


def emulated_mm(
    a_q: QuantizedTensor,
    b_q: QuantizedTensor,
    *,
    emulation: str = "fast",
    accumulation: Accumulator | None = None,
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
    The fp32 matmuls run as IEEE float32 whatever the process's TF32 or bf16 settings
    (ieee_fp32_matmul). The accumulation model takes at most MAX_ACCUMULATED_PRODUCTS
    products (M * N * K), a chunk of rows of a at a time.
    """
    if emulation not in EMULATIONS:
        raise ValueError(f"unknown emulation {emulation!r}; valid: {', '.join(EMULATIONS)}")
    if a_q.shape[1] != b_q.shape[1]:
        raise ValueError(
            f"operands must share K: a_q is {tuple(a_q.shape)} (M, K), b_q is {tuple(b_q.shape)} (N, K); "
            "quantize b as b.t() (its [N, K] layout), e.g. with fp8lab.gemm.quantize_operands"
        )
    if accumulation is not None:
        return scale_output(_accumulate(accumulation, a_q, b_q), a_q, b_q)
    _pin()  # (ieee_fp32_matmul without its context manager's own cost, as every GEMM of a step pays it)
    try:
        return _emulated(a_q, b_q, emulation)
    finally:
        _unpin()


def _emulated(a_q: QuantizedTensor, b_q: QuantizedTensor, emulation: str) -> torch.Tensor:
    if emulation == "fast":  # the one switch: the fast twin where it applies
        out = _emulated_fast(a_q, b_q, _scale_outer_either_)
        if out is not None:
            return out
    (m, k), n = a_q.shape, b_q.shape[0]
    sa, wa = k_blocks(a_q)  # (M, KBa), block width along K
    sb, wb = k_blocks(b_q)  # (N, KBb)
    seg = _segments(k, wa, wb)
    if _exact_partials(a_q, b_q, seg) and kernels.enabled(sa, sb):  # the loop below in one call
        a, b = _values_or_codes(a_q), _values_or_codes(b_q)
        if all(kernels.enabled(t) or kernels_gemm.widens(t) for t in (a, b)):
            starts = torch.arange(0, k, seg, device=sa.device)
            out = kernels_gemm.segment_mm(a, b, sa.t()[starts // wa], sb.t()[starts // wb], seg)
            return scale_output(out, a_q, b_q)
    a = a_q.values()  # (M, K) exact FP8 values, float32
    b = b_q.values()  # (N, K)
    out = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    scale_ = _scale_outer_for(out, sa, sb)  # (either twin: the same bits)
    sa_k, sb_k = sa.t().contiguous(), sb.t().contiguous()  # (KBa, M), (KBb, N): each K block's scales in a row
    for start in range(0, k, seg):
        part = a[:, start : start + seg] @ b[:, start : start + seg].t()  # (M, N), fp32 sums
        scale_(out, sa_k[start // wa], sb_k[start // wb], part)  # out += part * (sa[m] * sb[n])
    return scale_output(out, a_q, b_q)


def _exact_partials(a_q: QuantizedTensor, b_q: QuantizedTensor, seg: int) -> bool:
    """Whether every partial sum of a segment is exact in float32 whatever the order of its additions: the
    values are multiples of each format's smallest step, so every sum of seg products is a multiple of their
    product, at most seg * max * max; exact while that is within 2^24 steps (E2M1: 16 * 36 / (1/4) = 2304).
    Then kernels_gemm.segment_mm, which adds them in its own order, gives the loop's bits."""
    fa, fb = a_q.fmt, b_q.fmt
    return seg * fa.max_value * fb.max_value <= 2.0**24 * fa.min_subnormal * fb.min_subnormal


def _values_or_codes(q: QuantizedTensor) -> torch.Tensor:
    """q's float32 values where it has them, else its FP8 codes where kernels_gemm.segment_mm reads their values on
    the way (no float32 copy), else its values (computed now)."""
    return q.data if q.derived.values is None and kernels_gemm.widens(q.data) else q.values()


def scale_output(out: torch.Tensor, a_q: QuantizedTensor, b_q: QuantizedTensor) -> torch.Tensor:
    """out times the operands' tensor scales (NVFP4's two-level scaling), where they have them."""
    factor = _tensor_factor(a_q, b_q)
    return out if factor is None else out * factor


def _scaled_operands(a_q: QuantizedTensor, b_q: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a[m, k] * sa[m, k] (M, K) and b[n, k] * sb[n, k] (N, K), exact in float64 (tensor scales excepted)."""
    k = a_q.shape[1]
    sa, wa = k_blocks(a_q)
    sb, wb = k_blocks(b_q)
    a_s = a_q.values().double() * sa.double().repeat_interleave(wa, 1)[:, :k]
    b_s = b_q.values().double() * sb.double().repeat_interleave(wb, 1)[:, :k]
    return a_s, b_s


def scaled_products(a_q: QuantizedTensor, b_q: QuantizedTensor) -> torch.Tensor:
    """Every product a[m, k] * sa[m, k] * b[n, k] * sb[n, k], exact in float64: (M, N, K), what
    the accumulator model sums (tensor scales excepted: they scale the output)."""
    a_s, b_s = _scaled_operands(a_q, b_q)
    return a_s[:, None, :] * b_s[None, :, :]


def _accumulate(accumulation: Accumulator, a_q: QuantizedTensor, b_q: QuantizedTensor) -> torch.Tensor:
    """The accumulation model's sums (M, N) float32 of the scaled products, a chunk of rows of a at a
    time (each output is its own walk: the same numbers as all at once); ValueError beyond
    MAX_ACCUMULATED_PRODUCTS products."""
    (m, k), n = a_q.shape, b_q.shape[0]
    if m * n * k > MAX_ACCUMULATED_PRODUCTS:
        raise ValueError(
            f"the accumulation model walks every product in float64: M*N*K = {m}*{n}*{k} = {m * n * k:.3g} "
            f"products is beyond its {MAX_ACCUMULATED_PRODUCTS:.3g}; use fewer rows M or columns N (its "
            "error statistics depend on K), or emulation without an accumulation model")
    a_s, b_s = _scaled_operands(a_q, b_q)
    out = torch.empty(m, n, dtype=torch.float32, device=a_s.device)
    rows = max(1, _PRODUCTS_PER_CHUNK // max(n * k, 1))
    for start in range(0, m, rows):
        out[start:start + rows] = accumulation.accumulate(a_s[start:start + rows, None, :] * b_s[None])  # (r, N, K)
    return out


def _scale_outer_(out: torch.Tensor, a: torch.Tensor | None, b: torch.Tensor | None,
                  part: torch.Tensor | None = None) -> torch.Tensor:
    """out[M, N] *= a[m] * b[n] (the output's scales), or with part[M, N] (one K segment's partial sums)
    out += part * (a[m] * b[n]); a: a scale per row [M], one for every row (0-d) or None (none: the factor is
    b[n]), b likewise per column; the factor is rounded to float32 first, as the reference forms it.
    fp8lab.numerics.kernels_gemm.scale_outer_ is its twin (the same bits without the [M, N] factor)."""
    rows = None if a is None else a[:, None] if a.dim() else a
    cols = None if b is None else b[None, :] if b.dim() else b
    factor = cols if rows is None else rows if cols is None else rows * cols  # (M, N), (M, 1), (1, N) or ()
    return out.mul_(factor) if part is None else out.add_(part * factor)


def _scale_outer_for(out: torch.Tensor, a: torch.Tensor | None, b: torch.Tensor | None
                     ) -> Callable[..., torch.Tensor]:
    """The kernel's scale_outer_ where the kernels run and may read these tensors, else the torch twin (the same
    bits). One value on each side (per tensor, NVFP4's tensor factor) is one multiply by one float32 factor: torch's
    mul_ where it runs on the calling thread anyway (kernels.torch_runs_alone), without the kernel call's checks."""
    if all(t is None or t.dim() == 0 for t in (a, b)) and kernels.torch_runs_alone(out):
        return _scale_outer_
    return kernels_gemm.scale_outer_ if kernels.enabled(out, *(t for t in (a, b) if t is not None)) else _scale_outer_


def _scale_outer_either_(out: torch.Tensor, a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor:
    """out[M, N] *= a[m] * b[n] by _scale_outer_for's twin."""
    return _scale_outer_for(out, a, b)(out, a, b)


def _folded_powers_of_two(a_q: QuantizedTensor, b_q: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Both operands' values with their scales folded in, where every scale is a power of two and the quantize
    kernel wrote them so, and every folded value is normal: then every product and partial sum of the GEMM is the
    unfolded one times sa[m] * sb[n] exactly (each nonzero partial sum is a multiple of the smallest value
    product, so at least lo_a * lo_b, normal; the largest below 2^126), and so is the output the unfolded GEMM
    scales. None otherwise (_emulated_fast's other branches run)."""
    ends = []
    for q in (a_q, b_q):
        if not (q.scaling.powers_of_two and q.derived.scaled is not None):
            return None
        smallest, largest = q.scale_range()
        ends.append((q.fmt.min_subnormal * smallest, q.fmt.max_value * largest))
    (lo_a, hi_a), (lo_b, hi_b) = ends
    if not (min(lo_a, lo_b) >= 2.0**-126 and lo_a * lo_b >= 2.0**-126 and hi_a * hi_b * a_q.shape[1] < 2.0**126):
        return None
    return a_q.scaled_values(), b_q.scaled_values()


def _emulated_fast(a_q: QuantizedTensor, b_q: QuantizedTensor, scale_outer_=_scale_outer_) -> torch.Tensor | None:
    """emulated_mm's fast twin: one fp32 GEMM over all of K.

    Scales that vary along K (blocks narrower than K) are folded into the operand's values
    (QuantizedTensor.scaled_values: exact for power-of-two scales and for E4M3 scales of E4M3
    or E2M1 elements, else one float32 rounding per element); scales constant along K (per
    tensor, per row) are applied to the output, sa[m] * sb[n], as the reference and the
    hardware's epilogue form them (scale_outer_: torch's or the kernel's, the same bits).
    Equal to the reference up to the order of fp32 additions (and that rounding). None where
    folded products could leave float32's normal range: the reference runs instead.
    Power-of-two scales (rowwise's per row) are folded as well where both operands have them and the quantize
    kernel wrote the folded values (_folded_powers_of_two): the same bits as applying them to the output.
    """
    folded = _folded_powers_of_two(a_q, b_q)
    if folded is not None:  # (power-of-two scales have no tensor factor)
        return folded[0] @ folded[1].t()
    operands = []
    for q in (a_q, b_q):  # each as (values[R, K], scale per row or tensor or None, smallest, largest magnitude)
        if q.granularity.whole_rows:  # per tensor: (); per row: q[R, K]'s scales (R, 1), one per output row
            post = q.scale.reshape(()) if q.scale.dim() == 0 else q.scale.reshape(-1)
            operands.append((q.values(), post, q.fmt.min_subnormal, q.fmt.max_value))
        elif q.block_shape[1] < q.shape[1]:  # (only blocks narrower than K)
            smallest, largest = q.scale_range()
            operands.append((q.scaled_values(), None, q.fmt.min_subnormal * smallest, q.fmt.max_value * largest))
        else:  # blocks as wide as K: one scale per row, repeated over each block's rows
            operands.append((q.values(), k_blocks(q)[0][:, 0], q.fmt.min_subnormal, q.fmt.max_value))
    (a, post_a, lo_a, hi_a), (b, post_b, lo_b, hi_b) = operands
    if not (lo_a * lo_b >= 2.0**-126 and hi_a * hi_b * a.shape[1] < 2.0**126):
        return None  # folded products would leave float32's normal range
    out = a @ b.t()  # (M, N)
    if post_a is not None or post_b is not None:  # one scale factor per output, sa[m] * sb[n] (0-d: one for all)
        scale_outer_(out, post_a, post_b)
    factor = _tensor_factor(a_q, b_q)
    return out if factor is None else scale_outer_(out, factor, None)
