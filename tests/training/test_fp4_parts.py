"""Notebook 09's parts at work: each backward part of the NVFP4 recipe doing its job, measured against oracles.

Stochastic rounding in a sum and over small updates (fp8lab.training.fp4_effects, SumRoundingPanel), the Hadamard
transform by contrast (NVFP4 against MXFP4 on the LLM-like model's dy), 2-D weight blocks through depth
(DepthPanel), the forward kept in high precision (Recipe.fprop_high_precision, a backward-only run) and the dy
control (Recipe.dgrad_high_precision); the shipped backward-only and control runs against runs trained now (slow).
"""

import math

import pytest
import torch
from torch import nn

from fp8lab.gemm import emulated_mm
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.recipes import RECIPES, nvfp4_with
from fp8lab.training.fp4_effects import (
    FOUR_BIT,
    depth_drift,
    flush_threshold,
    hadamard_contrast,
    signed_values,
    small_update,
    sum_rounding,
)
from fp8lab.training.layers import FP8Linear, layer_gemms

# ---- stochastic rounding in a sum -----------------------------------------------------------------------------------


def _sum_errors_oracle(values: torch.Tensor, k: int, rounding: str) -> float:
    """The sums of each row's first k values, quantized to NVFP4 along the row, against the exact sums (float64)."""
    g = torch.Generator().manual_seed(0) if rounding == "stochastic" else None
    q = quantize(values, "e2m1", "1x16", scale_fmt="e4m3", two_level=True, rounding=rounding,
                 generator=g).dequantize().double()
    exact = values.double()[:, :k].sum(1)
    return float((q[:, :k].sum(1) - exact).norm() / exact.norm())


def test_sum_rounding_matches_a_direct_computation_of_both_roundings():
    v = signed_values(16, 512, 0.9)
    s = sum_rounding(v, [16, 512])
    for rounding in ("nearest", "stochastic"):
        assert s["sum"][rounding] == pytest.approx([_sum_errors_oracle(v, k, rounding) for k in (16, 512)], rel=1e-12)


def test_values_of_one_sign_bias_round_to_nearest_in_the_sum_and_not_per_value():
    """Synthetic, 98% positive: per value round to nearest is closer; summed over 4096 values its error stays (a
    bias: measured 0.036 at every k from 256 on, seeds 0-2) while one stochastic draw's falls to 0.007."""
    s = sum_rounding(signed_values(64, 4096, 0.98), [256, 4096])
    assert s["per_value"]["nearest"] < s["per_value"]["stochastic"]
    assert s["sum"]["nearest"][1] > 0.025 and s["sum"]["nearest"][1] > 0.7 * s["sum"]["nearest"][0]
    assert s["sum"]["stochastic"][1] < 0.015 < s["sum"]["nearest"][1]


def test_the_sum_view_draws_nearest_as_nearest():
    """The panel's curves against the oracle: the line labelled round to nearest is round to nearest's error."""
    from fp8lab.lab.panels import SumRoundingPanel
    from fp8lab.lab.panels.fp4_parts import KS

    panel = SumRoundingPanel()
    data = panel.update(source=0.98, k=1024)
    values = signed_values(64, KS[-1], 0.98)
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in panel._figure[1][0].get_lines()}
    for rounding, label in (("nearest", "round to nearest: the sum"), ("stochastic", "stochastic (one draw): the sum")):
        assert lines[label] == pytest.approx([_sum_errors_oracle(values, k, rounding) for k in KS], rel=1e-9)
    assert data["at"]["nearest"] > 2 * data["at"]["stochastic"]


def test_an_update_below_the_flush_threshold_never_moves_a_weight_to_nearest():
    assert flush_threshold() == 0.25 / 6
    below = small_update(0.03, 2000)
    assert torch.all(below["nearest"] == 0)
    # one stochastic draw per step: the rate's standard error is sqrt(p(1-p)/n) / p with p = 0.03 * 6 / 0.5 = 0.36,
    # n = 2000: 3%; 4 standard errors allowed
    assert below["rate"]["stochastic"] == pytest.approx(1.0, abs=0.12)
    above = small_update(0.05, 100)  # over the threshold: rounded up to E2M1's smallest value, 0.5 / 6, every step
    assert above["rate"]["nearest"] == pytest.approx((0.5 / 6) / 0.05, rel=1e-6)
    with pytest.raises(ValueError, match="ratio"):
        small_update(0.0, 10)


