"""How a scale is chosen: a tensor's scaling settings (TensorScaling), amax per block, the scale rules.

Public: TensorScaling (one frozen type for every setting: format, granularity, scale rule, margin, scale
format, two-level, rounding, Hadamard transform, scale floor; checked once), amax_per_block, scale_from_amax
(every scale rule, NVFP4's E4M3 block scales and tensor scale included), Scales, SCALE_RULES, SCALE_FLOORS,
AmaxHistory (delayed scaling); the granularity types, re-exported from granularity.py.
x[M, K] -> amax[ceil(M/rows), ceil(K/cols)]; `scale` is the dequantization multiplier: x ~= q * scale.
Notebooks 02 (per tensor), 03 (delayed) and 04 (per block) introduce this file.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Literal, NamedTuple

import torch

from fp8lab.numerics.formats import E4M3, E8M0, FloatFormat, cast, check_rounding, get_format
from fp8lab.numerics.granularity import (
    MAX_BLOCK,
    Granularity,
    PerBlock,
    PerRow,
    PerTensor,
    as_2d,
    padded_blocks,
    parse_granularity,
)
from fp8lab.numerics.hadamard import RandomHadamard

__all__ = [
    "MAX_BLOCK",
    "SCALE_FLOORS",
    "SCALE_RULES",
    "AmaxHistory",
    "Granularity",
    "PerBlock",
    "PerRow",
    "PerTensor",
    "Scales",
    "TensorScaling",
    "amax_per_block",
    "as_2d",
    "padded_blocks",
    "parse_granularity",
    "scale_from_amax",
]

ScaleRule = Literal["exact", "rceil", "floor"]
SCALE_RULES: tuple[str, ...] = ("exact", "rceil", "floor")

# Where E4M3 block scales (NVFP4) stop at the bottom, and the engine each floor belongs to. A block
# needing a smaller scale gets the floor: its small values flush (a scale of 0 holds nothing).
SCALE_FLOORS: dict[str, str] = {
    "zero": "no lower clamp: E4M3's subnormal scales (down to 2^-9), 0 below them; the training engines "
            "(TransformerEngine's NVFP4 quantizer, torchao's NVFP4 training path)",
    "min_normal": "clamped at E4M3's smallest normal, 2^-6; torchao's NVFP4Tensor (inference, nvfp4_tensor.py)",
}


# ---- amax ---------------------------------------------------------------------------------------


def amax_per_block(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """max|x| over each block: x[M, K] -> amax[ceil(M/rows), ceil(K/cols)], float32.

    A NaN anywhere in a block makes that block's amax NaN (NaN propagates).
    """
    x2d = as_2d(x, granularity)
    if x2d.numel() == 0:
        raise ValueError("cannot scale an empty tensor")
    r, c = granularity.block_shape(tuple(x2d.shape))
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
    # torch.maximum/amax propagate NaN, as wanted; abs: a block of -0s has amax +0 (max|x|), not -0
    return amax.to(torch.float32).abs()


# ---- scale rules ---------------------------------------------------------------------------------

_FLOAT32 = torch.finfo(torch.float32)


def _largest_margin(fmt: FloatFormat) -> int:
    # beyond this, max_value / 2**margin is below the smallest subnormal: every value, the
    # block's largest included, would flush to zero
    return math.floor(math.log2(fmt.max_value / fmt.min_subnormal))

@dataclass(frozen=True)
class TensorScaling:
    """How one tensor (a GEMM operand, in its [rows, contraction] layout) is quantized: every setting, checked once.

    fmt          the element format (e4m3, e5m2, e2m1; not E8M0, a scale-only format)
    granularity  which region shares a scale: PerTensor(), PerRow(), PerBlock(rows, cols) or a label ('1x128')
    scale_rule   one of SCALE_RULES ("exact", "rceil", "floor"; scale_from_amax has the formulas)
    scale_fmt    None (float32 scales), E8M0 (power-of-two scales, "rceil" or "floor": MX) or E4M3 (NVFP4's
                 block scales, rounded from "exact" scales)
    two_level    a per-tensor float32 scale above E4M3 block scales (NVFP4; needs scale_fmt E4M3)
    margin       powers of two of headroom: the largest code is fmt.max_value / 2**margin, an integer from 0 to
                 the format's range (e4m3: 17, e5m2: 31, e2m1: 3; beyond it every value would flush to zero)
    rounding     "nearest" (ties to even) or "stochastic" (formats.ROUNDINGS)
    hadamard     a RandomHadamard applied along the contraction before scaling (transform), or None
    scale_floor  where E4M3 block scales stop at the bottom, one of SCALE_FLOORS: "zero" (the default, the
                 training engines) or "min_normal" (2^-6: torchao's inference NVFP4Tensor); "zero" only for
                 other scale formats
    Frozen and checked in __post_init__ (a clear error names the valid choices): whatever takes one trusts it.
    The constants scale_from_amax's formulas use (max_eff, floor, exponent_range, ...) are properties of it.
    """

    fmt: FloatFormat = E4M3
    granularity: Granularity = PerTensor()  # noqa: RUF009 (frozen: one shared default is safe)
    scale_rule: str = "exact"
    scale_fmt: FloatFormat | None = None
    two_level: bool = False
    margin: int = 0
    rounding: str = "nearest"
    hadamard: RandomHadamard | None = None
    scale_floor: str = "zero"

    def __post_init__(self) -> None:
        fmt = get_format(self.fmt)
        object.__setattr__(self, "fmt", fmt)
        object.__setattr__(self, "granularity", parse_granularity(self.granularity))
        scale_rule, margin, scale_fmt, scale_floor = self.scale_rule, self.margin, self.scale_fmt, self.scale_floor
        if fmt == E8M0:
            raise ValueError("E8M0 is a scale-only format (no sign, no zero); quantize elements to e4m3, e5m2 or e2m1")
        if scale_rule not in SCALE_RULES:
            raise ValueError(f"unknown scale_rule {scale_rule!r}; valid rules: {', '.join(SCALE_RULES)}")
        if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
            raise ValueError(f"margin must be a non-negative integer (a power of two of headroom), got {margin!r}")
        if margin > _largest_margin(fmt):
            raise ValueError(
                f"margin {margin} leaves {fmt.name} nothing: {fmt.max_value:g} / 2**{margin} is below its smallest "
                f"value {fmt.min_subnormal:g}, so every value would flush to zero; use a margin of 0 to "
                f"{_largest_margin(fmt)} for {fmt.name}")
        if scale_fmt is not None:
            scale_fmt = get_format(scale_fmt)
            if scale_fmt not in (E8M0, E4M3):
                raise ValueError(f"scale_fmt must be None (float32), 'e8m0' or 'e4m3', got {scale_fmt.name}")
            object.__setattr__(self, "scale_fmt", scale_fmt)
        if scale_fmt == E8M0 and scale_rule == "exact":
            raise ValueError("E8M0 scales are powers of two: use scale_rule 'rceil' or 'floor', not 'exact'")
        if scale_fmt == E4M3 and scale_rule != "exact":
            raise ValueError("E4M3 block scales are rounded from exact scales: use scale_rule='exact'")
        if self.two_level and scale_fmt != E4M3:
            raise ValueError("two_level scaling is NVFP4's: it needs scale_fmt='e4m3'")
        object.__setattr__(self, "two_level", bool(self.two_level))
        if not isinstance(scale_floor, str) or scale_floor not in SCALE_FLOORS:
            raise ValueError(f"unknown scale_floor {scale_floor!r}; valid: "
                             + "; ".join(f"{k!r} ({v})" for k, v in SCALE_FLOORS.items()))
        if scale_floor != "zero" and scale_fmt != E4M3:
            raise ValueError(f"scale_floor {scale_floor!r} is for E4M3 block scales (NVFP4, scale_fmt='e4m3'); "
                             f"{'float32' if scale_fmt is None else scale_fmt.name} scales take the default, 'zero'")
        check_rounding(fmt, self.rounding)
        if self.hadamard is not None and not isinstance(self.hadamard, RandomHadamard):
            raise TypeError(f"hadamard must be a RandomHadamard or None, got {type(self.hadamard).__name__}")

    @property
    def powers_of_two(self) -> bool:
        """Whether every scale is a power of two (rules "rceil" and "floor"; 1 for an all-zero block, NaN for a
        NaN one): multiplying by one is exact while the product stays normal."""
        return self.scale_rule != "exact"

    # ---- the constants scale_from_amax's formulas use (pure functions of the fields) ----
    @cached_property
    def max_eff(self) -> float:
        """The largest value the block's amax maps to: fmt.max_value / 2**margin."""
        return self.fmt.max_value / 2**self.margin

    @cached_property
    def floor(self) -> float:
        """The smallest E4M3 block scale before rounding: 0 ("zero") or E4M3's smallest normal ("min_normal")."""
        return self.scale_fmt.min_normal if self.scale_floor == "min_normal" and self.scale_fmt else 0.0

    @cached_property
    def smallest_scale(self) -> float:
        """The smallest nonzero E4M3 block scale: E4M3's smallest subnormal ("zero") or smallest normal."""
        if self.scale_fmt is None:
            return 0.0
        return self.scale_fmt.min_normal if self.scale_floor == "min_normal" else self.scale_fmt.min_subnormal

    @cached_property
    def exponent_range(self) -> tuple[int, int]:
        """The exponents e of power-of-two scales 2^e: both 2^e and 2^-e finite in float32; an
        E8M0 scale can also be 2^-127 (a float32 subnormal, whose inverse is fine)."""
        if self.scale_fmt == E8M0:
            return (-E8M0.bias, E8M0.max_exponent)  # (-127, 127)
        return (round(math.log2(_FLOAT32.tiny)), math.floor(math.log2(_FLOAT32.max)))  # (-126, 127)

    @property
    def min_inverse(self) -> float:
        """"exact": the smallest inverse scale, float32's smallest normal, so that scale = 1 / inverse stays finite."""
        return _FLOAT32.tiny

    @cached_property
    def min_tensor_scale(self) -> float:
        """two_level: the smallest tensor scale, 2^-127 / the smallest nonzero block scale, so that every
        inverse (1 / tensor_scale) / block scale stays finite in float32."""
        return 2.0**-127 / self.smallest_scale if self.scale_fmt is not None else 0.0

    # ---- the operand ----
    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """The operand x[rows, contraction] as its GEMM reads it: hadamard.apply(x) along the
        contraction (float32, padded to a multiple of its size), or x itself without a transform."""
        return x if self.hadamard is None else self.hadamard.apply(x)

    def down_columns(self, rows: int) -> TensorScaling:
        """This scaling restated for x[rows, cols] when the operand is x^T[cols, rows]: the same
        blocks, down x's columns (per row of x^T is one block per column of x, PerBlock(rows, 1);
        a 1x32 block of x^T is a 32x1 block of x). Made once per `rows` and kept on this object."""
        return self.with_granularity(self.granularity.down_columns(rows))

    def with_granularity(self, granularity: Granularity) -> TensorScaling:
        """These settings with another granularity (the same object where it is this one's), made once
        per granularity and kept on this object (a transposed operand asks for its own on every step)."""
        if granularity == self.granularity:
            return self
        cache = self.__dict__.setdefault("_regrained", {})  # per instance (a frozen dataclass's dict)
        if granularity not in cache:
            cache[granularity] = replace(self, granularity=granularity)
        return cache[granularity]

    @property
    def label(self) -> str:
        scale = self.scale_fmt.name if self.scale_fmt else "fp32"
        extra = (" +tensor" if self.two_level else "") + (", floor 2^-6" if self.scale_floor == "min_normal" else "")
        parts = (", stochastic rounding" if self.rounding == "stochastic" else "") + (
            f", after a {self.hadamard.label}" if self.hadamard is not None else "")
        return f"{self.fmt.name} {self.granularity.label} {self.scale_rule} ({scale} scales{extra}){parts}"



class Scales(NamedTuple):
    """scale_from_amax's answer.

    scale:        [blocks] float32, the dequantization multipliers (x ~= data * scale)
    inverse:      [blocks] float32, what x is multiplied by before the cast: 1 / scale to float32
                  rounding (1 / (scale * tensor_scale) for two-level scaling)
    tensor_scale: 0-d float32 for two-level scaling (x ~= data * scale * tensor_scale), else None
    """

    scale: torch.Tensor
    inverse: torch.Tensor
    tensor_scale: torch.Tensor | None


def scale_from_amax(
    amax: torch.Tensor,
    fmt: TensorScaling | FloatFormat | str = E4M3,
    scale_rule: str = "exact",
    margin: int = 0,
    scale_fmt: FloatFormat | str | None = None,
    two_level: bool = False,
    scale_floor: str = "zero",
) -> Scales:
    """The scales for blocks with these amaxes: Scales(scale, inverse, tensor_scale), shaped like amax.

    Every scale rule of fp8lab is here. scale is the dequantization multiplier; data =
    cast(x * inverse, fmt). With max = fmt.max_value / 2**margin:
      "exact"  scale = amax / max. inverse = float32(max / amax) computed in float64, as
               torchao does, and scale = float32(1 / inverse): so scale * inverse == 1 to
               float32 rounding and the codes match torchao's bit for bit. (The inverse is
               kept within float32's normal range: [2^-126, float32 max].)
      "rceil"  scale = 2**ceil(log2(amax / max))   a power of two rounded up: never clips
      "floor"  scale = 2**(floor(log2(amax)) - floor(log2(max)))   the OCP MX rule: the
               block max lands in [2^floor(log2 max), 2^(floor(log2 max) + 1)), for E4M3
               [256, 512): beyond max (448) where amax's mantissa is above 1.75, and clips
               (saturates) there; elsewhere floor's scale is rceil's
    scale_fmt None: float32 scales; E8M0: the power-of-two rules' scales in 2^-127..2^127 (MX);
    E4M3 (NVFP4): the exact scale amax / max (with two_level, first divided by the tensor scale)
    clamped to [floor, 448] and rounded to E4M3, where scale_floor (SCALE_FLOORS) sets the floor:
      "zero"        no lower clamp, as the training engines quantize (TransformerEngine's NVFP4
                    quantizer; torchao's NVFP4 training path, moe_training/nvfp4_training/
                    hadamard_utils.py: "Cap at FP8_E4M3_MAX only, no lower clamp"): a scale
                    below 2^-6 rounds to an E4M3 subnormal (a grid of 2^-9), below 2^-10 to 0;
      "min_normal"  clamped at E4M3's smallest normal 2^-6, as torchao's inference NVFP4Tensor
                    (mx_formats/nvfp4_tensor.py: E4M3_EPS = torch.finfo(torch.float8_e4m3fn).tiny).
    A block whose scale is 0 (all zero, or too small for any E4M3 scale) gets inverse 0 and codes 0:
    it dequantizes to 0 (the engines store saturated codes beside their zero scale: also 0 times the
    scale). Notebook 04's NVFP4 panel shows which blocks each floor catches.
    tensor_scale = max(amax) / (448 * fmt.max_value) (1 for an all-zero tensor, at least
    TensorScaling.min_tensor_scale), so that the E4M3 block scales use their whole range, and
    inverse = (1 / tensor_scale) / scale, as torchao's NVFP4 computes it.
    Other rules: an all-zero block (amax 0) gets scale 1. A NaN amax gives a NaN scale (the block
    dequantizes to NaN).
    """
    args = fmt if isinstance(fmt, TensorScaling) else TensorScaling(
        fmt, scale_rule=scale_rule, scale_fmt=scale_fmt, two_level=two_level, margin=margin, scale_floor=scale_floor)
    fmt, max_eff = args.fmt, args.max_eff
    amax = amax.to(torch.float32)
    zero, nan = amax == 0, torch.isnan(amax)

    if args.scale_fmt == E4M3:  # NVFP4: exact scales rounded to E4M3, optionally under a tensor scale
        ideal = amax / max_eff
        tensor_scale = None
        if args.two_level:
            tensor_amax = amax.amax()
            divisor = args.scale_fmt.max_value * fmt.max_value
            tensor_scale = torch.where(tensor_amax > 0, (tensor_amax / divisor).clamp(min=args.min_tensor_scale), 1.0)
            ideal = ideal / tensor_scale
        scale = cast(ideal.clamp(min=args.floor, max=args.scale_fmt.max_value), args.scale_fmt)
        scale = torch.where(nan, math.nan, scale)
        # inverse as torchao's NVFP4 (and the MSLK kernel): (1 / tensor_scale) / block scale; 0 for a zero scale
        inverse = (1.0 / tensor_scale if args.two_level else torch.ones((), device=amax.device)) / scale
        inverse = torch.where(scale == 0, 0.0, inverse)
        return Scales(scale, inverse, tensor_scale)

    if args.scale_rule == "exact":
        # inverse = max / amax in float64, as torchao; an amax so small (or so large) that this
        # leaves float32's normal range is treated as float32's largest (or smallest) inverse
        inverse = (max_eff / amax.double()).clamp(min=args.min_inverse, max=_FLOAT32.max).to(torch.float32)
        inverse = torch.where(zero, 1.0, inverse)
        return Scales(inverse.reciprocal(), inverse, None)

    # power-of-two rules, on exact exponents: amax = mant * 2**exp with mant in [0.5, 1)
    mant, exp = torch.frexp(amax)
    log2_floor_amax = exp - 1  # floor(log2(amax)), exact
    if args.scale_rule == "floor":
        e = log2_floor_amax - math.floor(math.log2(max_eff))
    else:  # rceil: ceil(log2(amax / max_eff)), exact from the two mantissas
        max_mant, max_exp = math.frexp(max_eff)
        e = exp - max_exp + (mant > max_mant).to(exp.dtype)
    lo, hi = args.exponent_range
    e = e.clamp(lo, hi).to(torch.float32)
    scale = torch.where(zero, 1.0, torch.exp2(e))
    inverse = torch.where(zero, 1.0, torch.exp2(-e))
    scale = torch.where(nan, math.nan, scale)
    inverse = torch.where(nan, math.nan, inverse)
    return Scales(scale, inverse, None)


# ---- delayed scaling -------------------------------------------------------------------------------


class AmaxHistory:
    """Delayed scaling: the scale for this step comes from the amaxes of past steps.

    TransformerEngine's DelayedScaling: keep the last `length` amaxes; this step's scale
    uses their max ("max") or the latest ("most_recent"); after quantizing, record this
    step's amax. A sudden spike larger than everything in the history overflows (clips)
    on the step it arrives, and the history catches up on the next.

    The first step, with an empty history, uses the current amax (TE starts from scale 1
    instead; fp8lab calibrates on the first step so that step one is not an artefact).

    A NaN amax (a NaN in the tensor) propagates, always: while it is in the history, "max"
    gives NaN (every block then dequantizes to NaN, whatever else the history holds), and
    "most_recent" gives NaN on the step after it. Amaxes are >= 0: a negative or infinite one
    is refused with ValueError.

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
        """The amax this step's scale will use, or None before the first record (NaN if a NaN is in play)."""
        if not self._history:
            return None
        if self.algo == "most_recent":
            return self._history[-1]
        # Python's max() keeps or drops a NaN depending on where it stands: NaN must win, always
        return math.nan if any(math.isnan(a) for a in self._history) else max(self._history)

    def amax_for_step(self, x: torch.Tensor) -> torch.Tensor:
        """The amax to quantize x with: from the history, or x's own on the first step."""
        past = self.amax()
        if past is None:
            return amax_per_block(x, PerTensor()).reshape(())
        return torch.tensor(past, dtype=torch.float32, device=x.device)

    def record(self, x_or_amax: torch.Tensor | float) -> None:
        """Append this step's amax (pass the tensor, or its amax: >= 0, or NaN)."""
        if isinstance(x_or_amax, torch.Tensor) and x_or_amax.numel() > 1:
            value = float(amax_per_block(x_or_amax, PerTensor()).max())
            if math.isnan(value) and bool(torch.isinf(x_or_amax).any()):  # a NaN's amax hides an infinity
                value = math.inf
        else:
            value = float(x_or_amax)
        if value < 0 or math.isinf(value):
            raise ValueError(
                f"an amax is max|x|: finite and >= 0 (or NaN, which propagates), got {value!r}"
                + ("; x has an infinite value: replace it first (torch.nan_to_num)" if math.isinf(value) else ""))
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
