"""How much a quantization lost: SQNR, relative error, and where values went.

Public: sqnr, channel_sqnr, flushed_fraction, ordinary_channels, ordinary_values, relative_error,
overflow_fraction, underflow_fraction, subnormal_fraction, quantization_report. Every
function takes the original x and either the dequantized tensor or the QuantizedTensor,
and returns Python floats (float64).
Whole-tensor SQNR weighs each value by its energy, so a few outlier channels decide it;
channel_sqnr and the report's "ordinary" entries measure everything else.
Notebook 02 introduces these; every later notebook plots them.
"""

from __future__ import annotations

import math

import torch

from fp8lab.numerics.quantize import QuantizedTensor

__all__ = [
    "channel_sqnr",
    "flushed_fraction",
    "ordinary_channels",
    "ordinary_values",
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
    return db(x64.square().sum().item(), (x64 - y64).square().sum().item())


def ordinary_channels(k: int, outlier_channels: torch.Tensor | list[int] | None = None) -> torch.Tensor:
    """A bool mask over the K channels (columns) of x[M, K]: True except at `outlier_channels`."""
    keep = torch.ones(k, dtype=torch.bool, device="cpu")
    if outlier_channels is not None and len(outlier_channels):
        keep[torch.as_tensor(outlier_channels, dtype=torch.long, device=keep.device)] = False
    return keep


def ordinary_values(shape: tuple[int, int], outliers: torch.Tensor | list[int] | None = None) -> torch.Tensor:
    """A bool mask over x[M, K] (`shape`): True at the ordinary values. `outliers` is either the outlier
    channels' indices (whole columns) or a bool tensor of x's shape, True where an outlier sits (a few tokens'
    channels: fp8lab.training.models.SinkChannels.mask)."""
    m, k = shape
    if isinstance(outliers, torch.Tensor) and outliers.dtype == torch.bool:
        if tuple(outliers.shape) != (m, k):
            raise ValueError(f"an outlier mask has x's shape {(m, k)}, got {tuple(outliers.shape)}")
        return ~outliers
    return ordinary_channels(k, outliers).expand(m, k)


def channel_sqnr(x: torch.Tensor, y: torch.Tensor | QuantizedTensor,
                 outlier_channels: torch.Tensor | list[int] | None = None) -> float:
    """SQNR in dB with every channel weighted alike: -10 log10(mean_c noise_c / signal_c).

    x[M, K]: channel c is column c; noise_c = sum_m (x - y)^2, signal_c = sum_m x^2, over the
    channels not in `outlier_channels` that hold a nonzero value (a bool mask of x's shape instead:
    over each channel's ordinary values, ordinary_values). Where all channels are
    alike it equals sqnr(x, y); a channel flushed to zero has noise_c / signal_c = 1, so a
    share f of flushed channels caps it at -10 log10(f) dB, whatever the outliers' energy.
    inf when every channel is exact; NaN where x or y holds a NaN.
    """
    x64, y64 = x.detach().double(), _as_tensor(y).detach().double()
    x64, y64 = x64.reshape(-1, x64.shape[-1]), y64.reshape(-1, y64.shape[-1])  # (M, K)
    if _is_mask(outlier_channels):  # a few tokens' outliers: each channel's ordinary values
        keep = ordinary_values(tuple(x64.shape), outlier_channels)
        zero = x64.new_zeros(())
        signal = torch.where(keep, x64.square(), zero).sum(0)  # (K,)
        noise = torch.where(keep, (x64 - y64).square(), zero).sum(0)
    else:
        keep = ordinary_channels(x64.shape[-1], outlier_channels)
        signal = x64.square().sum(0)[keep]  # (K',): per-channel sums, then the ordinary channels' (no copies of x)
        noise = (x64 - y64).square().sum(0)[keep]
    if bool(signal.isnan().any() or noise.isnan().any()):
        return math.nan
    live = signal > 0
    if not bool(live.any()):
        return math.inf if float(noise.sum()) == 0 else -math.inf
    ratio = float((noise[live] / signal[live]).mean())
    return math.inf if ratio == 0 else -10.0 * math.log10(ratio)


def flushed_fraction(x: torch.Tensor, y: torch.Tensor | QuantizedTensor,
                     outlier_channels: torch.Tensor | list[int] | None = None) -> float:
    """Share of the ordinary elements of x[M, K] (the channels not in `outlier_channels`, or the values a bool
    mask of x's shape leaves out: ordinary_values) that were nonzero in x and are zero in y: flushed to zero."""
    x2 = x.detach()
    y2 = _as_tensor(y).detach().reshape(x2.shape)
    flushed = (x2 != 0) & (y2 == 0)
    if _is_mask(outlier_channels):
        keep = ordinary_values(tuple(x2.shape), outlier_channels)
        ordinary = int(keep.sum())
    else:
        keep = ordinary_channels(x2.shape[-1], outlier_channels)  # (K,): along the last dimension
        ordinary = int(keep.sum()) * (x2.numel() // max(x2.shape[-1], 1))
    # counted, not gathered: two integers, their quotient rounded once (what the mean of the 0/1 values gives)
    return int((flushed & keep).sum()) / ordinary if ordinary else math.nan


def _is_mask(outliers) -> bool:
    return isinstance(outliers, torch.Tensor) and outliers.dtype == torch.bool


def relative_error(x: torch.Tensor, y: torch.Tensor | QuantizedTensor) -> float:
    """||x - y|| / ||x|| (Frobenius norms, float64); 0 when both are zero."""
    x64, y64 = x.detach().double(), _as_tensor(y).detach().double()
    num = torch.linalg.vector_norm(x64 - y64).item()
    den = torch.linalg.vector_norm(x64).item()
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return num / den


def _scaled_magnitude(x: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    # |x| / scale: where each element sat on the format's axis before rounding (0 where a block's
    # scale is 0: an NVFP4 block below every E4M3 scale, whose values flush)
    s = q.expanded_scale().double()
    return torch.where(s == 0, 0.0, x.detach().double().abs() / s)


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


def db(signal: float, noise: float) -> float:
    """10 log10(signal / noise) in dB: inf when noise is 0, -inf when signal is 0, NaN if either is."""
    if math.isnan(noise) or math.isnan(signal):
        return math.nan
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def quantization_report(x: torch.Tensor, q: QuantizedTensor,
                        outlier_channels: torch.Tensor | list[int] | None = None) -> dict[str, float | str]:
    """Everything above in one dict, plus the scale overhead in bits per element, and, for
    the ordinary values (x[M, K] without its `outlier_channels`, or without the values a bool mask of x's
    shape marks): "ordinary_sqnr_db" (channel_sqnr) and "ordinary_underflow" (the share of them flushed to zero).

    The same numbers as the functions above, from one float64 pass over x and the
    dequantized values: per-channel signal and noise energies give sqnr, relative_error and
    channel_sqnr; one zero mask gives both flushed shares."""
    k = x.shape[-1] if x.dim() else 1
    x2 = x.detach().reshape(-1, k)  # (M, K): channels are the last dim
    values = q.values().reshape(-1, k)
    x64 = x2.double()
    signal_c = x64.square().sum(0)  # (K,)
    noise_c = (x64 - q.dequantize().reshape(-1, k).double()).square().sum(0)
    signal, noise = signal_c.sum().item(), noise_c.sum().item()
    flushed = (x2 != 0) & (values == 0)  # (M, K)
    if _is_mask(outlier_channels):  # a few tokens' outliers: each channel's ordinary values, as channel_sqnr
        cells = ordinary_values(tuple(x2.shape), outlier_channels)
        zero = x64.new_zeros(())
        keep = cells.any(0)  # (K,): channels with an ordinary value
        signal_o = torch.where(cells, x64.square(), zero).sum(0)
        noise_o = torch.where(cells, (x64 - q.dequantize().reshape(-1, k).double()).square(), zero).sum(0)
        ordinary = flushed[cells]
    else:
        keep = ordinary_channels(k, outlier_channels)
        signal_o, noise_o = signal_c, noise_c
        ordinary = flushed if bool(keep.all()) else flushed[:, keep]
    mag = values.abs()
    n = max(values.numel(), 1)
    if signal == 0:
        rel = 0.0 if noise == 0 else math.inf
    else:
        rel = math.sqrt(noise) / math.sqrt(signal)
    live = keep & (signal_o > 0)
    if math.isnan(signal) or math.isnan(noise):
        ordinary_db = math.nan
    elif not bool(live.any()):
        ordinary_db = math.inf if float(noise_o[keep].sum()) == 0 else -math.inf
    else:
        ratio = float((noise_o[live] / signal_o[live]).mean())
        ordinary_db = math.inf if ratio == 0 else -10.0 * math.log10(ratio)
    return {
        "format": q.fmt.name,
        "granularity": q.granularity.label,
        "scale_rule": q.scale_rule,
        "sqnr_db": db(signal, noise),
        "relative_error": rel,
        "overflow": overflow_underflow(x, q)[0],
        "underflow": flushed.sum().item() / n,
        "subnormal": ((mag > 0) & (mag < q.fmt.min_normal)).sum().item() / n,
        "scale_bits_per_element": q.scale_bits_per_element,
        "amax": float(x2.abs().max()),
        "ordinary_sqnr_db": ordinary_db,
        "ordinary_underflow": ordinary.sum().item() / max(ordinary.numel(), 1),
    }


def row_sqnr(x: torch.Tensor, y: torch.Tensor | QuantizedTensor) -> torch.Tensor:
    """sqnr of each row of x[R, N] (float64 tensor of R values, dB; inf where exact)."""
    x64, y64 = x.detach().double(), _as_tensor(y).detach().double()
    noise = (x64 - y64).square().sum(-1)
    return 10 * torch.log10(x64.square().sum(-1) / noise)


def row_overflow(x: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    """overflow_fraction of each row of x[R, N] (float64 tensor of R values)."""
    return _clipped(x, q).double().mean(-1)