@pytest.fixture(scope="module")
def first_step():
    """The LLM-like model's dy at its first step (no training: the model and one batch, seed 0)."""
    from fp8lab.training.gradients import record_dy

    return record_dy("llm_like", steps=1, at=(0,), seed=0).snapshots


def test_the_llm_heads_per_class_sums_are_biased_to_nearest(first_step):
    """98.4% of the head's dy positive: the 64 per-class sums over 1024 tokens are off by 19.5% to nearest (exact:
    deterministic) and by 2.1% to 2.9% with one stochastic draw (draw seeds 0-4)."""
    dy = first_step[0, "head"]
    s = sum_rounding(dy.t().contiguous(), [1024])
    assert s["positive"] == pytest.approx(0.984, abs=0.001)
    assert s["sum"]["nearest"][0] == pytest.approx(0.195, abs=0.001)
    assert 0.015 < s["sum"]["stochastic"][0] < 0.035
    assert s["per_value"]["nearest"] < s["per_value"]["stochastic"]


# ---- the Hadamard transform by contrast ------------------------------------------------------------------------------


def test_the_transform_helps_mxfp4_and_not_nvfp4_on_the_llm_gradient(first_step):
    """blocks.0.qkv's dy in wgrad's layout: NVFP4 0.091 -> 0.099 to nearest; MXFP4 0.139 -> 0.122 (first step; the
    stochastic rows move by under 0.002 between draw seeds 0-2)."""
    dy = first_step[0, "blocks.0.qkv"]
    t = hadamard_contrast(dy)
    assert (t.loc["NVFP4", "change"] > 0).all()
    assert (t.loc["MXFP4", "change"] < -0.08).all()
    assert (t.loc["MXFP4", "without"] > t.loc["NVFP4", "without"]).all()
    # the plain NVFP4 row, recomputed directly
    dyt = dy.t().contiguous()
    q = quantize(dyt, **FOUR_BIT["NVFP4"]).dequantize()
    assert t.loc[("NVFP4", "nearest"), "without"] == pytest.approx(float((q - dyt).norm() / dyt.norm()), rel=1e-6)


# ---- 2-D weight blocks through depth ---------------------------------------------------------------------------------


def test_1d_weight_copies_drift_with_depth_and_2d_blocks_never_do():
    one = depth_drift(16, two_d=False, width=128)
    two = depth_drift(16, two_d=True, width=128)
    assert all(v == 0 for v in two["drift"]) and all(c == pytest.approx(1.0) for c in two["cosine"])
    assert 0.05 < one["drift"][0] < one["drift"][3] < one["drift"][15]
    # the same wrong copies every step: the sum of 16 steps' gradients drifts about as far as one step's (a bias);
    # independent noise would drift sqrt(16) = 4 times less
    assert all(m > 0.5 * d for m, d in zip(one["drift_mean"], one["drift"], strict=True))


def test_the_depth_view_draws_2d_blocks_as_2d():
    from fp8lab.lab.panels import DepthPanel

    panel = DepthPanel()
    data = panel.update(recipe="nvfp4", depth=32)
    assert data["two_d"]["block"] == "16x16" and data["one_d"]["block"] == "1x16"
    assert all(v == 0 for v in data["two_d"]["drift"])
    assert data["one_d"]["drift"][31] > 0.3
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in panel._figure[1].get_lines()}
    assert lines["c x c weight blocks (one copy)"] == data["two_d"]["drift"]


# ---- the forward in high precision, and the dy control ---------------------------------------------------------------


