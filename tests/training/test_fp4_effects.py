"""fp8lab.training.fp4_effects: each backward part of NVFP4 training on numbers a learner moves, checked against
E2M1's definition and the invariants the notebook-09 panels rest on."""

from __future__ import annotations

import pytest
import torch

from fp8lab.training.fp4_effects import (
    depth_drift,
    flush_threshold,
    hadamard_contrast,
    signed_values,
    small_update,
    sum_rounding,
)


def test_the_flush_threshold_is_half_e2m1s_smallest_over_its_largest():
    assert flush_threshold() == 0.25 / 6  # E2M1: smallest positive 0.5, largest 6


def test_signed_values_share_their_magnitudes_and_follow_the_sign_share():
    mixed, positive = signed_values(8, 64, 0.5), signed_values(8, 64, 1.0)
    assert torch.equal(mixed.abs(), positive.abs())
    assert (positive > 0).all()
    with pytest.raises(ValueError):
        signed_values(2, 2, 1.5)


def test_an_update_below_the_threshold_vanishes_to_nearest_and_survives_stochastically():
    below = small_update(0.02, steps=400)  # under 0.25 / 6 ~ 0.042 of its block's largest value
    assert below["rate"]["nearest"] == 0.0 and torch.all(below["nearest"] == 0)
    assert below["rate"]["stochastic"] == pytest.approx(1.0, abs=0.25)  # unbiased on average
    assert float(below["exact"][-1]) == pytest.approx(-0.02 * 400)
    exact = small_update(0.5, steps=3)  # 0.5 of the block max: an E2M1 value times the block scale
    assert exact["rate"]["nearest"] == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(ValueError):
        small_update(0.0, 3)


def test_stochastic_rounding_loses_per_value_and_wins_in_long_same_sign_sums():
    r = sum_rounding(signed_values(16, 1024, 1.0), ks=[16, 1024])
    assert r["positive"] == 1.0 and r["ks"] == [16, 1024]
    assert r["per_value"]["stochastic"] > r["per_value"]["nearest"]
    assert r["sum"]["stochastic"][-1] < r["sum"]["nearest"][-1]
    with pytest.raises(ValueError):
        sum_rounding(signed_values(2, 8, 1.0), ks=[9])


def test_the_hadamard_contrast_table_has_both_formats_and_consistent_changes():
    dy = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    dy[:2] *= 100  # two tokens dominate, as the transform's case
    t = hadamard_contrast(dy)
    assert list(t.index) == [(f, r) for f in ("NVFP4", "MXFP4") for r in ("nearest", "stochastic")]
    torch.testing.assert_close(torch.tensor(t["change"].values), torch.tensor((t["with"] / t["without"] - 1).values))
    assert (t["without"] > 0).all()


def test_two_d_weight_blocks_give_dgrad_the_forwards_own_copy():
    one_d = depth_drift(depth=3, two_d=False, width=64, steps=2)
    two_d = depth_drift(depth=3, two_d=True, width=64, steps=2)
    assert two_d["drift"] == [0.0, 0.0, 0.0]  # one copy: dgrad is the chain rule of the forward that ran
    assert all(d > 0 for d in one_d["drift"])
    assert one_d["block"] == "1x16" and two_d["block"] == "16x16"
