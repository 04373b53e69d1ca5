"""quantize(x, ...) -> QuantizedTensor, and back with .dequantize().

Public: quantize, quantize_delayed, QuantizedTensor; quantize_spec / quantize_with (the
settings checked once, then applied: what a training step calls).
x[M, K] -> data[M, K] (the format's codes) and scale[ceil(M/rows), ceil(K/cols)]
(float32 dequantization multipliers): x ~= data.float() * scale, broadcast per block.
NVFP4 adds a second, per-tensor float32 factor: x ~= data * scale * tensor_scale.
Notebook 02 introduces quantize; 04 the block shapes; 01 the codes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from fp8lab import kernels
from fp8lab.formats import E2M1, E4M3, E8M0, FloatFormat, _check_float, cast, get_format, widen
from fp8lab.scaling import (
    SCALE_RULES,
    AmaxHistory,
    Granularity,
    PerBlock,
    PerTensor,
    amax_per_block,
    as_2d,
    cast_scale_e4m3,
    check_margin,
    check_scale_args,
    padded_blocks,
    parse_granularity,
    scale_from_amax,
)

__all__ = ["QuantizeSpec", "QuantizedTensor", "quantize", "quantize_delayed", "quantize_spec", "quantize_with"]

# rows of blocks handled per step of the scale-and-cast loop: ~1 MiB of float32 at a time
# stays in cache, so x is read once and the fp8 result written once
_CHUNK_ELEMENTS = 1 << 18


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A tensor in a low-precision format with per-block scales.

    data:  x's shape, dtype fmt.storage_dtype (float8_e4m3fn / float8_e5m2; E2M1 values
           are kept unpacked, one per byte, in float8_e4m3fn, which holds each exactly)
    scale: float32 dequantization multipliers; () per tensor, (M, 1) per row,
           (ceil(M/rows), ceil(K/cols)) per block
    tensor_scale: a second float32 factor (0-d) for two-level scaling (NVFP4), else None
    amax:  the amax each scale was computed from (same shape as scale)
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
    _values: torch.Tensor | None = field(default=None, repr=False)
    # values * block scale (without tensor_scale): what an emulated GEMM multiplies where the
    # scales vary along its contraction; written by the quantize kernel where it is cheap
    _scaled: torch.Tensor | None = field(default=None, repr=False)
    _scale_range: tuple[float, float] | None = field(default=None, repr=False)

    def scale_range(self) -> tuple[float, float]:
        """(smallest, largest) block scale, without tensor_scale; both NaN if a scale is NaN.
        Found by the quantize kernel where it ran, else computed once and cached."""
        if self._scale_range is None:
            smallest, largest = torch.aminmax(self.scale)
            object.__setattr__(self, "_scale_range", (float(smallest), float(largest)))
        return self._scale_range

    def values(self) -> torch.Tensor:
        """data as float32 (the element values before scaling), computed once and cached."""
        if self._values is None:
            object.__setattr__(self, "_values", widen(self.data))
        return self._values

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
        if isinstance(g, PerTensor):
            scale, amax, gran = self.scale, self.amax, g
        elif isinstance(g, PerBlock):
            amax = self.amax.t() if self.amax is not None else None
            scale, gran = self.scale.t(), PerBlock(g.cols, g.rows)
        else:
            raise ValueError(f"{g.label} scales are not transposable; quantize the transposed tensor instead")
        if granularity is not None and granularity != gran:
            if gran.block_shape(tuple(self.shape[::-1])) != granularity.block_shape(tuple(self.shape[::-1])):
                raise ValueError(f"the transpose's blocks are {gran.label}, not {granularity.label}")
            gran = granularity
        return QuantizedTensor(
            self.data.t(), scale, self.fmt, gran, self.scale_rule, self.scale_fmt, self.tensor_scale, amax,
            self.margin, self._values.t() if self._values is not None else None,
            self._scaled.t() if self._scaled is not None else None, self._scale_range,
        )

    def to(self, device: torch.device | str) -> QuantizedTensor:
        """The same codes and scales on another device (cached float32 copies are not moved)."""
        device = torch.device(device)
        if self.data.device == device:
            return self

        def move(t):
            return None if t is None else t.to(device)

        return QuantizedTensor(move(self.data), move(self.scale), self.fmt, self.granularity, self.scale_rule,
                               self.scale_fmt, move(self.tensor_scale), move(self.amax), self.margin,
                               _scale_range=self._scale_range)

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
        if self._scaled is not None:  # the same products, made by the quantize kernel
            out = self._scaled
            return (out * self.tensor_scale if self.tensor_scale is not None else out.clone()).reshape(self.shape)
        data = self.values()
        if self.scale.dim() == 0:
            out = data * self.scale
        else:
            d2 = as_2d(data, self.granularity)
            blocks = padded_blocks(d2, self.block_shape)  # (MB, r, KB, c)
            out = blocks * self.scale[:, None, :, None]
            m, k = d2.shape
            out = out.reshape(blocks.shape[0] * blocks.shape[1], -1)[:m, :k]
        if self.tensor_scale is not None:
            out = out * self.tensor_scale
        return out.reshape(self.shape)

    def codes(self) -> torch.Tensor:
        """The element codes as uint8 (E2M1: 4-bit codes 0..15, sign in bit 3)."""
        if self.fmt is E2M1:
            return _E2M1_FROM_E4M3_BYTE.to(self.data.device)[self.data.view(torch.uint8).long()]
        return self.data.view(torch.uint8)

    def scale_codes(self) -> torch.Tensor:
        """The block scales in their own format's codes (E8M0 / E4M3), as uint8."""
        if self.scale_fmt is None:
            raise ValueError("these scales are float32; they have no 8-bit codes")
        return self.scale.to(self.scale_fmt.storage_dtype).view(torch.uint8)

    def packed(self) -> torch.Tensor:
        """E2M1 data packed two per byte (torch.float4_e2m1fn_x2, low nibble first), for kernels."""
        if self.fmt is not E2M1:
            raise ValueError(f"only E2M1 data is packed; this is {self.fmt.name}")
        codes = self.codes()
        if codes.shape[-1] % 2:
            raise ValueError("packing needs an even last dimension")
        pairs = codes.reshape(*codes.shape[:-1], -1, 2)
        return (pairs[..., 0] | (pairs[..., 1] << 4)).view(torch.float4_e2m1fn_x2)

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
_E2M1_FROM_E4M3_BYTE = _e2m1_codes(torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float())


