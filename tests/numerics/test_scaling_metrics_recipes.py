"""Delayed scaling, metrics and recipes."""

import math

import pytest
import torch

import fp8lab
from fp8lab import E4M3, E5M2, RECIPES, AmaxHistory, PerBlock, PerTensor, quantize, quantize_delayed
from fp8lab.numerics.metrics import overflow_fraction, relative_error, sqnr, subnormal_fraction, underflow_fraction
from fp8lab.numerics.recipes import GEMMS, ROLES, VARIANTS, get_recipe
from fp8lab.numerics.scaling import amax_per_block

# every test here runs on the C kernels and on the torch definition (conftest.both_paths)
pytestmark = pytest.mark.usefixtures("both_paths")


# ---- delayed scaling -------------------------------------------------------------------------


def _steps(magnitudes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(64, 64, generator=g) * m for m in magnitudes]


def test_a_spike_overflows_on_its_step_and_the_history_catches_up():
    hist = AmaxHistory(length=4, algo="max")
    xs = _steps([1, 1, 1, 50, 1, 1])
    overflow = []
    for x in xs:
        q = quantize_delayed(x, hist)
        overflow.append(overflow_fraction(x, q))
    # same-sized steps: at most the odd element beyond the previous steps' amax
    assert overflow[0] == 0 and overflow[1] < 0.001 and overflow[2] < 0.001
    assert overflow[3] > 0.5  # the spike step: scale from amax ~4, values up to ~200
    assert overflow[4] == overflow[5] == 0  # the history now holds the spike
    # after the spike, "max" keeps the big amax for `length` steps: small values lose precision
    assert len(hist) == 4 and max(hist.history) == pytest.approx(xs[3].abs().max().item())


def test_history_length_sets_how_long_a_spike_is_remembered():
    xs = _steps([1] * 3 + [1e4] + [1] * 10)
    for length in (2, 8):
        hist = AmaxHistory(length=length)
        flushed, errors = [], []
        for x in xs:
            q = quantize_delayed(x, hist)
            flushed.append(underflow_fraction(x, q))
            errors.append(relative_error(x, q))
        after = slice(4, 4 + length - 1)  # the steps that still remember the spike
        # a scale 10^4 too coarse pushes small values below E4M3's subnormals
        assert all(f > 0.02 for f in flushed[after]) and all(e > 0.04 for e in errors[after])
        assert all(f == 0 for f in flushed[4 + length :]) and all(e < 0.03 for e in errors[4 + length :])


def test_most_recent_follows_the_last_step():
    hist = AmaxHistory(length=16, algo="most_recent")
    for a in (1.0, 5.0, 2.0):
        hist.record(a)
    assert hist.amax() == 2.0
    hist2 = AmaxHistory(length=16, algo="max")
    for a in (1.0, 5.0, 2.0):
        hist2.record(a)
    assert hist2.amax() == 5.0


def test_first_step_uses_the_current_amax():
    x = torch.randn(16, 16) * 1000
    q = quantize_delayed(x, AmaxHistory())
    assert overflow_fraction(x, q) == 0 and sqnr(x, q) > 25


def test_history_validation():
    with pytest.raises(ValueError, match="positive integer"):
        AmaxHistory(0)
    with pytest.raises(ValueError, match="max, most_recent"):
        AmaxHistory(4, "mean")
    with pytest.raises(ValueError, match="per-tensor"):
        quantize(torch.ones(4, 4), E4M3, PerBlock(1, 2), amax=1.0)


# ---- metrics -------------------------------------------------------------------------------------


def test_sqnr_and_relative_error_formulas():
    x = torch.tensor([3.0, 4.0])
    y = torch.tensor([3.0, 4.5])
    assert sqnr(x, y) == pytest.approx(10 * math.log10(25 / 0.25))
    assert relative_error(x, y) == pytest.approx(0.5 / 5)
    assert sqnr(x, x) == math.inf and relative_error(x, x) == 0
    assert math.isnan(sqnr(torch.tensor([math.nan]), torch.tensor([1.0])))


def test_e4m3_on_a_gaussian_gives_about_31_db():
    # 3 mantissa bits: relative rounding error ~ 2^-4 / sqrt(3); SQNR ~ 31 dB (6 dB per bit)
    x = torch.randn(512, 512, generator=torch.Generator().manual_seed(0))
    assert 30 < sqnr(x, quantize(x, E4M3)) < 33
    assert 24 < sqnr(x, quantize(x, E5M2)) < 27


