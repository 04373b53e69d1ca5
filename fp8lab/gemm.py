"""FP8 GEMMs: real (torch scaled_mm on a GPU that has the kernel) or emulated (anywhere).

Public: matmul, quantize_operands, emulated_mm, AccumulatorModel, resolve_backend,
BackendChoice, backend_table, BACKENDS.
Shapes: a[M, K] @ b[K, N] -> out[M, N]. Operands are quantized in their [rows, K] layout:
a as a[M, K] (role "input"), b as b^T[N, K] (role "weight"), like w[N, K] in nn.Linear.
The emulation computes what the hardware computes: the same FP8 codes and scales, exact
products, fp32 sums, scales applied per K block; AccumulatorModel adds the Hopper tensor
core's ~14-bit accumulator and DeepSeek-V3's promotion to fp32 every 128 elements.
Notebook 05 introduces this file; `python -m fp8lab doctor` prints the backend table.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch

from fp8lab import kernels
from fp8lab.formats import E2M1, E4M3, E8M0
from fp8lab.quantize import QuantizedTensor
from fp8lab.recipes import RECIPES, Recipe, get_recipe
from fp8lab.scaling import PerBlock, PerRow, PerTensor
from fp8lab.timing import timed

__all__ = [
    "BACKENDS",
    "AccumulatorModel",
    "BackendChoice",
    "accumulation_error",
    "backend_table",
    "emulated_mm",
    "matmul",
    "quantize_operands",
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
    """Quantize a[M, K] as the recipe's input and b[K, N] as its weight, in b^T[N, K] layout."""
    recipe = get_recipe(recipe)
    _check_matmul_shapes(a, b)
    return recipe.input.quantize(a), recipe.weight.quantize(b.t().contiguous())


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


# ---- emulation: the reference -------------------------------------------------------------------------


def _segments(k: int, width_a: int, width_b: int) -> int:
    """The K segments over which both operands' scales are constant: gcd of the block widths."""
    return math.gcd(width_a, width_b) if width_a < k or width_b < k else k


