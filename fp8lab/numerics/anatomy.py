"""The anatomy of one value in a format, as float.exposed shows it: neighbours, gap, rounding.

Public: anatomy(fmt, code) -> Anatomy (the value of a code, its fields, the two neighbouring
values, the gap to the next value (ulp) and the relative step), rounding(fmt, value) ->
Rounding (what a typed value becomes: exact, rounded, saturated, flushed to zero, NaN; the
error). Notebook 01's bit clicker (widgets.BitsPanel) shows both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fp8lab.numerics.formats import FloatFormat, cast, get_format

__all__ = ["Anatomy", "Rounding", "anatomy", "rounding"]


@dataclass(frozen=True)
class Anatomy:
    """One code of a format. below / above: the nearest representable values on either side
    (None past the ends); gap: the distance to the next value away from zero (at the largest
    magnitude, to the one towards zero) - the ulp at this value; relative_step = gap / |value|
    (2^-mantissa_bits at the bottom of a normal binade, half that at its top; more for
    subnormals)."""

    fmt: str
    code: int
    value: float
    fields: dict[str, int]
    subnormal: bool
    below: float | None
    above: float | None
    gap: float | None
    relative_step: float | None


@dataclass(frozen=True)
class Rounding:
    """A typed value cast to the format. status: "exact", "rounded", "saturated" (so far beyond
    the largest magnitude that it would round past it: clamped to it instead), "flushed to
    zero" or "NaN"; error = rounded - typed."""

    typed: float
    rounded: float
    code: int | None
    status: str
    error: float
    relative_error: float


def _finite_values(fmt: FloatFormat) -> torch.Tensor:
    v = fmt.values().double()
    return torch.unique(v[torch.isfinite(v)])  # sorted; -0 and +0 merge


def anatomy(fmt: FloatFormat | str, code: int) -> Anatomy:
    """The value of `code` in `fmt` and where it sits among the format's values."""
    f = get_format(fmt)
    value = f.decode(code)
    fields = f.fields(code)
    subnormal = f.has_subnormals and fields["exponent"] == 0 and value != 0
    if not math.isfinite(value):
        return Anatomy(f.name, code, value, fields, False, None, None, None, None)
    vals = _finite_values(f)
    lower, upper = vals[vals < value], vals[vals > value]
    below = float(lower[-1]) if len(lower) else None
    above = float(upper[0]) if len(upper) else None
    away = above if value >= 0 else below  # the next value away from zero
    toward = below if value >= 0 else above
    if value == 0:
        gap = f.min_subnormal if f.has_subnormals else None
    elif away is not None:
        gap = abs(away - value)
    else:  # the largest magnitude: the gap is that of its binade, towards zero
        gap = abs(value - toward) if toward is not None else None
    rel = gap / abs(value) if gap is not None and value != 0 else None
    return Anatomy(f.name, code, value, fields, subnormal, below, above, gap, rel)


def rounding(fmt: FloatFormat | str, value: float) -> Rounding:
    """What `value` becomes in `fmt` (round to nearest, ties to even, saturate), and the error."""
    f = get_format(fmt)
    rounded = float(cast(torch.tensor([value], dtype=torch.float64, device="cpu"), f)[0]) if math.isfinite(value) else (
        math.nan if math.isnan(value) else math.copysign(f.max_value, value))
    if math.isnan(rounded):
        return Rounding(value, rounded, f.nan_codes[0] if f.has_nan else None, "NaN", math.nan, math.nan)
    # beyond max + half the top binade's gap a value would round past the largest one: it saturates
    if abs(value) > f.max_value + 0.5 * 2.0 ** (f.max_exponent - f.mantissa_bits):
        status = "saturated"
    elif rounded == value:
        status = "exact"
    elif rounded == 0:
        status = "flushed to zero"
    else:
        status = "rounded"
    err = rounded - value
    rel = abs(err) / abs(value) if value != 0 else 0.0
    return Rounding(value, rounded, f.encode(rounded), status, err, rel)