# ---- the scale-and-cast loop ------------------------------------------------------------------------


def _scale_and_cast(
    blocks: torch.Tensor, inverse: torch.Tensor, fmt: FloatFormat, out: torch.Tensor
) -> None:
    """out[...] = cast(blocks * inverse, fmt), in cache-sized chunks of block rows.

    blocks: (MB, r, KB, c) float32; inverse: (MB, 1, KB, 1) or a 0-d tensor;
    out: same shape as blocks, dtype fmt.storage_dtype. Saturation is explicit (clamp to
    +-max) because torch's casts don't all saturate (E5M2 doesn't; E4M3 doesn't before
    torch 2.12). Where torch has no cast for fmt (E2M1), the reference cast runs instead.
    """
    mb = blocks.shape[0]
    per_row = max(blocks[0].numel(), 1)
    # chunks keep the float32 temporary in the CPU's cache; a GPU does it in one pass
    step = max(1, _CHUNK_ELEMENTS // per_row) if blocks.device.type == "cpu" else mb
    native = fmt.torch_dtype is not None and fmt.torch_dtype == fmt.storage_dtype
    buf = torch.empty((min(step, mb), *blocks.shape[1:]), dtype=torch.float32, device=blocks.device)
    for start in range(0, mb, step):
        stop = min(start + step, mb)
        tmp = buf[: stop - start]
        inv = inverse if inverse.dim() == 0 else inverse[start:stop]
        torch.mul(blocks[start:stop], inv, out=tmp)
        tmp.clamp_(-fmt.max_value, fmt.max_value)  # NaN passes through
        if native:
            out[start:stop].copy_(tmp)  # torch's float32 -> fp8 cast: nearest even
        else:
            out[start:stop].copy_(cast(tmp, fmt))


# ---- quantize -------------------------------------------------------------------------------------------


def _check_no_inf(block_amax: torch.Tensor, x: torch.Tensor) -> None:
    # the block amaxes are computed anyway: an infinite element shows up there as inf
    if torch.isinf(block_amax).any():
        _refuse_inf(x)


def _refuse_inf(x: torch.Tensor) -> None:
    n = int(torch.isinf(x).sum())
    raise ValueError(
        f"x has {n} infinite value(s): a scale needs a finite amax. fp8lab does not guess "
        "here; replace them first (e.g. torch.nan_to_num(x, posinf=..., neginf=...)) or "
        "find where they came from. (NaN is allowed and propagates to its block.)"
    )


@dataclass(frozen=True)
class QuantizeSpec:
    """quantize()'s settings, checked: what every call with them shares.

    kernel_rule / kernel_args: how fp8lab.kernels.quantize computes these scales (its rule
    name and (max_eff, exponent range) or (max_eff,)); None where the kernels don't store
    this format. TensorScaling (recipes.py) keeps one, so a training step checks nothing twice.
    """

    fmt: FloatFormat
    granularity: Granularity
    scale_rule: str
    margin: int
    scale_fmt: FloatFormat | None
    two_level: bool
    kernel_rule: str | None
    kernel_args: tuple


def quantize_spec(
    fmt: FloatFormat | str = E4M3,
    granularity: Granularity | str = PerTensor(),
    scale_rule: str = "exact",
    margin: int = 0,
    scale_fmt: FloatFormat | str | None = None,
    two_level: bool = False,
) -> QuantizeSpec:
    """quantize()'s arguments checked once (a clear error names the valid choices)."""
    try:
        return _spec_cached(fmt, granularity, scale_rule, margin, scale_fmt, two_level)
    except TypeError:  # an unhashable argument: check it uncached, for the error that explains it
        return _spec_cached.__wrapped__(fmt, granularity, scale_rule, margin, scale_fmt, two_level)


@lru_cache(maxsize=256)
def _spec_cached(fmt, granularity, scale_rule, margin, scale_fmt, two_level) -> QuantizeSpec:
    fmt = get_format(fmt)
    granularity = parse_granularity(granularity)
    if fmt is E8M0:
        raise ValueError("E8M0 is a scale-only format (no sign, no zero); quantize elements to e4m3, e5m2 or e2m1")
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"unknown scale_rule {scale_rule!r}; valid rules: {', '.join(SCALE_RULES)}")
    if scale_fmt is not None:
        scale_fmt = get_format(scale_fmt)
        if scale_fmt not in (E8M0, E4M3):
            raise ValueError(f"scale_fmt must be None (float32), 'e8m0' or 'e4m3', got {scale_fmt.name}")
    if two_level and scale_fmt is not E4M3:
        raise ValueError("two_level scaling is NVFP4's: it needs scale_fmt='e4m3'")
    if scale_fmt is E4M3 and scale_rule != "exact":
        raise ValueError("E4M3 block scales are rounded from exact scales: use scale_rule='exact'")
    check_margin(margin)
    if scale_fmt is E4M3:
        rule, args = ("e4m3 two-level" if two_level else "e4m3"), (fmt.max_value / 2**margin,)
    else:
        rule, args = scale_rule, check_scale_args(fmt, scale_rule, margin, scale_fmt)[1:]
    if fmt.storage_dtype not in kernels.STORAGE:
        rule, args = None, ()
    return QuantizeSpec(fmt, granularity, scale_rule, margin, scale_fmt, bool(two_level), rule, args)


