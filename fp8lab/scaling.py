"""Which elements share a scale (granularity), and how a scale is chosen (scale rules).

Public: PerTensor, PerRow, PerBlock(rows, cols), parse_granularity, amax_per_block,
scale_from_amax, SCALE_RULES, AmaxHistory (delayed scaling).
Shapes: x[M, K] -> amax[ceil(M/rows), ceil(K/cols)]; PerRow is PerBlock(1, K) and
PerTensor is PerBlock(M, K). `scale` is the dequantization multiplier: x ~= q * scale.
Notebooks 02 (per tensor), 03 (delayed) and 04 (per block) introduce this file.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from fp8lab import kernels
from fp8lab.formats import E4M3, E8M0, FloatFormat, cast, get_format

__all__ = [
    "SCALE_RULES",
    "AmaxHistory",
    "Granularity",
    "PerBlock",
    "PerRow",
    "PerTensor",
    "amax_per_block",
    "as_2d",
    "parse_granularity",
    "scale_from_amax",
]

ScaleRule = Literal["exact", "rceil", "floor"]
SCALE_RULES: tuple[str, ...] = ("exact", "rceil", "floor")


# ---- granularity ---------------------------------------------------------------------------


class Granularity:
    """Which region of x[M, K] shares one scale. Subclasses are frozen dataclasses."""

    def block_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        """(rows, cols) of one block for a 2-D tensor of `shape`."""
        raise NotImplementedError

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the scale tensor fp8lab returns for a tensor of `shape`."""
        rows, cols = self.block_shape(_shape_2d(shape))
        m, k = _shape_2d(shape)
        return (math.ceil(m / rows), math.ceil(k / cols))

    @property
    def label(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True)
class PerTensor(Granularity):
    """One scale for the whole tensor: x[...] -> scale[] (a 0-d tensor)."""

    def block_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        return (max(shape[0], 1), max(shape[1], 1))

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return ()

    @property
    def label(self) -> str:
        return "per-tensor"


@dataclass(frozen=True)
class PerRow(Granularity):
    """One scale per row: x[M, K] -> scale[M, 1] (each row's amax over K)."""

    def block_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        return (1, max(shape[1], 1))

    @property
    def label(self) -> str:
        return "per-row"


@dataclass(frozen=True)
class PerBlock(Granularity):
    """One scale per rows x cols tile: x[M, K] -> scale[ceil(M/rows), ceil(K/cols)].

    Examples: PerBlock(1, 128) is DeepSeek-V3's activation tile, PerBlock(128, 128) its
    weight block, PerBlock(1, 32) the MX block, PerBlock(1, 16) the NVFP4 block. Shapes
    that do not divide are padded with zeros internally (zeros never change an amax).
    """

    rows: int
    cols: int

    def __post_init__(self) -> None:
        for name in ("rows", "cols"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"PerBlock {name} must be a positive integer, got {v!r}")

    def block_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def label(self) -> str:
        return f"{self.rows}x{self.cols}"


def parse_granularity(spec: Granularity | str) -> Granularity:
    """A Granularity from itself or a label: 'per-tensor', 'per-row', '1x128', '128x128', ..."""
    if isinstance(spec, Granularity):
        return spec
    if isinstance(spec, str):
        s = spec.strip().lower().replace("_", "-").replace(" ", "")
        if s in ("per-tensor", "tensor", "tensorwise"):
            return PerTensor()
        if s in ("per-row", "row", "rowwise"):
            return PerRow()
        parts = s.split("x")
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            return PerBlock(int(parts[0]), int(parts[1]))
    raise ValueError(
        f"unknown granularity {spec!r}; use PerTensor(), PerRow(), PerBlock(rows, cols) "
        "or a label: 'per-tensor', 'per-row', 'ROWSxCOLS' (e.g. '1x128', '128x128', '1x32')"
    )


# ---- shapes -----------------------------------------------------------------------------------


