"""fp8lab.training.operands: one activation as the fprop GEMM (along K) and the wgrad GEMM (along M) quantize it."""

from __future__ import annotations

import pytest
import torch

from fp8lab.numerics.formats import E4M3
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.scaling import PerBlock, PerRow, PerTensor
from fp8lab.training.operands import GEMM_ROLES, constant_loss, operand_losses, placement_flush


def _x(m: int = 128, k: int = 256) -> torch.Tensor:
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(0))
    x[:, :4] = 1e5  # sinks in channels 0-3 of every token
    return x


def test_the_roles_are_fprop_and_wgrad():
    assert set(GEMM_ROLES) == {"fprop", "wgrad"}


@pytest.mark.parametrize("recipe, fprop, wgrad", [
    ("tensorwise", ("per-tensor", (128, 256)), ("per-tensor", (128, 256))),
    ("rowwise", ("per row (one token)", (1, 256)), ("per column (one channel)", (128, 1))),
    ("blockwise", ("1x128", (1, 128)), ("128x1", (128, 1))),
])
def test_each_gemm_scales_x_along_its_own_sum(recipe, fprop, wgrad):
    out = operand_losses(_x(), recipe, [0, 1, 2, 3])
    assert (out["fprop"]["label"], out["fprop"]["block"]) == fprop
    assert (out["wgrad"]["label"], out["wgrad"]["block"]) == wgrad
    assert out["fprop"]["values"].shape == out["wgrad"]["values"].shape == (128, 256)  # both in x's layout


def test_the_values_are_the_casts_along_k_and_along_m():
    x = _x()
    out = operand_losses(x, "rowwise", [0, 1, 2, 3])
    along_k = quantize(x, E4M3, PerRow(), "rceil").dequantize()
    along_m = quantize(x.t().contiguous(), E4M3, PerRow(), "rceil").dequantize().t()
    assert torch.equal(out["fprop"]["values"], along_k)
    assert torch.equal(out["wgrad"]["values"], along_m)
    whole = operand_losses(x, "tensorwise")
    per_tensor = quantize(x, E4M3, PerTensor()).dequantize()
    assert torch.equal(whole["fprop"]["values"], per_tensor) and torch.equal(whole["wgrad"]["values"], per_tensor)
    blocks = operand_losses(x, "blockwise")
    assert torch.equal(blocks["fprop"]["values"], quantize(x, E4M3, PerBlock(1, 128)).dequantize())


def test_the_sinks_flush_ordinary_channels_per_token_but_not_per_channel():
    out = operand_losses(_x(), "rowwise", [0, 1, 2, 3])
    # along K each token's scale is set by its sink (1e5 / 448, rounded up to 256): values under half E4M3's
    # smallest subnormal (2^-9 * 256 / 2 = 0.25) flush, about a fifth of N(0, 1); along M each ordinary
    # channel has its own scale and nothing flushes
    x = _x()
    assert out["fprop"]["ordinary_flushed"] == pytest.approx(float((x[:, 4:].abs() < 0.25).double().mean()), abs=0.01)
    assert out["wgrad"]["ordinary_flushed"] == 0.0
    assert out["wgrad"]["ordinary_sqnr_db"] > out["fprop"]["ordinary_sqnr_db"] + 10


@pytest.mark.parametrize("recipe", ["rowwise", "mxfp8", "rowwise_with_gw_hp"])
def test_one_gemm_asked_for_is_what_both_give_for_it(recipe):
    both = operand_losses(_x(), recipe, [0, 1, 2, 3])
    for gemm in GEMM_ROLES:
        one = operand_losses(_x(), recipe, [0, 1, 2, 3], gemms=(gemm,))
        assert list(one) == [gemm]
        assert {k: v for k, v in one[gemm].items() if k != "values"} == \
            {k: v for k, v in both[gemm].items() if k != "values"}
        assert (one[gemm]["values"] is None and both[gemm]["values"] is None) or \
            torch.equal(one[gemm]["values"], both[gemm]["values"])


@pytest.mark.parametrize("gemms", [(), ("dgrad",), ("fprop", "forward")])
def test_gemms_outside_fprop_and_wgrad_are_refused_by_name(gemms):
    with pytest.raises(ValueError, match="fprop, wgrad"):
        operand_losses(_x(), "rowwise", gemms=gemms)


def test_a_high_precision_gemm_quantizes_nothing():
    out = operand_losses(_x(), "rowwise_with_gw_hp", [0, 1, 2, 3])
    assert out["wgrad"]["values"] is None and out["wgrad"]["label"] == "high precision"
    assert out["wgrad"]["ordinary_flushed"] == 0.0 and out["wgrad"]["ordinary_sqnr_db"] == float("inf")
    assert out["fprop"]["values"] is not None and out["fprop"]["format"] == E4M3.name


def test_the_constant_loss_is_the_mean_square_target_of_the_last_batches():
    from fp8lab.training.models import TeacherTask

    task, g = TeacherTask(seed=0), torch.Generator().manual_seed(1_000)
    squares = [float(task.batch(g, 128)[1].double().square().mean()) for _ in range(3)]
    assert constant_loss(0, steps=3, last=2) == pytest.approx(sum(squares[1:]) / 2, rel=1e-6)


def test_placement_flush_refuses_an_unknown_placement():
    with pytest.raises(ValueError, match="unknown placement"):
        placement_flush(placements=("diagonal",))