def quantize(
    x: torch.Tensor,
    fmt: FloatFormat | str = E4M3,
    granularity: Granularity | str = PerTensor(),
    scale_rule: str = "exact",
    margin: int = 0,
    *,
    scale_fmt: FloatFormat | str | None = None,
    two_level: bool = False,
    amax: torch.Tensor | float | None = None,
) -> QuantizedTensor:
    """Quantize x to `fmt` with one scale per block of `granularity`.

    x[M, K] -> QuantizedTensor(data[M, K], scale[ceil(M/rows), ceil(K/cols)]), where
    scale = amax / (fmt.max_value / 2**margin) for "exact" (see scale_from_amax for
    "rceil" and "floor") and data = cast(x / scale, fmt), saturating at +-max_value.

    scale_fmt  None: float32 scales. E8M0: power-of-two scales (MX). E4M3: scales rounded
               to E4M3 (NVFP4), with two_level=True adding a per-tensor float32 scale
               amax / (448 * fmt.max_value) so the E4M3 block scales use their whole range.
    amax       use this amax instead of x's own: a scalar for per-tensor scaling (delayed
               scaling), or one per block, shaped like the scale (amaxes reduced across
               data-parallel ranks, fp8lab.distributed). Values beyond it clip, and
               metrics.overflow_fraction shows how many.
    NaN in x makes its block NaN (NaN propagates); an infinite value raises ValueError.
    Per-row and per-block need a 2-D x (reshape batches to (-1, K)).
    """
    return quantize_with(x, quantize_spec(fmt, granularity, scale_rule, margin, scale_fmt, two_level), amax)