def _shape_2d(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 0:
        return (1, 1)
    if len(shape) == 1:
        return (1, shape[0])
    if len(shape) == 2:
        return (shape[0], shape[1])
    return (math.prod(shape[:-1]), shape[-1])


def as_2d(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """View x as the 2-D [M, K] the granularity talks about, or explain what to reshape.

    Per-tensor scaling accepts any shape (flattened to rows of its last dim). Per-row and
    per-block need a 2-D tensor: a batch of activations x[B, T, K] is x.reshape(-1, K).
    """
    if x.dim() == 2:
        return x
    if isinstance(granularity, PerTensor):
        return x.reshape(_shape_2d(tuple(x.shape)))
    if x.dim() < 2:
        raise ValueError(
            f"{granularity.label} scaling needs a 2-D tensor [M, K], got shape {tuple(x.shape)}; "
            "use x.reshape(1, -1) for a single row"
        )
    raise ValueError(
        f"{granularity.label} scaling needs a 2-D tensor [M, K], got {x.dim()}-D shape "
        f"{tuple(x.shape)}; reshape it with x.reshape(-1, {x.shape[-1]}) so that the "
        "reduced (K) dimension is last"
    )


def padded_blocks(x2d: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """x[M, K] as a 4-D view (MB, rows, KB, cols), zero-padded when the block doesn't divide."""
    m, k = x2d.shape
    r, c = block
    mb, kb = math.ceil(m / r), math.ceil(k / c)
    if (mb * r, kb * c) != (m, k):
        x2d = F.pad(x2d, (0, kb * c - k, 0, mb * r - m))
    return x2d.reshape(mb, r, kb, c)  # (M/r, r, K/c, c)


# ---- amax ---------------------------------------------------------------------------------------


def amax_per_block(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """max|x| over each block: x[M, K] -> amax[ceil(M/rows), ceil(K/cols)], float32.

    A NaN anywhere in a block makes that block's amax NaN (NaN propagates).
    """
    x2d = as_2d(x, granularity)
    if x2d.numel() == 0:
        raise ValueError("cannot scale an empty tensor")
    r, c = granularity.block_shape(tuple(x2d.shape))
    if kernels.enabled(x2d):  # the same max in one vectorized pass (fp8lab.kernels)
        return kernels.block_amax(x2d, (r, c))
    blocks = padded_blocks(x2d, (r, c))  # (MB, r, KB, c)
    # max(-min, max) reads x twice but never materialises |x|; reduce the contiguous
    # cols first, then the rows of each block, which is much faster than one strided pass
    hi = blocks.amax(dim=3)  # (MB, r, KB)
    lo = blocks.amin(dim=3)
    amax = torch.maximum(hi, lo.neg())
    if r > 1:
        amax = amax.amax(dim=1)  # (MB, KB)
    else:
        amax = amax.squeeze(1)
    # torch.maximum/amax propagate NaN, as wanted
    return amax.to(torch.float32)


# ---- scale rules ---------------------------------------------------------------------------------


def _pow2_exponent_range(scale_fmt: FloatFormat | None) -> tuple[int, int]:
    # the exponents e for which both 2^e (the scale) and 2^-e (its inverse) are finite in
    # float32; an E8M0 scale can also be 2^-127 (a float32 subnormal, whose inverse is fine)
    if scale_fmt is E8M0:
        return (-127, 127)
    return (-126, 127)


def check_margin(margin: int) -> None:
    """A margin is a non-negative int: 2**margin of headroom below the format's max."""
    if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
        raise ValueError(f"margin must be a non-negative integer (a power of two of headroom), got {margin!r}")


def check_scale_args(
    fmt: FloatFormat | str, scale_rule: str, margin: int, scale_fmt: FloatFormat | str | None
) -> tuple[FloatFormat, float, tuple[int, int]]:
    """scale_from_amax's arguments checked: (fmt, max_eff, exponent range of power-of-two scales)."""
    fmt = get_format(fmt)
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"unknown scale_rule {scale_rule!r}; valid rules: {', '.join(SCALE_RULES)}")
    check_margin(margin)
    if scale_fmt is not None:
        scale_fmt = get_format(scale_fmt)
        if scale_fmt is not E8M0:
            raise ValueError(
                f"scale_from_amax makes float32 or E8M0 scales, not {scale_fmt.name}; "
                "E4M3 block scales are NVFP4's: use quantize(..., scale_fmt=E4M3)"
            )
        if scale_rule == "exact":
            raise ValueError("E8M0 scales are powers of two: use scale_rule 'rceil' or 'floor', not 'exact'")
    return fmt, fmt.max_value / 2**margin, _pow2_exponent_range(scale_fmt)


def scale_from_amax(
    amax: torch.Tensor,
    fmt: FloatFormat | str = E4M3,
    scale_rule: str = "exact",
    margin: int = 0,
    scale_fmt: FloatFormat | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scales for blocks with these amaxes: returns (scale, inverse), both float32.

    scale is the dequantization multiplier; data = cast(x * inverse, fmt). With
    max = fmt.max_value / 2**margin:
      "exact"  scale = amax / max. inverse = float32(max / amax) computed in float64, as
               torchao does, and scale = float32(1 / inverse): so scale * inverse == 1 to
               float32 rounding and the codes match torchao's bit for bit.
      "rceil"  scale = 2**ceil(log2(amax / max))   a power of two rounded up: never clips
      "floor"  scale = 2**(floor(log2(amax)) - floor(log2(max)))   the OCP MX rule: the
               block max can land up to 2x beyond max and clip (saturate)
    An all-zero block (amax 0) gets scale 1. A NaN amax gives a NaN scale (the block
    dequantizes to NaN). scale_fmt: None (float32 scales) or E8M0 (powers of two in
    2^-127..2^127, "rceil" or "floor" only). E4M3 block scales (NVFP4) are made in quantize.
    """
    fmt, max_eff, exponent_range = check_scale_args(fmt, scale_rule, margin, scale_fmt)
    amax = amax.to(torch.float32)
    if kernels.enabled(amax):  # the arithmetic below, in one pass (fp8lab.kernels)
        return kernels.scales(amax, scale_rule, max_eff, exponent_range)
    zero = amax == 0

    if scale_rule == "exact":
        # inverse = max / amax in float64, as torchao; an amax so small that this overflows
        # float32 is treated as float32's largest inverse
        inverse = (max_eff / amax.double()).clamp(max=torch.finfo(torch.float32).max).to(torch.float32)
        inverse = torch.where(zero, 1.0, inverse)
        return inverse.reciprocal(), inverse

    # power-of-two rules, on exact exponents: amax = mant * 2**exp with mant in [0.5, 1)
    mant, exp = torch.frexp(amax)
    log2_floor_amax = exp - 1  # floor(log2(amax)), exact
    if scale_rule == "floor":
        e = log2_floor_amax - math.floor(math.log2(max_eff))
    else:  # rceil: ceil(log2(amax / max_eff)), exact from the two mantissas
        max_mant, max_exp = math.frexp(max_eff)
        e = exp - max_exp + (mant > max_mant).to(exp.dtype)
    lo, hi = _pow2_exponent_range(scale_fmt)
    e = e.clamp(lo, hi).to(torch.float32)
    scale = torch.where(zero, 1.0, torch.exp2(e))
    inverse = torch.where(zero, 1.0, torch.exp2(-e))
    nan = torch.isnan(amax)
    scale = torch.where(nan, math.nan, scale)
    inverse = torch.where(nan, math.nan, inverse)
    return scale, inverse


def cast_scale_e4m3(scale: torch.Tensor) -> torch.Tensor:
    """Round float32 block scales to E4M3 (NVFP4's block scales), kept above E4M3's min normal."""
    return cast(scale.clamp(min=E4M3.min_normal, max=E4M3.max_value), E4M3)


# ---- delayed scaling -------------------------------------------------------------------------------


class AmaxHistory:
    """Delayed scaling: the scale for this step comes from the amaxes of past steps.

    TransformerEngine's DelayedScaling: keep the last `length` amaxes; this step's scale
    uses their max ("max") or the latest ("most_recent"); after quantizing, record this
    step's amax. A sudden spike larger than everything in the history overflows (clips)
    on the step it arrives, and the history catches up on the next.

    The first step, with an empty history, uses the current amax (TE starts from scale 1
    instead; fp8lab calibrates on the first step so that step one is not an artefact).

        hist = AmaxHistory(length=16, algo="max")
        amax = hist.amax_for_step(x)   # before quantizing
        q = quantize(x, E4M3, amax=amax)
        hist.record(x)                 # after; or use fp8lab.quantize_delayed(x, hist)
    """

    ALGOS = ("max", "most_recent")

    def __init__(self, length: int = 16, algo: str = "max") -> None:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"history length must be a positive integer, got {length!r}")
        if algo not in self.ALGOS:
            raise ValueError(f"unknown amax algo {algo!r}; valid: {', '.join(self.ALGOS)}")
        self.length = length
        self.algo = algo
        self._history: deque[float] = deque(maxlen=length)

    @property
    def history(self) -> list[float]:
        """The recorded amaxes, oldest first."""
        return list(self._history)

    def __len__(self) -> int:
        return len(self._history)

    def amax(self) -> float | None:
        """The amax this step's scale will use, or None before the first record."""
        if not self._history:
            return None
        return max(self._history) if self.algo == "max" else self._history[-1]

    def amax_for_step(self, x: torch.Tensor) -> torch.Tensor:
        """The amax to quantize x with: from the history, or x's own on the first step."""
        past = self.amax()
        if past is None:
            return amax_per_block(x, PerTensor()).reshape(())
        return torch.tensor(past, dtype=torch.float32, device=x.device)

    def record(self, x_or_amax: torch.Tensor | float) -> None:
        """Append this step's amax (pass the tensor, or its amax)."""
        if isinstance(x_or_amax, torch.Tensor) and x_or_amax.numel() > 1:
            value = float(amax_per_block(x_or_amax, PerTensor()).max())
        else:
            value = float(x_or_amax)
        self._history.append(value)

    def reset(self) -> None:
        self._history.clear()

    def replay(self, amaxes: list[float]) -> list[float]:
        """The amax each step of a sequence would be scaled with (a fresh history of this
        length and algo; the first step calibrates on its own amax). Leaves self unchanged."""
        hist = AmaxHistory(self.length, self.algo)
        used = []
        for a in amaxes:
            past = hist.amax()
            used.append(a if past is None else past)
            hist.record(a)
        return used

    def __repr__(self) -> str:
        return f"AmaxHistory(length={self.length}, algo={self.algo!r}, recorded={len(self)})"
