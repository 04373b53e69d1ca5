"""Floating-point formats as data, and the reference cast into them.

Public: FloatFormat, the constants E4M3, E5M2, E8M0, E2M1 (plus BF16 and FP16 for
comparison), FORMATS, get_format(name), widen(data), ROUNDINGS, and the cast in two twins with
one signature and one test: cast_reference(x, fmt) (the teaching version) and cast(x, fmt)
(fast); both round to nearest, or stochastically (rounding="stochastic": notebook 09).
A format is described by its bit fields; every derived number (max, smallest normal,
smallest subnormal, the list of values) is computed from them, never typed in.
Notebook 01 introduces this file: click bits, see values, compare the number lines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import torch

__all__ = [
    "BF16",
    "E2M1",
    "E4M3",
    "E5M2",
    "E8M0",
    "FORMATS",
    "FP16",
    "ROUNDINGS",
    "FloatFormat",
    "cast",
    "cast_reference",
    "check_float",
    "check_rounding",
    "e8m0_codes",
    "get_format",
    "widen",
]

# How a format spends its top codes on non-finite values:
#   "ieee"  the whole top exponent is inf (mantissa 0) or NaN            (E5M2, BF16, FP16)
#   "fn"    finite everywhere except the one all-ones code, which is NaN (E4M3fn, E8M0fnu)
#   "none"  every code is a finite number                                 (E2M1)
SpecialCodes = Literal["ieee", "fn", "none"]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format, described by its fields.

    value(code) = (-1)^s * 2^(E - bias) * (1 + F / 2^m)   for E > 0 (normal)
                = (-1)^s * 2^(1 - bias) * (F / 2^m)       for E = 0 (subnormal)
    with E the exponent field (exponent_bits wide) and F the mantissa field
    (mantissa_bits wide). Formats without subnormals (E8M0) read E = 0 as normal;
    unsigned formats (E8M0) have no sign bit and so no zero.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    special_codes: SpecialCodes
    signed: bool = True
    has_subnormals: bool = True
    torch_dtype_name: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if self.exponent_bits < 1 or self.mantissa_bits < 0:
            raise ValueError(f"{self.name}: exponent_bits must be >= 1 and mantissa_bits >= 0")
        if self.special_codes not in ("ieee", "fn", "none"):
            raise ValueError(
                f"{self.name}: special_codes must be 'ieee', 'fn' or 'none', got {self.special_codes!r}"
            )
        if self.bits > 16:
            raise ValueError(f"{self.name}: formats wider than 16 bits are not enumerable here")

    # ---- the fields -----------------------------------------------------------------
    @property
    def bits(self) -> int:
        """Total width of one code in bits."""
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def has_inf(self) -> bool:
        return self.special_codes == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.special_codes != "none"

    @property
    def has_zero(self) -> bool:
        return self.has_subnormals

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """torch's dtype for this format (E2M1: the packed float4_e2m1fn_x2), if torch has it."""
        if self.torch_dtype_name is None:
            return None
        return getattr(torch, self.torch_dtype_name, None)

    @property
    def storage_dtype(self) -> torch.dtype:
        """The dtype fp8lab keeps one element of this format in, unpacked.

        E2M1 has no unpacked torch dtype (torch packs two per byte), so fp8lab keeps one
        E2M1 value per byte in float8_e4m3fn: every E2M1 value is exactly an E4M3 value,
        so `data.float()` still gives the value. `QuantizedTensor.codes()` gives the 4-bit codes.
        """
        if self.name == "e2m1":
            return torch.float8_e4m3fn
        dtype = self.torch_dtype
        if dtype is None:
            raise ValueError(f"{self.name} has no torch dtype to store it in")
        return dtype

    # ---- decoding ---------------------------------------------------------------------
    def decode(self, code: int) -> float:
        """The value of one code (an int in [0, 2**bits)), as a Python float."""
        if not 0 <= code < 2**self.bits:
            raise ValueError(f"{self.name} codes are 0..{2**self.bits - 1}, got {code}")
        m, e = self.mantissa_bits, self.exponent_bits
        mantissa = code & ((1 << m) - 1)
        exponent = (code >> m) & ((1 << e) - 1)
        negative = self.signed and bool(code >> (m + e))
        top_exponent = exponent == (1 << e) - 1
        sign = -1.0 if negative else 1.0
        if self.special_codes == "ieee" and top_exponent:
            return sign * math.inf if mantissa == 0 else math.nan
        if self.special_codes == "fn" and top_exponent and mantissa == (1 << m) - 1:
            return math.nan
        if exponent == 0 and self.has_subnormals:
            return sign * math.ldexp(mantissa, 1 - self.bias - m)
        return sign * math.ldexp((1 << m) + mantissa, exponent - self.bias - m)

    def encode(self, value: float) -> int:
        """The code of `value` after the reference cast (round to nearest even, saturate)."""
        rounded = float(cast_reference(torch.tensor([value], dtype=torch.float32, device="cpu"), self)[0])
        if math.isnan(rounded):
            if not self.has_nan:
                raise ValueError(f"{self.name} has no NaN code")
            return self.nan_codes[0]
        return self._code_of[rounded if rounded != 0 or not self.signed else math.copysign(0.0, rounded)]

    def fields(self, code: int) -> dict[str, int]:
        """Split a code into its sign, exponent and mantissa fields."""
        m, e = self.mantissa_bits, self.exponent_bits
        return {
            "sign": (code >> (m + e)) & 1 if self.signed else 0,
            "exponent": (code >> m) & ((1 << e) - 1),
            "mantissa": code & ((1 << m) - 1),
        }

    @cached_property
    def _decoded(self) -> tuple[float, ...]:
        return tuple(self.decode(c) for c in range(2**self.bits))

    @cached_property
    def _code_of(self) -> dict[float, int]:
        table: dict[float, int] = {}
        for code, v in enumerate(self._decoded):
            if math.isnan(v):
                continue
            key = v if v != 0 else math.copysign(0.0, v)
            table.setdefault(key, code)
        # -0.0 and 0.0 compare equal as dict keys: keep +0 as the code of zero
        if self.has_zero:
            table[0.0] = 0
        return table

    @cached_property
    def nan_codes(self) -> tuple[int, ...]:
        return tuple(c for c, v in enumerate(self._decoded) if math.isnan(v))

    def values(self) -> torch.Tensor:
        """Every finite value of the format, sorted ascending, one zero (float64; a fresh copy)."""
        return self._values.clone()

    @cached_property
    def _values(self) -> torch.Tensor:
        finite = {v for v in self._decoded if math.isfinite(v)}  # +0 and -0 collapse to one
        return torch.tensor(sorted(finite), dtype=torch.float64, device="cpu")

    # ---- derived numbers ----------------------------------------------------------------
    @cached_property
    def max_value(self) -> float:
        """Largest finite value."""
        return max(v for v in self._decoded if math.isfinite(v))

    @cached_property
    def min_normal(self) -> float:
        """Smallest positive normal value, 2^(1 - bias) (E8M0: 2^-bias, it has no subnormals)."""
        return math.ldexp(1.0, (1 if self.has_subnormals else 0) - self.bias)

    @cached_property
    def min_subnormal(self) -> float:
        """Smallest positive value: 2^(1 - bias - m); for E8M0 (no subnormals) its smallest value."""
        if not self.has_subnormals:
            return self.min_normal
        return math.ldexp(1.0, 1 - self.bias - self.mantissa_bits)

    @property
    def max_exponent(self) -> int:
        """floor(log2(max_value)): the exponent of the largest binade (emax in the OCP MX spec)."""
        return math.floor(math.log2(self.max_value))

    @property
    def clip_threshold(self) -> float:
        """max_value plus half the top binade's step: magnitudes beyond it would round past
        max_value without saturation (they clip); up to it they round to max_value anyway."""
        return self.max_value + 0.5 * 2.0 ** (self.max_exponent - self.mantissa_bits)

    @property
    def nan_code(self) -> int | None:
        """The code of a positive NaN as torch writes it (the largest one), or None without NaN."""
        positive = [c for c in self.nan_codes if not (self.signed and c >> (self.bits - 1))]
        return max(positive) if positive else None

    @property
    def dynamic_range_binades(self) -> float:
        """log2(max_value / min_subnormal): how many powers of two the format spans."""
        return math.log2(self.max_value / self.min_subnormal)

    # ---- identity: a format is its fields ---------------------------------------------------------
    # Compare formats with ==, never `is`. A copy (copy.copy, copy.deepcopy) is the format itself,
    # and pickling (torch.save of a model) stores a named constant by name, so that a reloaded
    # model holds the very constants (E4M3, ...) again; any other format pickles as its fields.
    def __copy__(self) -> FloatFormat:
        return self

    def __deepcopy__(self, memo: dict) -> FloatFormat:
        return self

    def __reduce__(self):
        if FORMATS.get(self.name) == self:
            return (get_format, (self.name,))
        return (FloatFormat, tuple(getattr(self, f) for f in self.__dataclass_fields__))

    def __repr__(self) -> str:
        return (
            f"FloatFormat({self.name}: {self.bits} bits, E{self.exponent_bits}M{self.mantissa_bits}, "
            f"bias {self.bias}, max {self.max_value:g}, min normal {self.min_normal:g}, "
            f"min subnormal {self.min_subnormal:g})"
        )


