"""fp8lab.numerics.metrics: SQNR, relative error and where values went, against float64 sums written here.

The report's agreement with the separate functions on many cases: tests/numerics/test_anatomy_metrics.py.
"""

import math

import pytest
import torch

from fp8lab.numerics.formats import E4M3
from fp8lab.numerics.metrics import (
    channel_sqnr,
    db,
    flushed_fraction,
    overflow_fraction,
    quantization_report,
    relative_error,
    sqnr,
    underflow_fraction,
)
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.scaling import PerTensor


def test_sqnr_and_relative_error_against_float64_sums():
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    y = torch.tensor([[1.5, -2.0], [3.0, 3.0]])
    signal, noise = 1 + 4 + 9 + 16, 0.25 + 1.0
    assert sqnr(x, y) == 10 * math.log10(signal / noise)
    assert math.isclose(relative_error(x, y), math.sqrt(noise / signal), rel_tol=1e-15)
    assert sqnr(x, x) == math.inf and relative_error(x, x) == 0.0
    assert math.isnan(sqnr(x, torch.full_like(x, math.nan)))


def test_db_edge_cases():
    assert db(100.0, 1.0) == 20.0
    assert db(1.0, 0.0) == math.inf and db(0.0, 1.0) == -math.inf
    assert math.isnan(db(math.nan, 1.0))


def test_channel_sqnr_weighs_each_channel_alike_and_skips_outliers():
    # channel 0 huge and exact, channel 1 small with relative noise 0.1 -> noise/signal 0.01
    x = torch.tensor([[1000.0, 1.0], [1000.0, 1.0]])
    y = torch.tensor([[1000.0, 1.1], [1000.0, 0.9]])
    ratio1 = (0.1**2 * 2) / 2  # channel 1: sum (x-y)^2 / sum x^2 (float32 inputs: compare within 1e-6 dB)
    assert math.isclose(channel_sqnr(x, y), -10 * math.log10(ratio1 / 2), rel_tol=1e-6)
    assert math.isclose(channel_sqnr(x, y, [0]), -10 * math.log10(ratio1), rel_tol=1e-6)
    # the whole-tensor SQNR is dominated by the exact outlier channel
    assert sqnr(x, y) > channel_sqnr(x, y) + 40
    # a bool mask of x's shape marking column 0 gives the same as naming channel 0
    mask = torch.tensor([[True, False], [True, False]])
    assert channel_sqnr(x, y, mask) == channel_sqnr(x, y, [0])


def test_flushed_fraction_counts_nonzero_to_zero_among_ordinary_channels():
    x = torch.tensor([[1.0, 2.0, 0.0], [1.0, 2.0, 3.0]])
    y = torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, 3.0]])  # two flushes; x's own zero is not one
    assert flushed_fraction(x, y) == 2 / 6
    assert flushed_fraction(x, y, [1]) == 1 / 4


@pytest.mark.parametrize("shape", [(7,), (5, 9), (3, 4, 6), (64, 1024)])
def test_flushed_fraction_is_the_mean_over_the_gathered_ordinary_values(shape):
    """Counted without gathering: bit for bit the mean of the 0/1 flags of the ordinary values gathered (columns
    left out, or a mask of x's shape), and NaN where nothing is ordinary, as that mean."""
    g = torch.Generator().manual_seed(len(shape))
    x = torch.randn(shape, generator=g) * (torch.rand(shape, generator=g) > 0.1)
    y = x * (torch.rand(shape, generator=g) > 0.3)
    k = shape[-1]

    def gathered(keep):
        return ((x[..., keep] != 0) & (y[..., keep] == 0)).double().mean().item()

    assert flushed_fraction(x, y) == gathered(torch.ones(k, dtype=torch.bool))
    left_out = [0, k - 1]
    keep = torch.ones(k, dtype=torch.bool)
    keep[left_out] = False
    assert flushed_fraction(x, y, left_out) == gathered(keep)
    assert math.isnan(flushed_fraction(x, y, list(range(k))))
    if len(shape) == 2:
        mask = torch.rand(shape, generator=g) > 0.8  # True: an outlier
        assert flushed_fraction(x, y, mask) == ((x[~mask] != 0) & (y[~mask] == 0)).double().mean().item()
        assert math.isnan(flushed_fraction(x, y, torch.ones(shape, dtype=torch.bool)))


def test_overflow_and_underflow_of_a_per_tensor_cast():
    # "exact": scale = amax / 448 puts the largest value exactly at max, nothing clips; a value below half
    # the smallest subnormal (2^-10) flushes
    x = torch.tensor([448.0, 1.0, 2.0**-11, 0.0])
    q = quantize(x, E4M3, PerTensor())
    assert float(q.scale) == 1.0
    assert overflow_fraction(x, q) == 0.0
    assert underflow_fraction(x, q) == 1 / 4
    # "floor": scale = 2^(floor(log2 500) - floor(log2 448)) = 1, so 500 sits beyond max + half an ulp (464)
    y = torch.tensor([500.0, 1.0, 460.0, 0.0])
    q2 = quantize(y, E4M3, PerTensor(), scale_rule="floor")
    assert float(q2.scale) == 1.0
    assert overflow_fraction(y, q2) == 1 / 4


def test_report_names_the_settings_and_repeats_the_functions():
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    q = quantize(x, E4M3, PerTensor())
    r = quantization_report(x, q)
    assert r["format"] == "e4m3" and r["scale_rule"] == "exact"
    assert r["sqnr_db"] == sqnr(x, q)
    assert math.isclose(r["relative_error"], relative_error(x, q), rel_tol=1e-12)
    assert r["amax"] == float(x.abs().max())
