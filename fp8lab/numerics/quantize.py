"""quantize(x, ...) -> QuantizedTensor, and back with .dequantize(): the definition first.

Public: quantize (the one a learner calls), quantize_definition (what quantization is, in torch, on one
screen: each block's amax, its scale, the cast), quantize_with (the same with the settings already in a
TensorScaling: the seam that picks a fast twin from quantize_fast, the C kernel or the chunked torch code,
for the same bits), quantize_transposed, quantize_delayed, quantize_spec, block_amax and transformed (amax per
block, an operand's Hadamard transform: by the kernel where it runs), QuantizedTensor.
x[M, K] -> data[M, K] (the format's codes) and scale[ceil(M/rows), ceil(K/cols)] (float32 dequantization
multipliers): x ~= data.float() * scale, broadcast per block; NVFP4 adds a per-tensor float32 factor.
Notebook 02 introduces quantize; 04 the block shapes; 01 the codes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fp8lab.numerics import kernels, kernels_gemm, quantize_fast
from fp8lab.numerics.formats import (
    E2M1,
    E4M3,
    FloatFormat,
    cast,
    check_float,
    e8m0_codes,
    round_stochastic,
    uniform_draws,
    widen,
)
from fp8lab.numerics.scaling import (
    AmaxHistory,
    Granularity,
    PerTensor,
    TensorScaling,
    amax_per_block,
    as_2d,
    padded_blocks,
    scale_from_amax,
)

__all__ = [
    "QuantizedTensor",
    "block_amax",
    "quantize",
    "quantize_definition",
    "quantize_delayed",
    "quantize_observing",
    "quantize_spec",
    "quantize_transposed",
    "quantize_with",
    "transformed",
]


def quantize(
    x: torch.Tensor,
    fmt: TensorScaling | FloatFormat | str = E4M3,
    granularity: Granularity | str = PerTensor(),
    scale_rule: str = "exact",
    margin: int = 0,
    *,
    scale_fmt: FloatFormat | str | None = None,
    two_level: bool = False,
    amax: torch.Tensor | float | None = None,
    rounding: str = "nearest",
    generator: torch.Generator | None = None,
    scale_floor: str = "zero",
) -> QuantizedTensor:
    """Quantize x to `fmt` with one scale per block of `granularity`.

    fmt may also be a TensorScaling, every setting at once (the other settings then stay at their
    defaults): x goes through its transform (a Hadamard transform, where it has one) first.

    x[M, K] -> QuantizedTensor(data[M, K], scale[ceil(M/rows), ceil(K/cols)]), where
    scale = amax / (fmt.max_value / 2**margin) for "exact" (scaling.scale_from_amax has every
    rule) and data = cast(x / scale, fmt), saturating at +-max_value.

    scale_fmt  None: float32 scales. E8M0: power-of-two scales (MX). E4M3: scales rounded
               to E4M3 (NVFP4), with two_level=True adding a per-tensor float32 scale
               amax / (448 * fmt.max_value) so the E4M3 block scales use their whole range.
    scale_floor  E4M3 block scales only: "zero" (no lower clamp, subnormal scales and 0 below them: the
               training engines, TransformerEngine and torchao's NVFP4 training path) or "min_normal"
               (clamped at 2^-6: torchao's inference NVFP4Tensor); scaling.SCALE_FLOORS says which is whose.
    amax       use this amax instead of x's own: a scalar for per-tensor scaling (delayed
               scaling), or one per block, shaped like the scale (amaxes reduced across
               data-parallel ranks, fp8lab.training.distributed); each finite and >= 0, or NaN. Values
               beyond it clip, and metrics.overflow_fraction shows how many.
    rounding   "nearest" (ties to even) or "stochastic": each scaled value rounds up or down to a
               neighbouring code, up with probability its distance from the lower one over the gap,
               so the mean over draws is x (formats.round_stochastic); one torch.rand draw per
               element of x[M, K], in order, from `generator` (None: torch's default generator).
               Scales are unchanged (amax and the scale rule decide them). The C kernel rounds with
               the same draws to the same codes as the torch code, the same on every machine.
    NaN in x makes its block NaN (NaN propagates); an infinite value raises ValueError, and
    so does a float64 value beyond float32's range: a scale needs a finite amax, and quantize does not
    guess one (torch.nan_to_num first, where an infinity is meant). fp8lab.nn.FP8Linear keeps that for
    the forward's activations and weights, and passes a gradient's infinities on instead (its GEMM in
    high precision): a loss scaler overflows gradients on purpose and must see the inf.
    Per-row and per-block need a 2-D x (reshape batches to (-1, K)); a block larger than x is
    clamped to it. x may have any float dtype; it is detached: the result carries no autograd
    graph (fp8lab.nn.FP8Linear defines the gradients of FP8 training).
    """
    if isinstance(fmt, TensorScaling):
        return quantize_with(transformed(x, fmt), fmt, amax, generator=generator)
    spec = TensorScaling(fmt, granularity, scale_rule, scale_fmt, two_level, margin, rounding, scale_floor=scale_floor)
    return quantize_with(x, spec, amax, generator=generator)


def quantize_definition(x: torch.Tensor, spec: TensorScaling, amax: torch.Tensor | float | None = None,
                        generator: torch.Generator | None = None) -> QuantizedTensor:
    """What quantization is, in torch: each block's amax, its scale, the cast (quantize_with: the same bits).

    x[M, K] -> data[M, K] = cast(x / scale, spec.fmt), scale[ceil(M/r), ceil(K/c)] = scale_from_amax(amax).
    """
    x2d = _input_2d(x, spec.granularity)  # (M, K)
    m, k = x2d.shape
    block = spec.granularity.block_shape((m, k))  # (r, c), never larger than x
    own = amax_per_block(x2d, spec.granularity)  # (MB, KB): max|x| over each block
    _check_amax(own, x2d)
    block_amax = own if amax is None else _given_amax(amax, tuple(own.shape), spec.granularity, (m, k), x2d.device)
    # every scale rule; NVFP4's two levels: E4M3 block scales under a float32 tensor scale
    scale, inverse, tensor_scale = scale_from_amax(block_amax, spec)
    scaled = padded_blocks(x2d.float(), block) * inverse[:, None, :, None]  # (MB, r, KB, c)
    if spec.rounding == "stochastic":  # up or down, by one uniform draw per element of x[M, K]
        draws = padded_blocks(uniform_draws(x2d, generator), block)
        data = round_stochastic(scaled, spec.fmt, draws).to(spec.fmt.storage_dtype)
    else:  # to nearest, ties to even, saturating at +-max
        data = cast(scaled, spec.fmt, spec.fmt.storage_dtype)
    data = data.reshape(scaled.shape[0] * block[0], -1)[:m, :k]  # (M, K)
    return _quantized(x, spec, data.contiguous(), scale, tensor_scale, block_amax)


def quantize_with(x: torch.Tensor, spec: TensorScaling, amax: torch.Tensor | float | None = None, *,
                  count: bool = False, values: bool | None = None,
                  generator: torch.Generator | None = None) -> QuantizedTensor:
    """quantize_definition's bits, fast: the one place that picks a twin (quantize_fast). x is quantized as
    given (spec's transform is the caller's: quantize(x, spec) applies it).

    On the CPU the C kernel computes them in one pass (kernels.engine(), decided once per process), stochastic
    rounding included (from the same draws); elsewhere the definition's torch code runs a bounded chunk at a
    time. count=True also counts, in the kernel's pass, the elements that clipped and flushed
    (QuantizedTensor.counts, for the Monitor); the torch code leaves that to metrics. values=True has the
    kernel write the float32 values (scale-folded where a GEMM folds them) in the same pass whatever the size,
    for an operand a GEMM reads next (None: up to kernels.EAGER_VALUES elements). generator: stochastic
    rounding's draws (None: torch's default generator), one per element of x[M, K] in order.
    """
    return _quantize_pass(x, spec, amax, count, values, generator)[0]


def quantize_observing(x: torch.Tensor, spec: TensorScaling, amax: torch.Tensor | float, *, count: bool = False,
                       values: bool | None = None,
                       generator: torch.Generator | None = None) -> tuple[QuantizedTensor, torch.Tensor]:
    """quantize_with(x, spec, amax), and x's own amax per block [MB, KB] read in the same pass: delayed scaling
    scales with its history's amax and records this tensor's, without a second read of x."""
    return _quantize_pass(x, spec, amax, count, values, generator)


def _quantize_pass(x: torch.Tensor, spec: TensorScaling, amax: torch.Tensor | float | None, count: bool,
                   values: bool | None, generator: torch.Generator | None) -> tuple[QuantizedTensor, torch.Tensor]:
    """quantize_with's one pass: the QuantizedTensor, and x's own block amaxes (which it reads to check x)."""
    plain = None if count else quantize_fast.plain_pass(x, spec, values, amax)
    if plain is not None:  # (a GEMM operand's pass, most often: one kernel call, nothing else to decide)
        fused, fold = plain
        scaled_from = fused.amax if amax is None else amax.reshape(())  # (given: one amax, per tensor)
        return _quantized(x, spec, fused.codes, fused.scale, fused.tensor_scale, scaled_from, fused.values, fold,
                          fused.scale_range), fused.amax
    x2d = _input_2d(x, spec.granularity)
    m, k = x2d.shape
    block = spec.granularity.block_shape((m, k))  # never larger than x
    blocks = (-(-m // block[0]), -(-k // block[1]))  # (MB, KB)
    given = None if amax is None else _given_amax(amax, blocks, spec.granularity, (m, k), x2d.device)

    x32 = quantize_fast.kernel_input(x2d, spec, given)
    if x32 is not None:  # the C kernel: it draws before it can see an infinity, so a refusal gives the draws back
        drawn_from = generator if generator is not None else torch.default_generator  # x32 is on the CPU
        state = drawn_from.get_state() if spec.rounding == "stochastic" else None
        fold = quantize_fast.folds(block, (m, k), spec)
        fused = kernels.quantize(x32, block, quantize_fast.kernel_parameters(spec), given, fold=fold, count=count,
                                 values=values, draws=quantize_fast.draws(x2d, spec, generator))
        if fused is None or (fused.nan and bool(torch.isinf(x32).any())):
            if state is not None:  # the definition refuses before it draws: the generator's stream goes on as there
                drawn_from.set_state(state)
            _refuse_inf(x32)  # an infinite amax (or an infinity beside a NaN, whose amax is NaN)
        scaled_from = fused.amax if given is None else given
        return _quantized(x, spec, fused.codes, fused.scale, fused.tensor_scale, scaled_from, fused.values, fold,
                          fused.scale_range, fused.counts), fused.amax

    own = amax_per_block(x2d, spec.granularity)  # the torch code, the cast a chunk at a time
    _check_amax(own, x2d)
    block_amax = own if given is None else given
    scale, inverse, tensor_scale = scale_from_amax(block_amax, spec)
    data = quantize_fast.scale_and_cast(x2d, block, inverse, spec.fmt, _draws(x2d, spec, generator))
    return _quantized(x, spec, data, scale, tensor_scale, block_amax), own


def _draws(x2d: torch.Tensor, spec: TensorScaling, generator: torch.Generator | None) -> torch.Tensor | None:
    """Stochastic rounding's draws, one per element of x[M, K] in order (None: rounding to nearest draws none)."""
    return uniform_draws(x2d, generator) if spec.rounding == "stochastic" else None


# ---- what quantize checks on the way in, and the result ---------------------------------------------------


def _check_amax(own: torch.Tensor, x2d: torch.Tensor) -> None:
    # a NaN in a block makes its amax NaN, which would hide an infinity beside it
    if bool(torch.isinf(own).any()) or (bool(torch.isnan(own).any()) and bool(torch.isinf(x2d).any())):
        _refuse_inf(x2d)


_FLOAT32_MAX = torch.finfo(torch.float32).max
_EXACT_IN_FLOAT32 = (torch.float32, torch.bfloat16, torch.float16)


def _refuse_inf(x: torch.Tensor) -> None:
    n = int(torch.isinf(x).sum())
    raise ValueError(
        f"x has {n} infinite value(s): a scale needs a finite amax. fp8lab does not guess "
        "here; replace them first (e.g. torch.nan_to_num(x, posinf=..., neginf=...)) or "
        "find where they came from. (NaN is allowed and propagates to its block.)"
    )


def _input_2d(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """x as the [M, K] the granularity talks about, checked (detached: no autograd graph): float32,
    bfloat16 or float16 as given (every value exact in float32), float64 rounded to float32."""
    check_float(x)
    if x.dtype == torch.float64 and x.numel():  # values float32 cannot hold would read as infinities
        beyond = (x.abs() > _FLOAT32_MAX) & torch.isfinite(x)
        if bool(beyond.any()):
            raise ValueError(
                f"x has {int(beyond.sum())} value(s) beyond float32's range (largest |x| "
                f"{float(x[beyond].abs().max()):.3g} > {_FLOAT32_MAX:.3g}): fp8lab quantizes in float32. "
                "Divide x by a power of two first (and multiply the scales back), or clamp it.")
    # float32, bfloat16 and float16 values are all exact in float32: kept as they are (the torch
    # code widens them a chunk at a time, the kernel takes float32); float64 is rounded here
    x32 = x.detach().to(torch.float32) if x.dtype not in _EXACT_IN_FLOAT32 else x.detach()
    x2d = as_2d(x32, granularity)
    if x2d.numel() == 0:
        raise ValueError("cannot quantize an empty tensor")
    return x2d


def _given_amax(amax: torch.Tensor | float, blocks: tuple[int, int], granularity: Granularity,
                shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    """An amax passed to quantize, checked: one per block (MB, KB), float32, each >= 0 and finite or NaN."""
    a = torch.as_tensor(amax, dtype=torch.float32, device=device)
    if a.numel() != blocks[0] * blocks[1]:
        raise ValueError(
            f"amax has {a.numel()} value(s) but {granularity.label} scaling of shape {tuple(shape)} has "
            f"{blocks[0] * blocks[1]} block(s): pass one amax per block, shaped {blocks} "
            "(a single amax is for per-tensor scaling, as in delayed scaling)")
    if a.numel() == 1:  # (one amax, as delayed scaling passes every step: checked as a number, not by torch ops)
        value = float(a)
        bad_value = value if value < 0 or math.isinf(value) else None
    else:
        bad = (a < 0) | torch.isinf(a)
        bad_value = a[bad].flatten()[0].item() if bool(bad.any()) else None
    if bad_value is not None:
        raise ValueError(f"an amax is max|x| over its block: finite and >= 0, got {bad_value!r} "
                         "(NaN is allowed: it propagates to its block)")
    return a.reshape(blocks)


def _quantized(x, spec: TensorScaling, data, scale, tensor_scale, block_amax, values=None, folded=False,
               scale_range=None, counts=None) -> QuantizedTensor:
    if spec.granularity.whole_tensor:  # () per tensor; else one per block, (MB, KB) as made
        scale, block_amax = scale.reshape(()), block_amax.reshape(())
    if data.shape != x.shape:
        data = data.reshape(x.shape)
        values = None if values is None else values.reshape(x.shape)
    derived = Derived(None if folded else values, values if folded else None, scale_range)
    return _made(data, scale, spec, tensor_scale, block_amax, counts, derived)


def _made(data: torch.Tensor, scale: torch.Tensor, spec: TensorScaling, tensor_scale: torch.Tensor | None,
          amax: torch.Tensor | None, counts: tuple[int, int] | None, derived: Derived) -> QuantizedTensor:
    """The QuantizedTensor of what quantize (or a transpose) made: its fields agree by construction (spec checked
    once, as a TensorScaling; shapes and dtypes from the kernel or the torch code), so __post_init__'s checks of a
    hand-built one are skipped on this path, which every GEMM operand takes."""
    q = object.__new__(QuantizedTensor)
    q.__dict__.update(data=data, scale=scale, fmt=spec.fmt, granularity=spec.granularity, scale_rule=spec.scale_rule,
                      scale_fmt=spec.scale_fmt, tensor_scale=tensor_scale, amax=amax, margin=spec.margin,
                      counts=counts, derived=derived, rounding=spec.rounding, scale_floor=spec.scale_floor,
                      scaling=spec)
    return q


def block_amax(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """scaling.amax_per_block(x, granularity): max|x| per block (NaN where a block holds a NaN), by the C kernel
    where it runs and may read x (kernels.amax_per_block: the same bits)."""
    return (kernels.amax_per_block if kernels.enabled(x) else amax_per_block)(x, granularity)


def transformed(x: torch.Tensor, spec: TensorScaling) -> torch.Tensor:
    """spec.transform(x): the operand x[rows, contraction] as its GEMM reads it (a Hadamard transform along the
    contraction, where spec has one), by the C kernel where it runs and may read x (kernels.hadamard: the same bits)."""
    if spec.hadamard is not None and kernels.enabled(x):
        return kernels.hadamard(spec.hadamard, x)
    return spec.transform(x)


def quantize_spec(
    fmt: FloatFormat | str = E4M3,
    granularity: Granularity | str = PerTensor(),
    scale_rule: str = "exact",
    margin: int = 0,
    scale_fmt: FloatFormat | str | None = None,
    two_level: bool = False,
    rounding: str = "nearest",
    scale_floor: str = "zero",
) -> TensorScaling:
    """quantize()'s settings, in quantize's order, as the TensorScaling that checks them once."""
    return TensorScaling(fmt, granularity, scale_rule, scale_fmt, two_level, margin, rounding, scale_floor=scale_floor)


def quantize_transposed(x: torch.Tensor, spec: TensorScaling, values: bool | None = None) -> QuantizedTensor:
    """Quantize the operand x^T[cols, rows] as `spec` says, from x[rows, cols], without copying x^T: x is
    quantized down its columns (spec.down_columns) and the result is the QuantizedTensor of x^T, code for
    code, as a transposed view (what a GEMM over x's rows needs: a weight b[K, N] for b^T[N, K], an
    activation x[M, K] for wgrad's x^T[K, M]). With a Hadamard transform, x^T is copied and transformed
    along its rows (its contraction)."""
    if spec.hadamard is not None:
        return quantize_with(transformed(x.t().contiguous(), spec), spec, values=values)
    return quantize_with(x, spec.down_columns(x.shape[0]), values=values).t(spec.granularity)


def quantize_delayed(
    x: torch.Tensor,
    history: AmaxHistory,
    fmt: FloatFormat | str = E4M3,
    margin: int = 0,
) -> QuantizedTensor:
    """Delayed per-tensor scaling: quantize x with the scale from `history`, then record x's amax.

    On a step where |x| jumps above every amax in the history, the excess clips to
    +-max_value: `metrics.overflow_fraction(x, q)` is then > 0.
    """
    q = quantize(x, fmt, PerTensor(), "exact", margin, amax=history.amax_for_step(x))
    history.record(x)
    return q


# ---- QuantizedTensor ------------------------------------------------------------------------------------


@dataclass(eq=False)
class Derived:
    """What a QuantizedTensor derives from its codes and scales: computed once, when first asked
    for, or written by quantize's kernel in the same pass where that was nearly free. The only
    mutable part of a QuantizedTensor; filling it changes no number, only when it is computed.

    values:      data as float32, data's shape (QuantizedTensor.values())
    scaled:      values times each element's block scale, tensor_scale left out, float32, data's
                 shape (QuantizedTensor.scaled_values(): what an emulated GEMM multiplies where
                 the scales vary along its contraction)
    scale_range: (smallest, largest) block scale (QuantizedTensor.scale_range())
    """

    values: torch.Tensor | None = None
    scaled: torch.Tensor | None = None
    scale_range: tuple[float, float] | None = None

    def t(self) -> Derived:
        return Derived(None if self.values is None else self.values.t(),
                       None if self.scaled is None else self.scaled.t(), self.scale_range)


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A tensor in a low-precision format with one scale per block: x ~ data.float() * scale (* tensor_scale).

    Parameters:
        data: x's shape, in fmt.storage_dtype (E2M1 values unpacked, one per byte, in float8_e4m3fn).
        scale: float32 dequantization multipliers: () per tensor, (M, 1) per row, (ceil(M/r), ceil(K/c))
            per block of r x c (blocks clamped to the tensor).
        fmt, granularity, scale_rule, scale_fmt, margin: how the scales were made (quantize's arguments).
        tensor_scale: a 0-d float32 second factor (NVFP4's two-level scaling), else None.
        amax: the amax each scale came from, shaped like scale.
        counts: (clipped, flushed) elements, where quantize counted them in its own pass; else None.
        derived: the float32 and scale-folded values, computed once from the codes (a cache: see Derived).
        rounding: how the cast rounded, "nearest" or "stochastic" (formats.ROUNDINGS).
        scale_floor: where E4M3 block scales stopped at the bottom (scaling.SCALE_FLOORS).
        scaling: all of these settings in one TensorScaling (quantize passes the one it used; a hand-built
            QuantizedTensor gets one made, and so checked, from the fields above).

    A hand-built one is checked on construction: a wrong dtype, device or scale shape raises ValueError, never
    garbage later; quantize's own (_made) are consistent by construction and skip the checks.
    Frozen: no field is reassigned and no tensor written after construction; only the cache fills in.
    """

    data: torch.Tensor
    scale: torch.Tensor
    fmt: FloatFormat
    granularity: Granularity
    scale_rule: str = "exact"
    scale_fmt: FloatFormat | None = None
    tensor_scale: torch.Tensor | None = None
    amax: torch.Tensor | None = None
    margin: int = 0
    counts: tuple[int, int] | None = None
    derived: Derived = field(default_factory=Derived, repr=False)
    rounding: str = "nearest"
    scale_floor: str = "zero"
    scaling: TensorScaling | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.data, torch.Tensor) or not isinstance(self.scale, torch.Tensor):
            raise TypeError("QuantizedTensor: data and scale must be torch.Tensors")
        if not isinstance(self.fmt, FloatFormat) or not isinstance(self.granularity, Granularity):
            raise TypeError("QuantizedTensor: fmt must be a FloatFormat and granularity a Granularity "
                            "(fp8lab.get_format, fp8lab.parse_granularity)")
        if self.scaling is None:  # built by hand: its settings checked once, as a TensorScaling
            object.__setattr__(self, "scaling", TensorScaling(
                self.fmt, self.granularity, self.scale_rule, self.scale_fmt, self.tensor_scale is not None,
                self.margin, self.rounding, scale_floor=self.scale_floor))
        if self.data.dtype != self.fmt.storage_dtype:
            raise ValueError(f"QuantizedTensor: {self.fmt.name} data is stored as {self.fmt.storage_dtype}, "
                             f"got {self.data.dtype}")
        shape = self.granularity.scale_shape(tuple(as_2d(self.data, self.granularity).shape))
        for name, t in (("scale", self.scale), ("amax", self.amax)):
            if t is None:
                continue
            if t.dtype != torch.float32 or t.device != self.data.device or tuple(t.shape) != shape:
                raise ValueError(
                    f"QuantizedTensor: {name} must be float32 on {self.data.device}, shaped {shape} for "
                    f"{self.granularity.label} blocks of data {tuple(self.data.shape)}; got {t.dtype} on {t.device}, "
                    f"shaped {tuple(t.shape)}")
        ts = self.tensor_scale
        if ts is not None and (ts.dtype != torch.float32 or ts.device != self.data.device or ts.dim() != 0):
            raise ValueError("QuantizedTensor: tensor_scale must be a 0-d float32 tensor on data's device")

    def scale_range(self) -> tuple[float, float]:
        """(smallest, largest) block scale, without tensor_scale; both NaN if a scale is NaN.
        Found by the quantize kernel where it ran, else computed once (Derived)."""
        if self.derived.scale_range is None:
            smallest, largest = torch.aminmax(self.scale)
            self.derived.scale_range = (float(smallest), float(largest))
        return self.derived.scale_range

    def values(self) -> torch.Tensor:
        """data as float32 (the element values before scaling), computed once (Derived)."""
        if self.derived.values is None:  # (by a table lookup in C where the kernels run: the same bits)
            self.derived.values = (kernels_gemm.widen_codes if kernels_gemm.widens(self.data) else widen)(self.data)
        return self.derived.values

    def scaled_values(self) -> torch.Tensor:
        """values times each element's block scale (tensor_scale left out), float32, data's shape and
        layout (a GEMM's summation order may follow it): what an emulated GEMM multiplies where the
        scales vary along K. Computed once (Derived)."""
        if self.derived.scaled is None:
            scaled = self._times_block_scales(self.values())
            if self.data.dim() == 2 and not self.data.is_contiguous() and self.data.t().is_contiguous():
                scaled = scaled.t().contiguous().t()  # a transposed view, laid out as the kernel writes it
            self.derived.scaled = scaled
        return self.derived.scaled

    def _times_block_scales(self, data: torch.Tensor) -> torch.Tensor:
        if self.scale.dim() == 0:
            return data * self.scale
        d2 = as_2d(data, self.granularity)
        blocks = padded_blocks(d2, self.block_shape)  # (MB, r, KB, c)
        out = blocks * self.scale[:, None, :, None]
        m, k = d2.shape
        # contiguous, as the kernel writes it: a GEMM's summation order may follow the layout
        return out.reshape(blocks.shape[0] * blocks.shape[1], -1)[:m, :k].contiguous().reshape(self.shape)

    def t(self, granularity: Granularity | None = None) -> QuantizedTensor:
        """The transpose, sharing data and scales: q[M, K] -> q.t()[K, M].

        Exact for per-tensor and per-block scaling (a block's transpose is a block of the
        transposed tensor, padding included). Per-row scales would become per-column, which
        no granularity here describes: re-quantize instead (or quantize PerBlock(M, 1), one
        block per column, and pass granularity=PerRow() to name its transpose's blocks).
        """
        if self.data.dim() != 2:
            raise ValueError("t() needs a 2-D QuantizedTensor")
        g = self.granularity
        gran = g.transposed()
        if gran is None:
            raise ValueError(f"{g.label} scales are not transposable; quantize the transposed tensor instead")
        scale, amax = self.scale.t(), self.amax.t() if self.amax is not None else None  # (a 0-d t() is itself)
        if granularity is not None and granularity != gran:
            if gran.block_shape(tuple(self.shape[::-1])) != granularity.block_shape(tuple(self.shape[::-1])):
                raise ValueError(f"the transpose's blocks are {gran.label}, not {granularity.label}")
            gran = granularity
        return _made(self.data.t(), scale, self.scaling.with_granularity(gran), self.tensor_scale, amax, self.counts,
                     self.derived.t())

    def to(self, device: torch.device | str) -> QuantizedTensor:
        """The same codes and scales on another device (cached float32 copies are not moved)."""
        device = torch.device(device)
        if self.data.device == device:
            return self

        def move(t):
            return None if t is None else t.to(device)

        return QuantizedTensor(move(self.data), move(self.scale), self.fmt, self.granularity, self.scale_rule,
                               self.scale_fmt, move(self.tensor_scale), move(self.amax), self.margin, self.counts,
                               Derived(scale_range=self.derived.scale_range), self.rounding, self.scale_floor,
                               self.scaling)

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def block_shape(self) -> tuple[int, int]:
        x2d_shape = as_2d(self.data, self.granularity).shape
        return self.granularity.block_shape(tuple(x2d_shape))

    def expanded_scale(self) -> torch.Tensor:
        """The scale of every element, float32, data's shape (tensor_scale folded in)."""
        scale = self.scale
        if self.tensor_scale is not None:
            scale = scale * self.tensor_scale
        if scale.dim() == 0:
            return scale.expand(self.shape)
        m, k = as_2d(self.data, self.granularity).shape
        r, c = self.block_shape
        full = scale.repeat_interleave(r, 0).repeat_interleave(c, 1)[:m, :k]
        return full.reshape(self.shape)

    def dequantize(self) -> torch.Tensor:
        """data * scale (* tensor_scale), float32, the original shape."""
        out = self.derived.scaled  # the same products, where the quantize kernel (or a GEMM) made them
        if out is None:
            out = self._times_block_scales(self.values())
        elif self.tensor_scale is None:
            out = out.clone()
        return out * self.tensor_scale if self.tensor_scale is not None else out

    def codes(self) -> torch.Tensor:
        """The element codes as uint8 (E2M1: 4-bit codes 0..15, sign in bit 3)."""
        if self.fmt != E2M1:
            return self.data.view(torch.uint8)
        # a table lookup per chunk: the index tensor (int32) stays small whatever the size
        table = _E2M1_FROM_E4M3_BYTE.to(self.data.device)
        flat = self.data.reshape(-1).view(torch.uint8)
        out = torch.empty_like(flat)
        for start in range(0, flat.numel(), _LOOKUP_CHUNK):
            part = flat[start:start + _LOOKUP_CHUNK]
            torch.index_select(table, 0, part.to(torch.int32), out=out[start:start + _LOOKUP_CHUNK])
        return out.reshape(self.data.shape)

    def scale_codes(self) -> torch.Tensor:
        """The block scales in their own format's codes (E8M0 / E4M3), as uint8."""
        if self.scale_fmt is None:
            raise ValueError("these scales are float32; they have no 8-bit codes")
        if self.scale_fmt.name == "e8m0":  # by frexp: torch < 2.7 has no float8_e8m0fnu
            return e8m0_codes(self.scale)
        return self.scale.to(self.scale_fmt.storage_dtype).view(torch.uint8)

    def packed(self) -> torch.Tensor:
        """E2M1 data packed two per byte (torch.float4_e2m1fn_x2, low nibble first), for kernels."""
        if self.fmt != E2M1:
            raise ValueError(f"only E2M1 data is packed; this is {self.fmt.name}")
        codes = self.codes()
        if codes.shape[-1] % 2:
            raise ValueError("packing needs an even last dimension")
        pairs = codes.reshape(*codes.shape[:-1], -1, 2)
        # torch >= 2.8 has float4_e2m1fn_x2; before it, the same bytes as uint8
        return (pairs[..., 0] | (pairs[..., 1] << 4)).view(getattr(torch, "float4_e2m1fn_x2", torch.uint8))

    @property
    def scale_bits_per_element(self) -> float:
        """Memory the scales cost, in bits per element (32 for float32 scales, 8 for E8M0/E4M3)."""
        bits = 32 if self.scale_fmt is None else self.scale_fmt.bits
        total = bits * self.scale.numel() + (32 if self.tensor_scale is not None else 0)
        return total / max(self.data.numel(), 1)

    def __repr__(self) -> str:
        return (
            f"QuantizedTensor({self.fmt.name}, {self.granularity.label}, rule={self.scale_rule}, "
            f"shape={tuple(self.shape)}, scale={tuple(self.scale.shape)}"
            + (f" {self.scale_fmt.name}" if self.scale_fmt else " float32")
            + (", two-level" if self.tensor_scale is not None else "")
            + (f", scale floor {self.scale_floor}" if self.scale_floor != "zero" else "")
            + (f", {self.rounding} rounding" if self.rounding != "nearest" else "")
            + ")"
        )


def _e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    # E2M1 magnitudes in code order: 0, 0.5, 1, 1.5, 2, 3, 4, 6
    magnitude = values.abs()
    table = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], device=values.device)
    idx = torch.searchsorted(table, magnitude.contiguous()).clamp(max=7).to(torch.uint8)
    sign = torch.signbit(values).to(torch.uint8) << 3
    return idx | sign


# E2M1 data is stored as E4M3 bytes: a 256-entry table turns each byte into its 4-bit E2M1 code
# (the bytes of the 16 E2M1 values; a NaN byte, from a NaN input, maps like the searchsorted
# of NaN did: to the largest magnitude with its sign bit)
_E2M1_FROM_E4M3_BYTE = _e2m1_codes(torch.arange(256, dtype=torch.uint8, device="cpu").view(torch.float8_e4m3fn).float())
_LOOKUP_CHUNK = 1 << 22  # codes(): elements looked up at a time (16 MiB of int32 indices)