E4M3 = FloatFormat(
    "e4m3", 4, 3, bias=7, special_codes="fn", torch_dtype_name="float8_e4m3fn",
    description="FP8 for weights and activations: more precision, 18 binades, no inf",
)
E5M2 = FloatFormat(
    "e5m2", 5, 2, bias=15, special_codes="ieee", torch_dtype_name="float8_e5m2",
    description="FP8 for gradients: more range (32 binades), less precision, has inf",
)
E8M0 = FloatFormat(
    "e8m0", 8, 0, bias=127, special_codes="fn", signed=False, has_subnormals=False,
    torch_dtype_name="float8_e8m0fnu",
    description="scale-only: a power of two 2^-127..2^127 (MX block scales)",
)
E2M1 = FloatFormat(
    "e2m1", 2, 1, bias=1, special_codes="none", torch_dtype_name="float4_e2m1fn_x2",
    description="FP4: 0, 0.5, 1, 1.5, 2, 3, 4, 6 (NVFP4 / MXFP4 elements)",
)
BF16 = FloatFormat(
    "bf16", 8, 7, bias=127, special_codes="ieee", torch_dtype_name="bfloat16",
    description="bfloat16: fp32's range with 8 bits of precision",
)
FP16 = FloatFormat(
    "fp16", 5, 10, bias=15, special_codes="ieee", torch_dtype_name="float16",
    description="IEEE half precision",
)

