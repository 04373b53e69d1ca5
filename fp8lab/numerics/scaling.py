"""Which elements share a scale (granularity), and how a scale is chosen (scale rules).

Public: PerTensor, PerRow, PerBlock(rows, cols), parse_granularity, amax_per_block,
scale_from_amax (every scale rule, NVFP4's E4M3 block scales and tensor scale included),
Scales, ScaleArgs / check_scale_args, SCALE_RULES, SCALE_FLOORS (where NVFP4's block scales stop,
and whose engine each floor is), AmaxHistory (delayed scaling).
Shapes: x[M, K] -> amax[ceil(M/rows), ceil(K/cols)]; PerRow is PerBlock(1, K) and
PerTensor is PerBlock(M, K); a block larger than the tensor is clamped to it.
`scale` is the dequantization multiplier: x ~= q * scale.
Notebooks 02 (per tensor), 03 (delayed) and 04 (per block) introduce this file.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

from fp8lab.numerics.formats import E4M3, E8M0, FloatFormat, cast, get_format

__all__ = [
    "MAX_BLOCK",
    "SCALE_FLOORS",
    "SCALE_RULES",
    "AmaxHistory",
    "Granularity",
    "PerBlock",
    "PerRow",
    "PerTensor",
    "ScaleArgs",
    "Scales",
    "amax_per_block",
    "as_2d",
    "check_scale_args",
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


# ---- granularity ---------------------------------------------------------------------------


class Granularity:
    """Which region of x[M, K] shares one scale. Subclasses are frozen dataclasses."""

    def block_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        """(rows, cols) of one block for a 2-D tensor of `shape`, never larger than the tensor."""
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


# the largest block side PerBlock takes (a block is clamped to the tensor anyway; sides beyond
# this are typos, and C's int64 would wrap them)
MAX_BLOCK = 2**31 - 1


@dataclass(frozen=True)
class PerBlock(Granularity):
    """One scale per rows x cols tile: x[M, K] -> scale[ceil(M/rows), ceil(K/cols)].

    Examples: PerBlock(1, 128) is DeepSeek-V3's activation tile, PerBlock(128, 128) its
    weight block, PerBlock(1, 32) the MX block, PerBlock(1, 16) the NVFP4 block. Shapes
    that do not divide are padded with zeros internally (zeros never change an amax).
    A block larger than the tensor is clamped to it: PerBlock(128, 128) on x[1, K] is
    PerBlock(1, 128) there, and PerBlock(10**6, 10**6) on x[64, 256] is one block, per-tensor
    in effect (the scale's shape says so: (1, 1); QuantizedTensor.block_shape gives the block
    used). rows and cols: integers in 1..MAX_BLOCK (2**31 - 1).
    """

    rows: int
    cols: int

    def __post_init__(self) -> None:
        for name in ("rows", "cols"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_BLOCK:
                raise ValueError(f"PerBlock {name} must be a positive integer up to 2**31 - 1, got {v!r}")

    def block_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        return (min(self.rows, max(shape[0], 1)), min(self.cols, max(shape[1], 1)))

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
class ScaleArgs:
    """scale_from_amax's settings, checked (check_scale_args), with the constants its formulas use."""

    fmt: FloatFormat
    scale_rule: str
    margin: int
    scale_fmt: FloatFormat | None
    two_level: bool
    scale_floor: str = "zero"

    @property
    def floor(self) -> float:
        """The smallest E4M3 block scale before rounding: 0 ("zero") or E4M3's smallest normal ("min_normal")."""
        return self.scale_fmt.min_normal if self.scale_floor == "min_normal" and self.scale_fmt else 0.0

    @property
    def smallest_scale(self) -> float:
        """The smallest nonzero E4M3 block scale: E4M3's smallest subnormal ("zero") or smallest normal."""
        if self.scale_fmt is None:
            return 0.0
        return self.scale_fmt.min_normal if self.scale_floor == "min_normal" else self.scale_fmt.min_subnormal

    @property
    def max_eff(self) -> float:
        """The largest value the block's amax maps to: fmt.max_value / 2**margin."""
        return self.fmt.max_value / 2**self.margin

    @property
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

    @property
    def min_tensor_scale(self) -> float:
        """two_level: the smallest tensor scale, 2^-127 / the smallest nonzero block scale, so that every
        inverse (1 / tensor_scale) / block scale stays finite in float32."""
        return 2.0**-127 / self.smallest_scale if self.scale_fmt is not None else 0.0