def quantize_with(x: torch.Tensor, spec: QuantizeSpec, amax: torch.Tensor | float | None = None) -> QuantizedTensor:
    """quantize(x, ...) with its settings checked beforehand (quantize_spec)."""
    _check_float(x)
    fmt, granularity, scale_rule, margin, scale_fmt = (
        spec.fmt, spec.granularity, spec.scale_rule, spec.margin, spec.scale_fmt)
    x32 = x.detach() if x.dtype == torch.float32 else x.detach().to(torch.float32)
    x2d = as_2d(x32, granularity)
    if x2d.numel() == 0:
        raise ValueError("cannot quantize an empty tensor")
    use_kernels = x2d.device.type == "cpu" and kernels.enabled()
    if use_kernels:
        x2d = x2d.contiguous()  # the kernels read rows in place (a no-op for most callers)
    block = granularity.block_shape(tuple(x2d.shape))

    if amax is None and spec.kernel_rule is not None and use_kernels:
        # everything below in one call (fp8lab.kernels)
        fold = _folds(granularity, block, x2d.shape)
        fused = kernels.quantize(x2d, block, fmt, spec.kernel_rule, *spec.kernel_args, fold=fold)
        if fused is None:
            _refuse_inf(x2d)  # the kernel found an infinite amax
        data, values, scale, _, block_amax, tensor_scale, scale_range = fused
        return _quantized(data if x.dim() == 2 else data.reshape(x.shape), scale, spec, tensor_scale, block_amax,
                          values, fold, scale_range)

    if amax is None:
        block_amax = amax_per_block(x2d, granularity)
        _check_no_inf(block_amax, x2d)
    else:
        own = amax_per_block(x2d, granularity)  # (MB, KB)
        _check_no_inf(own, x2d)
        block_amax = torch.as_tensor(amax, dtype=torch.float32, device=x.device)
        if block_amax.numel() != own.numel():
            raise ValueError(
                f"amax has {block_amax.numel()} value(s) but {granularity.label} scaling of shape "
                f"{tuple(x2d.shape)} has {own.numel()} block(s): pass one amax per block, shaped {tuple(own.shape)} "
                "(a single amax is for per-tensor scaling, as in delayed scaling)"
            )
        block_amax = block_amax.reshape(own.shape)

    tensor_scale = None
    if scale_fmt is E4M3:  # NVFP4-style: E4M3 block scales, optionally under a tensor scale
        ideal = block_amax / (fmt.max_value / 2**margin)  # (MB, KB) float32
        if spec.two_level:
            tensor_amax = block_amax.amax()
            tensor_scale = torch.where(tensor_amax > 0, tensor_amax / (E4M3.max_value * fmt.max_value), 1.0)
            ideal = ideal / tensor_scale
        scale = cast_scale_e4m3(ideal)
        scale = torch.where(torch.isnan(block_amax), math.nan, scale)
        # inverse as torchao's NVFP4 (and the MSLK kernel): (1 / tensor_scale) / block scale
        inverse = (1.0 / tensor_scale if spec.two_level else torch.ones((), device=x.device)) / scale
    else:
        scale, inverse = scale_from_amax(block_amax, fmt, scale_rule, margin, scale_fmt)

    m, k = x2d.shape
    if use_kernels and spec.kernel_rule is not None:
        # the same codes, and their float32 values, in one pass (fp8lab.kernels)
        fold = _folds(granularity, block, x2d.shape)
        data, values = kernels.scale_cast(x2d, block, inverse, fmt, fmt.storage_dtype, fold=scale if fold else None)
        return _quantized(data.reshape(x.shape), scale, spec, tensor_scale, block_amax, values, fold)
    if isinstance(granularity, PerTensor):
        # one scale: any layout will do, so cut x into rows that chunk well
        width = 1024 if x2d.numel() % 1024 == 0 else k
        blocks = x2d.reshape(-1, 1, 1, width)  # (rows, 1, 1, width)
        inv = inverse.reshape(())
    else:
        blocks = padded_blocks(x2d, block)  # (MB, r, KB, c)
        inv = inverse[:, None, :, None]  # (MB, 1, KB, 1)
    out = torch.empty(blocks.shape, dtype=fmt.storage_dtype, device=x.device)
    _scale_and_cast(blocks, inv, fmt, out)
    data = out.reshape(blocks.shape[0] * blocks.shape[1], -1)
    if data.shape != (m, k) and not isinstance(granularity, PerTensor):
        data = data[:m, :k].contiguous()
    return _quantized(data.reshape(x.shape), scale, spec, tensor_scale, block_amax)


def _folds(granularity: Granularity, block: tuple[int, int], shape: tuple[int, int]) -> bool:
    """Whether the kernel writes values * block scale instead of the values: for blocks
    smaller than the tensor both ways, whose scales vary along either dim a GEMM may
    contract (1x32 along K, or 32x1 read transposed). A block spanning all rows or all
    columns has one scale per row or column, which a GEMM applies to its output instead."""
    return isinstance(granularity, PerBlock) and block[0] < shape[0] and block[1] < shape[1]


def _quantized(data, scale, spec: QuantizeSpec, tensor_scale, block_amax, values=None, folded=False,
               scale_range=None) -> QuantizedTensor:
    if isinstance(spec.granularity, PerTensor):
        scale, block_amax = scale.reshape(()), block_amax.reshape(())
    if values is not None and data.dim() != 2:
        values = values.reshape(data.shape)
    return QuantizedTensor(
        data, scale, spec.fmt, spec.granularity, spec.scale_rule, spec.scale_fmt, tensor_scale, block_amax,
        spec.margin, None if folded else values, values if folded else None, scale_range,
    )


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