FORMATS: dict[str, FloatFormat] = {f.name: f for f in (E4M3, E5M2, E8M0, E2M1, BF16, FP16)}
_ALIASES = {
    "e4m3fn": "e4m3", "float8_e4m3fn": "e4m3", "e5m2": "e5m2", "float8_e5m2": "e5m2",
    "e8m0fnu": "e8m0", "float8_e8m0fnu": "e8m0", "e2m1fn": "e2m1", "fp4": "e2m1",
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
}


def get_format(fmt: FloatFormat | str) -> FloatFormat:
    """A FloatFormat from itself or its name ('e4m3', 'e5m2', 'e8m0', 'e2m1', 'bf16', 'fp16'); a format
    equal to a named one is that one (the constant itself)."""
    if isinstance(fmt, FloatFormat):
        named = FORMATS.get(fmt.name)
        return named if named == fmt else fmt
    if isinstance(fmt, str):
        key = fmt.strip().lower()
        key = _ALIASES.get(key, key)
        if key in FORMATS:
            return FORMATS[key]
    raise ValueError(f"unknown format {fmt!r}; valid formats: {', '.join(FORMATS)}")


# ---- casting ------------------------------------------------------------------------------


def check_float(x: torch.Tensor) -> None:
    """Refuse what is not a real floating-point tensor (TypeError / ValueError naming what it is)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point() or x.is_complex():
        raise TypeError(
            f"expected a real floating-point tensor (float32, bfloat16, float16, float64), got {x.dtype}"
        )
    if x.layout != torch.strided:
        raise ValueError(f"expected a dense (strided) tensor, got layout {x.layout}: convert it with x.to_dense()")
    if x.device.type == "meta":
        raise ValueError(
            f"x is a meta tensor (shape {tuple(x.shape)}, no values): quantizing needs the values; "
            "materialize it first (e.g. torch.empty_like(x, device='cpu'), or load the weights)"
        )


def _out_dtype(fmt: FloatFormat, dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.float32:  # float32 needs no storage dtype (torch < 2.7 has no float8_e8m0fnu)
        return dtype
    storage = fmt.storage_dtype if fmt.name == "e2m1" or fmt.torch_dtype is not None else None
    if storage is None or dtype != storage:
        raise ValueError(
            f"cast returns float32 values or {fmt.name}'s storage dtype "
            f"{storage or f'(none in torch {torch.__version__})'}, not {dtype}"
        )
    return dtype


def e8m0_codes(scale: torch.Tensor) -> torch.Tensor:
    """Power-of-two float32 scales -> their E8M0 codes (uint8): 2^e -> e + 127; NaN -> 255. The bytes of
    scale.to(torch.float8_e8m0fnu), without that dtype (torch < 2.7 lacks it)."""
    _, exp = torch.frexp(scale.float())  # scale = 0.5 * 2^exp exactly (2^-127, a float32 subnormal, included)
    codes = (exp - 1 + 127).clamp(0, 254).to(torch.uint8)
    return torch.where(torch.isnan(scale), torch.full_like(codes, 255), codes)


def cast_reference(x: torch.Tensor, fmt: FloatFormat | str, dtype: torch.dtype = torch.float32, *,
                   rounding: str = "nearest", generator: torch.Generator | None = None) -> torch.Tensor:
    """Round every element of x to `fmt`: nearest, ties to even; saturate; NaN stays NaN.

    The teaching version, in plain float arithmetic on the bit pattern, for any format
    (cast is its fast twin: same signature, same answers, one test):
      1. clamp |x| to max_value (this is the saturation, and sends +-inf to +-max_value);
      2. below min_normal, round |x| / min_subnormal to an integer (ties to even), since
         subnormals are evenly spaced;
      3. otherwise round the mantissa to `mantissa_bits` bits, ties to even, by adding
         half an ulp (minus one, plus the kept last bit) to the bit pattern and truncating;
         a carry into the exponent is the right answer.
    Unsigned formats (E8M0) have no sign or zero: negative and zero inputs give NaN; values
    below its smallest value round to it. Returns the rounded values as `dtype`: float32, or
    fmt.storage_dtype (the codes quantize keeps: every value of fmt is exact in both).
    rounding="stochastic": see stochastic_reference (the same draws as cast's, decided in float64).
    """
    fmt = get_format(fmt)
    check_float(x)
    dtype = _out_dtype(fmt, dtype)
    if check_rounding(fmt, rounding) == "stochastic":
        return stochastic_reference(x, fmt, uniform_draws(x, generator)).to(dtype)
    if fmt.mantissa_bits > 23 or fmt.exponent_bits > 8:
        raise ValueError(f"{fmt.name} is wider than float32; nothing to round")
    # float64 holds every float32 exactly and has no subnormals in our range, so one bit
    # trick covers every format (E8M0's 2^-127 is a float32 subnormal, not a float64 one)
    x = x.to(torch.float32).to(torch.float64)
    a = x.abs().clamp(max=fmt.max_value)  # NaN passes through clamp
    if not fmt.has_subnormals:
        a = a.clamp(min=fmt.min_normal)

    # step 3: normal range, on the int64 bit pattern of the float64
    drop = 52 - fmt.mantissa_bits  # float64 mantissa bits to drop
    bits = a.view(torch.int64)
    # the last kept digit decides ties; with no mantissa bits (E8M0) it is the implicit
    # leading 1, so a tie 1.5 * 2^k rounds up to 2^(k+1) ("10" is the even neighbour)
    kept_lsb = (bits >> drop) & 1 if fmt.mantissa_bits > 0 else 1
    bits = (bits + ((1 << (drop - 1)) - 1) + kept_lsb) & ~((1 << drop) - 1)
    out = bits.view(torch.float64)
    # step 2: subnormal range, evenly spaced by min_subnormal
    if fmt.has_subnormals:
        q = fmt.min_subnormal
        sub = torch.round(a / q) * q  # torch.round: half to even; a/q and *q are exact
        out = torch.where(a < fmt.min_normal, sub, out)
    if fmt.signed:
        out = torch.copysign(out, x)  # keeps -0
    else:
        out = torch.where(x > 0, out, math.nan)
    return torch.where(torch.isnan(x), x, out).to(torch.float32).to(dtype)


# torch's own float32 -> E4M3 / E5M2 / bf16 / fp16 casts round to nearest even; after an explicit
# clamp to +-max they agree with cast_reference (tests/test_formats.py proves it)
_TORCH_ROUNDS = ("e4m3", "e5m2", "bf16", "fp16")


def cast(x: torch.Tensor, fmt: FloatFormat | str, dtype: torch.dtype = torch.float32, *,
         rounding: str = "nearest", generator: torch.Generator | None = None) -> torch.Tensor:
    """Round x to `fmt` (nearest, ties to even; beyond max_value -> +-max_value; NaN stays NaN).

    The fast twin of cast_reference (same signature, same answers, one test), in float32:
    where torch has a cast to fmt (E4M3, E5M2, bf16, fp16) it clamps to +-max_value and uses
    torch's (round to nearest even); elsewhere (E2M1, E8M0) it rounds |x| on the grid of its
    binade: step = 2^(max(floor(log2|x|), emin) - m), so |x| / step and * step are exact and
    torch.round rounds half to even on the step count, which is the code's parity (with no
    mantissa bits, the even neighbour is the upper one). Saturation is explicit because
    torch's casts differ: float32 -> float8_e4m3fn saturates, -> float8_e5m2 does not
    (1e6 -> inf); fp8lab models saturating hardware (satfinite) for every format.
    Returns the rounded values as `dtype`: float32, or fmt.storage_dtype (the codes).
    rounding="stochastic" rounds each |x| within the range up or down, up with probability its
    distance from the lower neighbour over the gap (round_stochastic), one uniform draw per
    element from `generator` (torch.rand; None: torch's default generator).
    """
    fmt = get_format(fmt)
    check_float(x)
    dtype = _out_dtype(fmt, dtype)
    if check_rounding(fmt, rounding) == "stochastic":
        return round_stochastic(x, fmt, uniform_draws(x, generator)).to(dtype)
    x = x.to(torch.float32)
    if fmt.name in _TORCH_ROUNDS:
        codes = x.clamp(-fmt.max_value, fmt.max_value).to(fmt.torch_dtype)
        return codes if dtype == codes.dtype else widen(codes)
    a = x.abs().clamp(max=fmt.max_value)
    if not fmt.has_subnormals:
        a = a.clamp(min=fmt.min_normal)
    _, e = torch.frexp(a)  # a = mant * 2^e, mant in [0.5, 1): floor(log2 a) = e - 1
    emin = 1 - fmt.bias if fmt.has_subnormals else -fmt.bias
    step = torch.ldexp(torch.ones_like(a), (e - 1).clamp(min=emin) - fmt.mantissa_bits)
    out = torch.round(a / step) * step
    # unsigned: no sign, no zero (NaN stays NaN too)
    out = torch.copysign(out, x) if fmt.signed else torch.where(x > 0, out, math.nan)
    return out.to(dtype)


# ---- stochastic rounding ------------------------------------------------------------------------------------------

ROUNDINGS: tuple[str, ...] = ("nearest", "stochastic")


def check_rounding(fmt: FloatFormat, rounding: str) -> str:
    """`rounding` itself when it is one of ROUNDINGS and fits `fmt` (stochastic: element formats only)."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; valid: {', '.join(ROUNDINGS)}")
    if rounding == "stochastic" and not (fmt.signed and fmt.has_subnormals):
        raise ValueError(f"stochastic rounding is for element formats (e4m3, e5m2, e2m1, bf16, fp16), not {fmt.name}")
    return rounding