def test_a_backward_only_recipe_runs_the_forward_as_nn_linear_bit_for_bit():
    recipe = nvfp4_with(["2d_weights", "hadamard"]).with_backward_only()
    assert recipe.name == "nvfp4 2D+RHT backward" and recipe.with_backward_only(False).name == "nvfp4 2D+RHT"
    g = torch.Generator().manual_seed(0)
    ref = nn.Linear(64, 32)
    layer = FP8Linear(64, 32, recipe=recipe)
    layer.load_state_dict(ref.state_dict(), strict=False)
    x = torch.randn(2, 8, 64, generator=g, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    y, y_ref = layer(x), ref(x_ref)
    assert torch.equal(y, y_ref)
    dy = torch.randn(2, 8, 32, generator=g)
    y.backward(dy)
    pairs = layer_gemms(x.detach(), ref.weight.detach(), dy, recipe)
    assert pairs["fprop"] is None
    # the backward GEMMs stay quantized: dgrad's and wgrad's results are the emulated GEMMs of their operands
    assert torch.equal(x.grad.reshape(16, 64), emulated_mm(*pairs["dgrad"])[:16])
    assert torch.equal(layer.weight.grad, emulated_mm(*pairs["wgrad"]))
    assert not torch.equal(x.grad.reshape(16, 64), dy.reshape(16, 32) @ ref.weight.detach())


def test_the_dy_control_runs_dgrad_and_wgrad_in_high_precision():
    from fp8lab.training.gradients import dy_control

    recipe = dy_control()
    g = torch.Generator().manual_seed(1)
    x, w, dy = torch.randn(256, 128, generator=g), torch.randn(64, 128, generator=g), torch.randn(256, 64, generator=g)
    pairs = layer_gemms(x, w, dy, recipe)
    assert pairs["dgrad"] is None and pairs["wgrad"] is None and pairs["fprop"] is not None
    layer = FP8Linear(128, 64, bias=False, recipe=recipe)
    with torch.no_grad():
        layer.weight.copy_(w)
    xr = x.clone().requires_grad_(True)
    out = layer(xr)
    assert torch.equal(out, emulated_mm(*pairs["fprop"]))
    out.backward(dy)
    assert torch.equal(xr.grad, dy @ w) and torch.equal(layer.weight.grad, dy.t() @ x)


@pytest.mark.parametrize("flag", ["fprop_high_precision", "dgrad_high_precision"])
def test_the_high_precision_switches_take_true_or_false(flag):
    with pytest.raises(TypeError, match=flag):
        RECIPES["nvfp4"].replace(**{flag: "yes"})


# ---- the shipped runs against runs trained now -----------------------------------------------------------------------

# as tests/notebooks/test_fp4_lessons.py: a run trained here may end up to 8% from the shipped one (measured up to
# 2.75% for the NVFP4 runs retrained with other thread counts and instruction sets); the claims rest on gaps of points
SHIPPED_LOW_PRECISION = 0.08


@pytest.mark.slow
def test_the_shipped_backward_only_run_is_what_the_code_trains_now():
    from fp8lab.training.measured_fp4 import backward_runs
    from fp8lab.training.parts import train_parts

    live = train_parts([nvfp4_with(()).with_backward_only()], seed=0).table
    shipped = backward_runs()
    shipped = shipped[(shipped.seed == 0)].set_index("run")
    run = "nvfp4 1x16 backward"
    for column in live.columns:
        want, got = shipped.loc[run, column], live.loc[run, column]
        assert math.isfinite(got) and abs(got - want) <= SHIPPED_LOW_PRECISION * want, (column, got, want)


@pytest.mark.slow
def test_the_shipped_dy_control_is_what_the_code_trains_now():
    from fp8lab.training.gradients import dy_control
    from fp8lab.training.measured_fp4 import dy_control_runs
    from fp8lab.training.parts import train_parts

    live = train_parts([dy_control()], model="mlp", seed=0).table
    shipped = dy_control_runs()
    shipped = shipped[(shipped.model == "mlp") & (shipped.seed == 0)].set_index("run")
    for column in live.columns:
        want, got = shipped.loc["dy unquantized", column], live.loc["dy unquantized", column]
        assert abs(got - want) <= SHIPPED_LOW_PRECISION * want, (column, got, want)


# ---- what notebook 09 says about them --------------------------------------------------------------------------------


def _notebook_text() -> str:
    import nbformat

    from fp8lab.harness.answers.base import KEY_PATH

    cells = nbformat.read(KEY_PATH.parent / "09_below_eight_bits.ipynb", as_version=4).cells
    return " ".join(" ".join(c.source.split()) for c in cells if c.cell_type == "markdown")


def test_09_teaches_stochastic_rounding_by_the_sign_of_a_sum_and_shows_the_transform_by_contrast():
    text = _notebook_text()
    assert "at the cost of more noise per value" not in text and "noisier in one step)" not in text
    assert "mostly of one sign" in text
    assert "a benefit of large runs these tensors do not show" not in text
    assert "the transform pays where blocks are coarse and scales powers of two" in text
    for panel in ("SumRoundingPanel", "HadamardContrastPanel", "DepthPanel", "BackwardOnlyPanel"):
        assert f"{panel}()" in _notebook_code(), panel
    assert "dy unquantized" in text


def _notebook_code() -> str:
    import nbformat

    from fp8lab.harness.answers.base import KEY_PATH

    cells = nbformat.read(KEY_PATH.parent / "09_below_eight_bits.ipynb", as_version=4).cells
    return " ".join(c.source for c in cells if c.cell_type == "code")
