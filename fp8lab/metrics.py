"""How much a quantization lost: SQNR, relative error, and where values went.

Public: sqnr, relative_error, overflow_fraction, underflow_fraction, subnormal_fraction,
quantization_report. Every function takes the original x and either the dequantized
tensor or the QuantizedTensor, and returns Python floats (computed in float64).
Notebook 02 introduces these; every later notebook plots them.
"""

from __future__ import annotations

import math

import torch

from fp8lab.quantize import QuantizedTensor

__all__ = [
    "overflow_fraction",
    "overflow_underflow",
    "quantization_report",
    "relative_error",
    "row_overflow",
    "row_sqnr",
    "sqnr",
    "subnormal_fraction",
    "underflow_fraction",
]


def _as_tensor(y: torch.Tensor | QuantizedTensor) -> torch.Tensor:
    return y.dequantize() if isinstance(y, QuantizedTensor) else y


def sqnr(x: torch.Tensor, y: torch.Tensor | QuantizedTensor) -> float:
    """Signal-to-quantization-noise ratio in dB: 10 log10(sum x^2 / sum (x - y)^2).

    inf when y == x exactly; NaN when either holds a NaN. Each extra bit of mantissa
    is worth about 6 dB; E4M3 on well-scaled data gives about 30 dB.
    """
    x64, y64 = x.detach().double(), _as_tensor(y).detach().double()
    noise = (x64 - y64).square().sum().item()
    signal = x64.square().sum().item()
    if math.isnan(noise) or math.isnan(signal):
        return math.nan
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def relative_error(x: torch.Tensor, y: torch.Tensor | QuantizedTensor) -> float:
    """||x - y|| / ||x|| (Frobenius norms, float64); 0 when both are zero."""
    x64, y64 = x.detach().double(), _as_tensor(y).detach().double()
    num = torch.linalg.vector_norm(x64 - y64).item()
    den = torch.linalg.vector_norm(x64).item()
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return num / den


def _scaled_magnitude(x: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    # |x| / scale: where each element sat on the format's axis before rounding
    return x.detach().double().abs() / q.expanded_scale().double()


def _clipped(x: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    # without saturation these would have rounded beyond max_value: |x| / scale above max_value
    # plus half an ulp of the top binade (FloatFormat.clip_threshold)
    return _scaled_magnitude(x, q) > q.fmt.clip_threshold


def overflow_underflow(x: torch.Tensor, q: QuantizedTensor) -> tuple[float, float]:
    """(overflow_fraction, underflow_fraction) of x quantized as q: the Monitor's per-step
    statistics. Read from q.counts where quantize counted them in its own pass (asked with
    count=True, on the CPU kernels); else computed here. The same numbers either way."""
    if q.counts is not None:
        clipped, flushed = q.counts
        n = max(q.data.numel(), 1)
        return clipped / n, flushed / n
    return overflow_fraction(x, q), underflow_fraction(x, q)


def overflow_fraction(x: torch.Tensor, q: QuantizedTensor) -> float:
    """Fraction of elements that clipped: without saturation they would have rounded
    beyond max_value (|x| / scale > max_value + half an ulp of the top binade)."""
    return _clipped(x, q).double().mean().item()


def underflow_fraction(x: torch.Tensor, q: QuantizedTensor) -> float:
    """Fraction of all elements that were nonzero in x and became zero (flushed)."""
    flushed = (x.detach() != 0) & (q.values() == 0)
    return flushed.double().mean().item()


def subnormal_fraction(q: QuantizedTensor) -> float:
    """Fraction of elements stored as subnormals (nonzero, below min_normal): fewer bits of precision."""
    a = q.values().abs()
    return ((a > 0) & (a < q.fmt.min_normal)).double().mean().item()


def quantization_report(x: torch.Tensor, q: QuantizedTensor) -> dict[str, float | str]:
    """Everything above in one dict, plus the scale overhead in bits per element."""
    deq = q.dequantize()
    return {
        "format": q.fmt.name,
        "granularity": q.granularity.label,
        "scale_rule": q.scale_rule,
        "sqnr_db": sqnr(x, deq),
        "relative_error": relative_error(x, deq),
        "overflow": overflow_fraction(x, q),
        "underflow": underflow_fraction(x, q),
        "subnormal": subnormal_fraction(q),
        "scale_bits_per_element": q.scale_bits_per_element,
        "amax": float(x.detach().abs().max()),
    }


def row_sqnr(x: torch.Tensor, y: torch.Tensor | QuantizedTensor) -> torch.Tensor:
    """sqnr of each row of x[R, N] (float64 tensor of R values, dB; inf where exact)."""
    x64, y64 = x.detach().double(), _as_tensor(y).detach().double()
    noise = (x64 - y64).square().sum(-1)
    return 10 * torch.log10(x64.square().sum(-1) / noise)


def row_overflow(x: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    """overflow_fraction of each row of x[R, N] (float64 tensor of R values)."""
    return _clipped(x, q).double().mean(-1)