def uniform_draws(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One uniform draw in [0, 1) per element of x, float32, x's shape and device: torch.rand from
    `generator` (None: torch's default). Both twins of the stochastic cast take these."""
    return torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)


def round_stochastic(x: torch.Tensor, fmt: FloatFormat, draws: torch.Tensor) -> torch.Tensor:
    """x rounded to `fmt` stochastically, float32: |x| (clamped to max_value) lies between two
    neighbours lo <= |x| < lo + step on its binade's grid, step = 2^(max(floor(log2|x|), emin) - m);
    it becomes lo + step where draws < (|x| - lo) / step, else lo, so that its mean over draws is
    |x| (no bias). Every step is exact in float32: |x| / step is a power-of-two division. Values
    beyond max_value saturate (no draw can lift them back); NaN stays NaN. draws: float32 in [0, 1),
    x's shape (uniform_draws)."""
    x = x.to(torch.float32)
    a = x.abs().clamp(max=fmt.max_value)
    binade = (a.view(torch.int32) & 0x7F800000).view(torch.float32)  # 2^floor(log2 a): a's exponent bits alone
    step = (binade * 2.0 ** -fmt.mantissa_bits).clamp(min=fmt.min_subnormal)  # (NaN: an infinite step)
    units = a / step  # exact
    low = torch.floor(units)
    out = (low + (draws < units - low).to(torch.float32)) * step  # (units - low: exact, in [0, 1))
    return torch.copysign(out, x)


def stochastic_reference(x: torch.Tensor, fmt: FloatFormat, draws: torch.Tensor) -> torch.Tensor:
    """round_stochastic's float64 reference, from the format's list of values: lo = the largest value
    <= |x|, hi = the next one; hi where draws < (|x| - lo) / (hi - lo), else lo; float32 out."""
    x = x.to(torch.float32).to(torch.float64)
    values = fmt.values().to(x.device)
    a = x.abs().clamp(max=fmt.max_value)
    i = (torch.searchsorted(values, a.contiguous(), right=True) - 1).clamp(0, len(values) - 1)
    lo, hi = values[i], values[(i + 1).clamp(max=len(values) - 1)]
    gap = torch.where(hi > lo, hi - lo, 1.0)
    out = torch.where(draws.to(torch.float64) < (a - lo) / gap, hi, lo)
    return torch.where(torch.isnan(x), x, torch.copysign(out, x)).to(torch.float32)


def widen(data: torch.Tensor) -> torch.Tensor:
    """float8 storage (float8_e4m3fn / float8_e5m2) -> float32, exactly; data.float() otherwise.

    Same values as data.float(), several times faster on the CPU, where torch converts FP8
    one element at a time (~1.6 ns per element on 2 cores; this takes ~0.3). Each FP8 value
    is a float16 value scaled by a power of two, so the bits are moved into a float16 and
    the vectorised float16 -> float32 conversion does the rest:
    E5M2 is the top byte of float16 (same exponent bias, inf and NaN included);
    E4M3's 7 magnitude bits shifted left by 7 are the float16 2^-8 * |value| (the 4
    exponent bits land in float16's exponent field, whose bias is 8 larger), subnormals too.
    E4M3 NaN codes (0x7F, 0xFF) have no such image; where they occur the slow cast runs.
    """
    if data.device.type != "cpu" or data.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        return data.to(torch.float32)
    if data.dtype == torch.float8_e5m2:
        return (data.view(torch.uint8).to(torch.int16) << 8).view(torch.float16).to(torch.float32)
    s = data.view(torch.int8).to(torch.int16)  # sign-extended: bit 15 is the sign
    magnitude = s & 0x7F
    if bool((magnitude == 0x7F).any()):  # NaN: rare (a NaN input), so take the exact slow path
        return data.to(torch.float32)
    half = (magnitude << 7) | (s & -0x8000)
    return half.view(torch.float16).to(torch.float32).mul_(256.0)