def _emulated_reference(
    a_q: QuantizedTensor, b_q: QuantizedTensor, accumulation: AccumulatorModel | None
) -> torch.Tensor:
    """The teaching version: per K segment, exact products summed in fp32, then scaled.

    out[m, n] = sum_s  (sum_{k in s} a[m, k] * b[n, k]) * sa[m, s] * sb[n, s]
    """
    a = a_q.values()  # (M, K) exact FP8 values, float32
    b = b_q.values()  # (N, K)
    m, k = a.shape
    n = b.shape[0]
    sa, wa = _k_blocks(a_q)  # (M, KBa), block width along K
    sb, wb = _k_blocks(b_q)  # (N, KBb)
    if accumulation is not None:
        # scaled products, exact in float64, through the accumulator model
        a_s = a.double() * sa.double().repeat_interleave(wa, 1)[:, :k]
        b_s = b.double() * sb.double().repeat_interleave(wb, 1)[:, :k]
        out = accumulation.accumulate(a_s[:, None, :] * b_s[None, :, :])  # (M, N, K) -> (M, N)
    else:
        seg = _segments(k, wa, wb)
        out = torch.zeros(m, n, dtype=torch.float32, device=a.device)
        for start in range(0, k, seg):
            part = a[:, start : start + seg] @ b[:, start : start + seg].t()  # (M, N), fp32 sums
            factor = sa[:, start // wa, None] * sb[None, :, start // wb]  # (M, N)
            out += part * factor
    factor = _tensor_factor(a_q, b_q)
    return out if factor is None else out * factor


# ---- emulation: the fast path ------------------------------------------------------------------------------


def _significant_bits(fmt) -> int:
    return fmt.mantissa_bits + 1


def _fold(q: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor | None, bool, float, float]:
    """An operand as float32 values ready for one GEMM over all of K.

    Returns (values[R, K], post_scale or None, exact_in_bf16, lo, hi). Scales that vary
    along K are folded into the values: exactly when the product of an element and its
    scale fits in bfloat16's 8 significant bits (power-of-two scales; E4M3 block scales
    times E4M3 or E2M1 elements); otherwise in float32 with one rounding per element.
    Scales constant along K are returned as post_scale (0-d per tensor, [R] per row) and
    applied to the GEMM's output.
    lo and hi bound the magnitudes of the nonzero values (from the format and the scales).
    """
    g, k = q.granularity, q.shape[1]
    if not isinstance(g, PerBlock) or g.cols >= k:  # one scale per row (or tensor): apply after the GEMM
        post = q.scale.reshape(()) if isinstance(g, PerTensor) else _k_blocks(q)[0][:, 0]
        return q.values(), post, True, q.fmt.min_subnormal, q.fmt.max_value
    pow2 = q.scale_rule in ("rceil", "floor") or q.scale_fmt is E8M0
    e4m3_scales = q.scale_fmt is E4M3 and _significant_bits(q.fmt) + _significant_bits(E4M3) <= 8
    values = q._scaled if q._scaled is not None else _scaled_values(q)  # the kernel may have folded them
    smallest, largest = q.scale_range()
    lo = q.fmt.min_subnormal * smallest
    hi = q.fmt.max_value * largest
    return values, None, pow2 or e4m3_scales, lo, hi


def _scaled_values(q: QuantizedTensor) -> torch.Tensor:
    """values * block scale of a per-block q, float32 [R, K]."""
    values, g = q.values(), q.granularity
    if kernels.enabled(values):  # one pass, from the block scales as they are
        return kernels.block_mul(values, (g.rows, g.cols), q.scale)
    if kernels.enabled(values.t()):  # a transposed QuantizedTensor: in its own layout
        return kernels.block_mul(values.t(), (g.cols, g.rows), q.scale.t()).t()
    s, width = _k_blocks(q)
    return values * s.repeat_interleave(width, 1)[:, : q.shape[1]]


@contextlib.contextmanager
def _bf16_fpmath():
    """float32 matmuls that compute with bfloat16 inputs and fp32 accumulation (oneDNN)."""
    mk = torch.backends.mkldnn
    old = mk.matmul.fp32_precision
    mk.matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        mk.matmul.fp32_precision = old


@lru_cache(maxsize=1)
def bf16_fast_path() -> tuple[bool, str]:
    """Does this CPU run an fp32 GEMM faster with bf16 inputs (fp32 accumulation), and
    exactly? Probed once (~0.2 s): a correctness check and a timing at 1024^3."""
    mk = getattr(torch.backends, "mkldnn", None)
    if mk is None or not mk.is_available() or not hasattr(mk, "matmul"):
        return False, "no oneDNN in this torch build"
    try:
        g = torch.Generator().manual_seed(0)
        # exact check: bf16-representable inputs whose sums need fp32's 24 bits
        a = torch.randn(64, 256, generator=g).to(torch.float8_e4m3fn).float()
        b = torch.randn(64, 256, generator=g).to(torch.float8_e4m3fn).float()
        exact = (a.double() @ b.double().t()).float()
        with _bf16_fpmath():
            got = a @ b.t()
        if (got - exact).abs().max() > 1e-4 * exact.abs().max():
            return False, "bf16 matmul mode is not accumulating in fp32 here"
        x = torch.randn(1024, 1024, generator=g).to(torch.float8_e4m3fn).float()
        y = torch.randn(1024, 1024, generator=g).to(torch.float8_e4m3fn).float()

        t32 = min(timed(lambda: x @ y.t()))
        with _bf16_fpmath():
            t16 = min(timed(lambda: x @ y.t()))
        if t16 < 0.9 * t32:
            return True, f"oneDNN's bf16 math mode: {t32 / t16:.1f}x the fp32 GEMM at 1024^3"
        return False, f"bf16 inputs are not faster here ({t32 / t16:.2f}x)"
    except (RuntimeError, AttributeError) as err:  # old torch without the setting
        return False, f"bf16 matmul mode unavailable ({err})"


def _emulated_fast(a_q: QuantizedTensor, b_q: QuantizedTensor) -> torch.Tensor:
    """The fast version: one GEMM over all of K on scale-folded values.

    Equal to the reference up to the order of fp32 additions (and one rounding per element
    where float32 scales are folded): see emulated_mm for the bound. Falls back to the
    reference where folding could underflow or overflow float32 products.
    """
    a, post_a, exact_a, lo_a, hi_a = _fold(a_q)
    b, post_b, exact_b, lo_b, hi_b = _fold(b_q)
    if not (lo_a * lo_b >= 2.0**-126 and hi_a * hi_b * a.shape[1] < 2.0**126):
        return _emulated_reference(a_q, b_q, None)  # folded products would leave float32's normal range
    if a.device.type == "cpu" and exact_a and exact_b and bf16_fast_path()[0]:
        with _bf16_fpmath():  # inputs exact in bf16, products and sums in fp32
            out = a @ b.t()
    else:
        out = a @ b.t()
    # one scale factor per output, sa[m] * sb[n], as the reference (and the hardware
    # epilogue) forms it; per-tensor scales are 0-d, so an [M, N] factor exists only when
    # both operands scale per row, and the kernel applies that one without building it
    col = post_a[:, None] if post_a is not None and post_a.dim() else post_a  # (M, 1) or 0-d
    row = post_b[None, :] if post_b is not None and post_b.dim() else post_b  # (1, N) or 0-d
    if col is not None and row is not None and col.dim() and row.dim() and kernels.enabled(out):
        kernels.scale_outer_(out, post_a, post_b)
    elif col is not None and row is not None:
        out.mul_(col * row)
    elif col is not None or row is not None:
        out.mul_(col if col is not None else row)
    factor = _tensor_factor(a_q, b_q)
    return out if factor is None else out.mul_(factor)


def emulated_mm(
    a_q: QuantizedTensor,
    b_q: QuantizedTensor,
    *,
    emulation: str = "fast",
    accumulation: AccumulatorModel | None = None,
) -> torch.Tensor:
    """Emulated FP8 GEMM of a_q[M, K] and b_q[N, K] (b in its [N, K] layout): out[M, N] float32.

    "reference": exact products, summed in fp32 per K segment (where both operands' scales
                 are constant), each partial sum scaled and added in fp32: the hardware's
                 order for per-block scaling.
    "fast":      scales folded into the values (exactly where they fit in bf16) and one GEMM
                 over all of K, in oneDNN's bf16 math mode (fp32 accumulation) where the
                 operands are exact in bf16 and that mode is faster here (probed once), else
                 in fp32.
    Both equal dequantize(a_q) @ dequantize(b_q).T up to fp32 rounding: the Higham bound
    |out - exact| <= gamma * (|a| @ |b|.T), gamma = (K + 2) u / (1 - (K + 2) u), u = 2^-24,
    plus u * |exact| for folding float32 scales. With `accumulation`, the reference path
    runs through the AccumulatorModel (fast is not available there).
    """
    if emulation not in EMULATIONS:
        raise ValueError(f"unknown emulation {emulation!r}; valid: {', '.join(EMULATIONS)}")
    if a_q.shape[1] != b_q.shape[1]:
        raise ValueError(
            f"operands must share K: a_q is {tuple(a_q.shape)} (M, K), b_q is {tuple(b_q.shape)} (N, K); "
            "quantize b as b.t() (its [N, K] layout), e.g. with fp8lab.gemm.quantize_operands"
        )
    if accumulation is not None or emulation == "reference":
        return _emulated_reference(a_q, b_q, accumulation)
    return _emulated_fast(a_q, b_q)


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
    got = got.double().cpu()
    return (torch.linalg.norm(got - exact) / torch.linalg.norm(exact)).item()


# ---- the real backend ------------------------------------------------------------------------------------


def _kernel_kind(recipe: Recipe) -> str:
    """Which scaled_mm kernel family a recipe's fprop GEMM needs."""
    ai, wi = recipe.input, recipe.weight
    ga, gw = ai.granularity, wi.granularity
    if isinstance(ga, PerTensor) and isinstance(gw, PerTensor):
        return "TensorWise"
    if isinstance(ga, PerRow) and isinstance(gw, PerRow):
        return "RowWise"
    if ga == PerBlock(1, 128) and gw == PerBlock(128, 128) and ai.scale_fmt is None:
        return "BlockWise1x128 x BlockWise128x128"
    if ga == PerBlock(1, 32) and gw == PerBlock(1, 32) and ai.scale_fmt is E8M0:
        return "BlockWise1x32"
    if ai.fmt is E2M1 and ga == PerBlock(1, 16) and ai.scale_fmt is E4M3:
        return "BlockWise1x16"
    return "none"


# compute capability each kernel family needs (torch ScaledBlas.cpp)
_KERNEL_NEEDS = {
    "TensorWise": ((8, 9), None),
    "RowWise": ((8, 9), None),
    "BlockWise1x128 x BlockWise128x128": ((9, 0), (9, 0)),  # Hopper only, cuBLASLt >= 12.9
    "BlockWise1x32": ((10, 0), None),
    "BlockWise1x16": ((10, 0), None),
}


@dataclass(frozen=True)
class BackendChoice:
    """Which backend runs a GEMM, and why."""

    backend: str  # "scaled_mm" or "emulated"
    kernel: str  # e.g. "scaled_mm TensorWise", "emulated fast (bf16 math)"
    reason: str

    def __str__(self) -> str:
        return self.reason


def _sm(cc: tuple[int, int]) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def _device_supports(kind: str, device: torch.device) -> tuple[bool, str]:
    if device.type != "cuda":
        return False, "no CUDA device" if not torch.cuda.is_available() else f"tensors are on {device.type}"
    if kind == "none":
        return False, "no scaled_mm kernel for this combination of scalings"
    cc = torch.cuda.get_device_capability(device)
    low, exact_major = _KERNEL_NEEDS[kind]
    if cc < (8, 9):
        return False, f"FP8 needs sm_89 or newer, this is {_sm(cc)}"
    if exact_major is not None and cc[0] != exact_major[0]:
        return False, f"{kind} needs {_sm(exact_major)} (Hopper), this is {_sm(cc)}"
    if cc < low:
        return False, f"{kind} needs {_sm(low)}, this is {_sm(cc)}"
    if kind not in ("TensorWise", "RowWise") and not hasattr(torch.nn.functional, "scaled_mm"):
        return False, f"{kind} needs torch.nn.functional.scaled_mm (torch >= 2.9), this is torch {torch.__version__}"
    return True, f"{kind} on {_sm(cc)}"


_PROBED: dict[tuple[str, str], tuple[bool, str]] = {}
_ANNOUNCED: set[tuple] = set()


def _probe_kernel(recipe: Recipe, device: torch.device) -> tuple[bool, str]:
    """Run the kernel once on a small problem; cache whether it works."""
    kind = _kernel_kind(recipe)
    key = (str(device), kind)
    if key not in _PROBED:
        try:
            g = torch.Generator().manual_seed(0)
            a = torch.randn(128, 256, generator=g)
            b = torch.randn(256, 128, generator=g)
            a_q, b_q = quantize_operands(a, b, recipe)
            got = _real_mm(a_q, b_q, recipe, device).float().cpu()
            want = emulated_mm(a_q, b_q, emulation="reference")
            err = ((got - want).abs().max() / want.abs().max()).item()
            _PROBED[key] = (err < 1e-2, "probe ok" if err < 1e-2 else f"probe disagreed with emulation ({err:.1e})")
        except Exception as exc:  # a missing or failing kernel must never stop a workshop
            _PROBED[key] = (False, f"{kind} kernel failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    return _PROBED[key]


def resolve_backend(
    recipe: Recipe | str = "tensorwise",
    device: torch.device | str | None = None,
    backend: str = "auto",
    probe: bool = True,
) -> BackendChoice:
    """Decide, once per (device, recipe), whether scaled_mm runs this recipe's GEMM, and why."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    recipe = get_recipe(recipe)
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    fast = bf16_fast_path()
    emulated_kernel = "emulated fast (bf16 math)" if fast[0] else "emulated fast (fp32)"
    if backend == "emulated":
        return BackendChoice("emulated", emulated_kernel, "emulated: asked for")
    ok, why = _device_supports(_kernel_kind(recipe), device)
    if ok and probe:
        ok, probe_why = _probe_kernel(recipe, device)
        if not ok:
            why = probe_why
    kind = _kernel_kind(recipe)
    if ok:
        return BackendChoice("scaled_mm", f"scaled_mm {kind}", f"real: scaled_mm {why}")
    if backend == "scaled_mm":
        raise RuntimeError(f"backend='scaled_mm' cannot run recipe {recipe.name!r} here: {why}")
    return BackendChoice("emulated", emulated_kernel, f"emulated: {why}")


def backend_table(device: torch.device | str | None = None, probe: bool = True) -> list[dict[str, str]]:
    """One row per recipe: which backend its GEMMs use on this machine, and why."""
    rows = []
    for name, recipe in RECIPES.items():
        choice = resolve_backend(recipe, device, probe=probe)
        rows.append({"recipe": name, "kernel": _kernel_kind(recipe), "backend": choice.backend,
                     "reason": choice.reason})
    return rows


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """Block scales [R, KB] in cuBLAS's tiled layout for 1x32 / 1x16 block scaling.

    The matrix is padded to 128-row x 4-column tiles; tiles are stored one after another
    (row tiles outer); inside a tile, element (r, c) with r = 32 i + j sits at offset
    16 j + 4 i + c. Returns a flat contiguous tensor of ceil(R/128)*128 * ceil(KB/4)*4.
    """
    r, kb = scales.shape
    rt, ct = math.ceil(r / 128), math.ceil(kb / 4)
    padded = torch.zeros(rt * 128, ct * 4, dtype=scales.dtype, device=scales.device)
    padded[:r, :kb] = scales
    rows = torch.arange(rt * 128, device=scales.device)[:, None]
    cols = torch.arange(ct * 4, device=scales.device)[None, :]
    tile = (rows // 128) * ct + cols // 4  # which 128x4 tile
    inner = rows % 128
    offset = tile * 512 + (inner % 32) * 16 + (inner // 32) * 4 + cols % 4
    out = torch.empty(rt * 128 * ct * 4, dtype=scales.dtype, device=scales.device)
    out[offset.flatten()] = padded.flatten()
    return out


def _pad_to(t: torch.Tensor, rows: int, cols: int, value: float = 0.0) -> torch.Tensor:
    if t.shape == (rows, cols):
        return t
    out = torch.full((rows, cols), value, dtype=t.dtype, device=t.device)
    out[: t.shape[0], : t.shape[1]] = t
    return out


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


def _real_mm(
    a_q: QuantizedTensor, b_q: QuantizedTensor, recipe: Recipe, device: torch.device, use_fast_accum: bool = False
) -> torch.Tensor:
    """scaled_mm on the GPU. Pads M, N, K to multiples of 16 (zero codes, unit scales)."""
    import torch.nn.functional as F

    kind = _kernel_kind(recipe)
    m, k = a_q.shape
    n = b_q.shape[0]
    if kind == "BlockWise1x16":
        a_data, b_data = a_q.packed(), b_q.packed()  # (M, K/2), (N, K/2) float4_e2m1fn_x2
    else:
        mp, np_, kp = _up(m, 16), _up(n, 16), _up(k, 16)
        a_data = _pad_to(a_q.data.view(torch.uint8), mp, kp).view(a_q.data.dtype)
        b_data = _pad_to(b_q.data.view(torch.uint8), np_, kp).view(b_q.data.dtype)
    a_data, b_data = a_data.to(device), b_data.to(device)
    mat_b = b_data.t()  # (K, N) column-major, as cuBLAS wants
    if kind == "TensorWise":
        out = torch._scaled_mm(
            a_data, mat_b, scale_a=a_q.scale.reshape(1).to(device), scale_b=b_q.scale.reshape(1).to(device),
            out_dtype=torch.float32, use_fast_accum=use_fast_accum,
        )
    elif kind == "RowWise":
        sa = _pad_to(a_q.scale, a_data.shape[0], 1, 1.0).to(device)  # (M, 1)
        sb = _pad_to(b_q.scale, b_data.shape[0], 1, 1.0).t().contiguous().to(device)  # (1, N)
        out = torch._scaled_mm(a_data, mat_b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                               use_fast_accum=use_fast_accum)
    elif kind == "BlockWise1x128 x BlockWise128x128":
        kb = math.ceil(a_data.shape[1] / 128)
        sa = _pad_to(a_q.scale, a_data.shape[0], kb, 1.0)  # (M, K/128)
        sa = sa.t().contiguous().t().to(device)  # outer-dim-major: strides (1, M)
        nb = math.ceil(b_data.shape[0] / 128)
        sb = _pad_to(b_q.scale, nb, _up(kb, 4), 1.0).contiguous().to(device)  # (N/128, roundup(K/128, 4))
        out = F.scaled_mm(
            a_data, mat_b, sa, F.ScalingType.BlockWise1x128, sb.t(), F.ScalingType.BlockWise128x128,
            output_dtype=torch.bfloat16, use_fast_accum=use_fast_accum,
        )
    elif kind == "BlockWise1x32":
        sa = swizzle_scales(a_q.scale.to(torch.float8_e8m0fnu)).to(device)
        sb = swizzle_scales(b_q.scale.to(torch.float8_e8m0fnu)).to(device)
        sw = F.SwizzleType.SWIZZLE_32_4_4
        out = F.scaled_mm(a_data, mat_b, sa, F.ScalingType.BlockWise1x32, sb, F.ScalingType.BlockWise1x32,
                          swizzle_a=sw, swizzle_b=sw, output_dtype=torch.bfloat16)
    elif kind == "BlockWise1x16":
        sa = swizzle_scales(a_q.scale.to(torch.float8_e4m3fn)).to(device)
        sb = swizzle_scales(b_q.scale.to(torch.float8_e4m3fn)).to(device)
        ta = a_q.tensor_scale.reshape(1).to(device)
        tb = b_q.tensor_scale.reshape(1).to(device)
        sw, no = F.SwizzleType.SWIZZLE_32_4_4, F.SwizzleType.NO_SWIZZLE
        out = F.scaled_mm(
            a_data, mat_b, [sa, ta], [F.ScalingType.BlockWise1x16, F.ScalingType.TensorWise],
            [sb, tb], [F.ScalingType.BlockWise1x16, F.ScalingType.TensorWise],
            swizzle_a=[sw, no], swizzle_b=[sw, no], output_dtype=torch.bfloat16,
        )
    else:
        raise RuntimeError("no scaled_mm kernel for this combination of scalings")
    return out[:m, :n]


# ---- matmul ---------------------------------------------------------------------------------------------------


def matmul(
    a: torch.Tensor | QuantizedTensor,
    b: torch.Tensor | QuantizedTensor,
    recipe: Recipe | str = "tensorwise",
    backend: str = "auto",
    *,
    emulation: str = "fast",
    accumulation: AccumulatorModel | None = None,
    use_fast_accum: bool = False,
    verbose: bool = True,
) -> torch.Tensor:
    """a[M, K] @ b[K, N] with both operands quantized as `recipe` says; returns float32 [M, N].

    a and b may be tensors (quantized here: a as the recipe's input, b as its weight in
    b^T[N, K] layout) or QuantizedTensors (a_q[M, K]; b_q[N, K], i.e. quantize(b.t())).
    backend "auto" runs torch scaled_mm where the GPU has the kernel and emulates
    otherwise; the choice and its reason are printed the first time per (device, recipe,
    shapes). A kernel that fails at run time falls back to emulation, with the reason.
    The real kernel's output is bf16 for every kernel but TensorWise (returned as float32).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if emulation not in EMULATIONS:
        raise ValueError(f"unknown emulation {emulation!r}; valid: {', '.join(EMULATIONS)}")
    recipe = get_recipe(recipe)
    if isinstance(a, QuantizedTensor) != isinstance(b, QuantizedTensor):
        raise TypeError("pass both operands as tensors, or both as QuantizedTensors")
    if isinstance(a, QuantizedTensor):
        a_q, b_q = a, b
        home = a.data.device
    else:
        home = a.device
        a_q, b_q = quantize_operands(a.detach(), b.detach(), recipe)
    # CPU tensors on a machine with a GPU still get the real kernel: the same notebook cell
    # runs real FP8 on a GPU box and emulates on a laptop
    device = home if home.type == "cuda" or not torch.cuda.is_available() else torch.device("cuda")
    if accumulation is not None and backend == "scaled_mm":
        raise ValueError("the accumulation model is an emulation; use backend='emulated' or 'auto'")
    choice = resolve_backend(recipe, device, "emulated" if accumulation is not None else backend)
    key = (str(device), recipe.name, tuple(a_q.shape), tuple(b_q.shape), choice.kernel)
    if verbose and key not in _ANNOUNCED:
        _ANNOUNCED.add(key)
        m, k = a_q.shape
        print(f"fp8lab.matmul {recipe.name} [{m}x{k}] @ [{k}x{b_q.shape[0]}]: {choice}")
    if choice.backend == "scaled_mm":
        try:
            return _real_mm(a_q, b_q, recipe, device, use_fast_accum).float().to(home)
        except Exception as exc:
            _PROBED[(str(device), _kernel_kind(recipe))] = (False, f"kernel failed: {type(exc).__name__}: {exc}")
            print(f"fp8lab.matmul {recipe.name}: scaled_mm failed ({type(exc).__name__}: "
                  f"{str(exc).splitlines()[0][:120]}); emulating instead")
    return emulated_mm(a_q, b_q, emulation=emulation, accumulation=accumulation)
