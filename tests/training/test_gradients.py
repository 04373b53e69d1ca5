"""fp8lab.training.gradients: dy recorded over a short fp32 run, and the four FP8 choices for it measured against
hand counts (the notebook-09 lesson tests run the full lessons)."""

from __future__ import annotations

import math

import pytest
import torch

from fp8lab.numerics.formats import E4M3, E5M2
from fp8lab.numerics.scaling import PerBlock, PerTensor
from fp8lab.training.gradients import (
    DY_CHOICES,
    block_amaxes,
    dy_choice_table,
    dy_control,
    grad_recipes,
    record_dy,
    when_steps,
)


def test_when_steps_of_the_lessons_run():
    assert when_steps(150) == (0, 10, 50, 149)
    assert when_steps(20) == (0, 1, 6, 19)


def test_block_amaxes_by_hand():
    dy = torch.arange(1.0, 1 + 2 * 200).reshape(2, 200)
    dy[1, 5] = -1000.0
    assert torch.equal(block_amaxes(dy), torch.tensor([[128.0, 200.0], [1000.0, 400.0]]))


def test_the_choice_table_counts_flushes_and_blocks():
    dy = torch.full((4, 256), 1.0)
    dy[0, 0] = 2.0 ** 20  # one huge value: per tensor its scale flushes what E4M3 cannot reach below it
    t = dy_choice_table(dy)
    assert list(t.index) == [label for label, _, _ in DY_CHOICES]
    assert t.loc["E4M3 per-tensor", "blocks"] == 1 and t.loc["E4M3 1x128", "blocks"] == 4 * 2
    # E4M3 reaches 2^-9 * (2^20 / 448) ~ 4.6 at the bottom: every 1.0 flushes except where a block has its own scale
    assert t.loc["E4M3 per-tensor", "flushed"] == pytest.approx(1023 / 1024)
    assert t.loc["E4M3 1x128", "flushed"] == pytest.approx(127 / 1024)
    assert t.loc["E5M2 per-tensor", "flushed"] == 0.0  # E5M2 reaches 2^-16 * 2^20 / 57344 ~ 2.9e-4
    assert t.loc["E5M2 per-tensor", "format binades"] == E5M2.dynamic_range_binades
    assert t.loc["E4M3 1x128", "binades_used"] == 1  # every block's nonzero codes are its max: 448, one binade
    assert t.loc["E4M3 1x128", "sqnr_db"] > t.loc["E4M3 per-tensor", "sqnr_db"]


def test_the_grad_recipes_change_only_the_gradient_and_the_control_quantizes_no_gradient():
    recipes = grad_recipes()
    assert [r.name for r in recipes] == [f"dy {label}" for label, _, _ in DY_CHOICES]
    assert recipes[0].grad_output.fmt == E5M2 and recipes[0].grad_output.granularity == PerTensor()
    assert recipes[3].grad_output.fmt == E4M3 and recipes[3].grad_output.granularity == PerBlock(1, 128)
    assert all(r.input == recipes[0].input and r.weight == recipes[0].weight for r in recipes)
    control = dy_control()
    assert control.scaling("grad_output", "dgrad") is None and control.scaling("grad_output", "wgrad") is None
    assert control.scaling("input", "fprop") is not None


@pytest.mark.slow  # a 3-step fp32 run of the lesson MLP (seconds on a loaded machine)
def test_record_dy_keeps_each_linears_dy_at_the_asked_steps():
    rec = record_dy("mlp", steps=3, at=(0, 2, 7))
    assert rec.at == [0, 2]  # step 7 is beyond the run
    assert rec.layers == ["fc1", "fc2", "fc3"]
    dy = rec.snapshots[0, "fc3"]
    assert dy.shape == (128, 8)
    first = rec.ranges[(rec.ranges.step == 0) & (rec.ranges.layer == "fc3")].iloc[0]
    assert first.amax == float(dy.abs().max())
    assert first.binades == pytest.approx(math.log2(first.amax / float(dy.abs()[dy != 0].min())))
    assert len(rec.ranges) == 3 * 3 and rec.ranges.loss.gt(0).all()
    with pytest.raises(ValueError):
        record_dy("cnn")