def check_scale_args(
    fmt: FloatFormat | str = E4M3,
    scale_rule: str = "exact",
    margin: int = 0,
    scale_fmt: FloatFormat | str | None = None,
    two_level: bool = False,
    scale_floor: str = "zero",
) -> ScaleArgs:
    """scale_from_amax's (and quantize's) scale settings checked once; a clear error names the valid choices.

    fmt: an element format (not E8M0); scale_rule: one of SCALE_RULES; margin: an integer
    from 0 to the format's range (e4m3: 17, e5m2: 31, e2m1: 3; beyond it even the block's
    largest value would flush to zero); scale_fmt: None (float32 scales), E8M0 (power-of-two
    scales, "rceil" or "floor") or E4M3 (NVFP4's block scales, rounded from "exact" scales);
    two_level: a per-tensor float32 scale above E4M3 block scales (NVFP4); scale_floor: where E4M3
    block scales stop at the bottom, one of SCALE_FLOORS ("zero", the training engines'; "min_normal",
    torchao's inference NVFP4Tensor); only "zero" (the default, no floor) for other scale formats.
    """
    try:
        return _checked(fmt, scale_rule, margin, scale_fmt, two_level, scale_floor)
    except TypeError:  # an unhashable argument: check it uncached, for the error that explains it
        return _checked.__wrapped__(fmt, scale_rule, margin, scale_fmt, two_level, scale_floor)


@lru_cache(maxsize=256, typed=True)  # (typed: margin True is not margin 1)
def _checked(fmt, scale_rule, margin, scale_fmt, two_level, scale_floor="zero") -> ScaleArgs:
    fmt = get_format(fmt)
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
    if scale_fmt == E8M0 and scale_rule == "exact":
        raise ValueError("E8M0 scales are powers of two: use scale_rule 'rceil' or 'floor', not 'exact'")
    if scale_fmt == E4M3 and scale_rule != "exact":
        raise ValueError("E4M3 block scales are rounded from exact scales: use scale_rule='exact'")
    if two_level and scale_fmt != E4M3:
        raise ValueError("two_level scaling is NVFP4's: it needs scale_fmt='e4m3'")
    if not isinstance(scale_floor, str) or scale_floor not in SCALE_FLOORS:
        raise ValueError(f"unknown scale_floor {scale_floor!r}; valid: "
                         + "; ".join(f"{k!r} ({v})" for k, v in SCALE_FLOORS.items()))
    if scale_floor != "zero" and scale_fmt != E4M3:
        raise ValueError(f"scale_floor {scale_floor!r} is for E4M3 block scales (NVFP4, scale_fmt='e4m3'); "
                         f"{'float32' if scale_fmt is None else scale_fmt.name} scales take the default, 'zero'")
    return ScaleArgs(fmt, scale_rule, margin, scale_fmt, bool(two_level), scale_floor)


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
    fmt: FloatFormat | str = E4M3,
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
    ScaleArgs.min_tensor_scale), so that the E4M3 block scales use their whole range, and
    inverse = (1 / tensor_scale) / scale, as torchao's NVFP4 computes it.
    Other rules: an all-zero block (amax 0) gets scale 1. A NaN amax gives a NaN scale (the block
    dequantizes to NaN).
    """
    args = check_scale_args(fmt, scale_rule, margin, scale_fmt, two_level, scale_floor)
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

    if scale_rule == "exact":
        # inverse = max / amax in float64, as torchao; an amax so small (or so large) that this
        # leaves float32's normal range is treated as float32's largest (or smallest) inverse
        inverse = (max_eff / amax.double()).clamp(min=args.min_inverse, max=_FLOAT32.max).to(torch.float32)
        inverse = torch.where(zero, 1.0, inverse)
        return Scales(inverse.reciprocal(), inverse, None)

    # power-of-two rules, on exact exponents: amax = mant * 2**exp with mant in [0.5, 1)
    mant, exp = torch.frexp(amax)
    log2_floor_amax = exp - 1  # floor(log2(amax)), exact
    if scale_rule == "floor":
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