def test_underflow_overflow_and_subnormal_fractions():
    x = torch.ones(1000)
    x[0] = 1e6  # an outlier sets the per-tensor scale: 1e6 / 448 per step
    x[1:501] = 1e-3  # these land below E4M3's smallest subnormal after scaling: flushed
    q = quantize(x, E4M3)
    # 1.0 / (1e6/448) = 4.5e-4 is below half of E4M3's smallest subnormal (2^-10 = 9.8e-4):
    # every element but the outlier flushes to zero
    assert underflow_fraction(x, q) == pytest.approx(0.999)
    assert overflow_fraction(x, q) == 0
    q = quantize(x.reshape(1, -1), E4M3, PerBlock(1, 10))  # per block, only the outlier's block suffers
    assert underflow_fraction(x, q) == pytest.approx(0.009)
    zeros = torch.cat([torch.zeros(10), torch.ones(10)])  # zeros that stay zero did not flush
    assert underflow_fraction(zeros, quantize(zeros, E4M3)) == 0
    y = torch.full((100,), 0.01)
    y[0] = 448.0
    q = quantize(y, E4M3)  # scale 1: 0.01 is a subnormal in E4M3 (< 2^-6)
    assert subnormal_fraction(q) == pytest.approx(0.99)
    report = fp8lab.quantization_report(y, q)
    assert set(report) >= {"sqnr_db", "relative_error", "overflow", "underflow", "subnormal", "scale_bits_per_element"}


def test_overflow_counts_only_real_clips():
    x = torch.tensor([100.0, 460.0, 470.0, -1000.0])
    q = quantize(x, E4M3, amax=100.0)  # scale 100/448: 470 -> 2105, far beyond 448
    assert overflow_fraction(x, q) == pytest.approx(0.75)
    # 460 / (448/448) = 460 would round to 448 anyway (half-ulp at the top is 16): not a clip
    q1 = quantize(x, E4M3, amax=448.0)
    assert overflow_fraction(x, q1) == pytest.approx(0.5)


def test_block_amax_shapes():
    x = torch.arange(12.0).reshape(3, 4)
    assert amax_per_block(x, PerBlock(2, 2)).tolist() == [[5.0, 7.0], [9.0, 11.0]]
    assert amax_per_block(-x, PerTensor()).tolist() == [[11.0]]


# ---- recipes ----------------------------------------------------------------------------------------


def test_the_six_recipes():
    assert set(RECIPES) == {"tensorwise", "delayed", "rowwise", "blockwise", "mxfp8", "nvfp4"}
    for r in RECIPES.values():
        for gemm, roles in GEMMS.items():
            for role in roles:
                s = r.scaling(role, gemm)
                assert s is not None and s.fmt.name in ("e4m3", "e5m2", "e2m1")
        assert str(r).startswith(f"recipe {r.name!r}")


def test_recipe_facts():
    t, d, rw, bw, mx, nv = (RECIPES[n] for n in ("tensorwise", "delayed", "rowwise", "blockwise", "mxfp8", "nvfp4"))
    assert t.input.fmt is E4M3 and t.grad_output.fmt is E5M2  # torchao default / TE HYBRID
    assert d.delayed is not None and d.delayed.history_len == 16
    assert all(getattr(rw, r).fmt is E4M3 and getattr(rw, r).scale_rule == "rceil" for r in ROLES)
    assert bw.input.granularity == PerBlock(1, 128) and bw.weight.granularity == PerBlock(128, 128)
    assert bw.grad_output.granularity == PerBlock(1, 128)  # 128x128 gradients diverged (DeepSeek App. B.2)
    assert mx.input.granularity == PerBlock(1, 32) and mx.input.scale_fmt.name == "e8m0"
    # every MX operand's E8M0 scale rounded up, as TE and cuBLAS do (the OCP floor can clip: FACTS.md)
    assert all(getattr(mx, r).scale_rule == "rceil" and getattr(mx, r).granularity == PerBlock(1, 32) for r in ROLES)
    assert nv.input.fmt.name == "e2m1" and nv.input.scale_fmt is E4M3 and nv.input.two_level


def test_variants_and_lookup():
    gw = get_recipe("rowwise_with_gw_hp")
    assert gw is VARIANTS["rowwise_with_gw_hp"]
    assert gw.scaling("grad_output", "wgrad") is None
    assert gw.scaling("weight", "dgrad").granularity == PerTensor()
    with pytest.raises(ValueError, match="valid recipes: tensorwise, delayed, rowwise, blockwise, mxfp8, nvfp4"):
        get_recipe("fp8")
    with pytest.raises(ValueError, match="fprop takes input and weight"):
        RECIPES["tensorwise"].scaling("grad_output", "fprop")


def test_tensor_scaling_validates():
    with pytest.raises(ValueError, match="valid rules"):
        fp8lab.TensorScaling(E4M3, PerTensor(), "nearest")
    with pytest.raises(ValueError, match="per-tensor"):
        RECIPES["delayed"].replace(input=fp8lab.TensorScaling(E4M3, PerBlock(1, 128)))
