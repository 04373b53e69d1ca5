"""fp8lab.lab.exercises.fp4: exercise 09 (stochastic rounding to E2M1 by hand) and 09b (the fc1 split's shares)."""

from __future__ import annotations

import torch

from fp8lab.lab.exercises.fp4 import SPLIT_TOLERANCE, check_fc1_split, check_stochastic_round, fc1_split_answer

GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)  # E2M1's magnitudes


def _stochastic(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    a = x.double().abs().clamp(max=6.0)
    hi_i = torch.searchsorted(GRID, a).clamp(max=7)
    hi = GRID[hi_i]
    lo = GRID[(hi_i - 1).clamp(min=0)]
    lo = torch.where(hi == a, hi, lo)
    p = torch.where(hi > lo, (a - lo) / (hi - lo).clamp(min=1e-30), torch.zeros_like(a))
    return torch.sign(x.double()) * torch.where(u.double() < p, hi, lo)


def test_stochastic_rounding_from_e2m1s_grid_passes_and_nearest_fails():
    assert check_stochastic_round(_stochastic)

    def nearest(x, u):
        a = x.double().abs().clamp(max=6.0)
        return torch.sign(x.double()) * GRID[(a[..., None] - GRID).abs().argmin(-1)]

    assert not check_stochastic_round(nearest)
    assert not check_stochastic_round(lambda x, u: _stochastic(x, 1 - u))  # rounds up with the wrong chance


def test_the_fc1_split_is_graded_against_the_shipped_seed_within_the_tolerance():
    want = fc1_split_answer()
    assert check_fc1_split(want["forward"], want["wgrad"])
    assert check_fc1_split(want["forward"] + 0.9 * SPLIT_TOLERANCE, want["wgrad"])
    assert not check_fc1_split(want["forward"] + 1.1 * SPLIT_TOLERANCE, want["wgrad"])
    fb = check_fc1_split(want["wgrad"], want["forward"])
    assert not fb and "swapped" in fb.message
    assert not check_fc1_split(None, None)
