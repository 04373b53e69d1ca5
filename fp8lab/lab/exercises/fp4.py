"""Exercise 09 (notebook 09): stochastic rounding to E2M1, written by hand, checked against fp8lab's float64 reference
and for bias; 09b: which of fc1's GEMMs closes NVFP4's gap on the lesson MLP, measured by the learner (the fc1 split)
and graded against the shipped run.

Public: check_stochastic_round, hint_stochastic_round, solution_stochastic_round, check_fc1_split, hint_fc1_split,
solution_fc1_split, fc1_split_answer, SPLIT_TOLERANCE.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fp8lab.data.synthetic import FLOAT32_CPU
from fp8lab.lab.exercises.base import Feedback, as_number, as_tensor, call_learner, not_a_function
from fp8lab.numerics.formats import E2M1, cast, stochastic_reference
from fp8lab.training.measured_fp4 import split
from fp8lab.training.parts import split_gaps

__all__ = [
    "SPLIT_TOLERANCE",
    "check_fc1_split",
    "check_stochastic_round",
    "fc1_split_answer",
    "hint_fc1_split",
    "hint_stochastic_round",
    "solution_fc1_split",
    "solution_stochastic_round",
]


def _cases() -> tuple[torch.Tensor, torch.Tensor]:
    """Values on and between E2M1's grid points, negative ones, beyond the max, zeros; and one draw each."""
    g = torch.Generator().manual_seed(9)
    grid = E2M1.values().float()
    spread = torch.empty(4000, **FLOAT32_CPU).uniform_(-7.0, 7.0, generator=g)
    x = torch.cat([spread, grid, (grid[1:] + grid[:-1]) / 2,
                   torch.tensor([0.0, -0.0, 6.0, -6.0, 100.0, -1e9, 0.1, -0.2], **FLOAT32_CPU)])
    return x, torch.rand(x.shape, generator=g, **FLOAT32_CPU)


def check_stochastic_round(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Feedback:
    """fn(x, u) -> x rounded to E2M1 stochastically with the uniform draws u (one per element, in [0, 1)): |x| up
    to its next E2M1 value when u < (|x| - lo) / (hi - lo), else down to lo, the sign kept, beyond 6 saturated.
    Graded element by element against fp8lab's float64 reference (formats.stochastic_reference), then over many
    draws for bias."""
    if (wrong := not_a_function(fn, "check_stochastic_round(my_round)")) is not None:
        return wrong
    x, u = _cases()
    got, err = call_learner(fn, x.clone(), u.clone())
    if err:
        return Feedback(False, err)
    got, err = as_tensor(got, f"x rounded to E2M1, a tensor shaped like x {tuple(x.shape)}")
    if err:
        return Feedback(False, f"{err}.")
    got = got.float()
    if got.shape != x.shape:
        return Feedback(False, f"expected one value per element of x, shape {tuple(x.shape)}; got {tuple(got.shape)}")
    want = stochastic_reference(x, E2M1, u)
    if torch.equal(got, want):
        return Feedback(True, "every value is one of its two neighbours on E2M1's grid, the upper one with probability "
                              "its distance from the lower one over the gap: its mean over draws is x itself.")
    grid = E2M1.values().float()
    wrong = got != want
    where = int(wrong.nonzero()[0])
    example = f"x = {float(x[where]):.4g}, u = {float(u[where]):.3f}: you give {float(got[where]):.4g}, the " \
              f"reference {float(want[where]):.4g}"
    if not bool(torch.isin(got[x.abs() <= 6], torch.cat([grid, -grid])).all()):
        return Feedback(False, f"some results are not E2M1 values ({example}); round onto the grid 0, 0.5, 1, 1.5, 2, "
                               "3, 4, 6 (and their negatives).")
    if torch.equal(got, cast(x, E2M1)):
        return Feedback(False, "that is round to nearest: it ignores u, so its error is the same on every draw and "
                               "never averages out. Use u to choose between the two neighbours.")
    if torch.equal(got, stochastic_reference(x, E2M1, 1 - u)) or torch.equal(got.abs(), stochastic_reference(
            x.abs(), E2M1, 1 - u)):
        return Feedback(False, f"the probabilities are the wrong way round ({example}): round UP when u is below "
                               "(|x| - lo) / (hi - lo), so that values near hi go up most often.")
    if torch.equal(got.abs(), want.abs()):
        return Feedback(False, f"the magnitudes are right but a sign is lost ({example}): round |x|, then give it "
                               "x's sign back.")
    if bool((wrong & (x.abs() > 6)).any()) and not bool((wrong & (x.abs() <= 6)).any()):
        return Feedback(False, f"beyond 6 ({example}): E2M1 has no larger value, so clamp |x| to 6 first "
                               "(saturate, as the hardware does).")
    # the mean over many draws: a biased rule shows it whatever the grid details
    v = torch.full((20000,), 0.7, **FLOAT32_CPU)
    draws = torch.rand(v.shape, generator=torch.Generator().manual_seed(1), **FLOAT32_CPU)
    mean, err = call_learner(fn, v, draws)
    if err is None:
        mean, err = as_tensor(mean, "a tensor")
    if err is None and mean.numel() and abs(float(mean.mean()) - 0.7) > 0.02:
        return Feedback(False, f"biased: 0.7 averages to {float(mean.mean()):.3f} over 20000 draws "
                               f"(it must average to 0.7). First difference: {example}.")
    return Feedback(False, f"not the reference's rounding yet: {example}. lo is the largest E2M1 value <= |x|, hi the "
                           "next one up; compare u with (|x| - lo) / (hi - lo).")


def hint_stochastic_round() -> str:
    return ("grid = fp8lab.E2M1.values() (float64, sorted). For a = |x| clamped to 6: i = torch.searchsorted(grid, a, "
            "right=True) - 1 gives lo = grid[i] (the largest value <= a) and hi = grid[i + 1] (clamp the index at "
            "the top). Go up where u < (a - lo) / (hi - lo). Then put x's sign back (torch.copysign).")


def solution_stochastic_round() -> str:
    return '''def my_round(x, u):
    grid = fp8lab.E2M1.values()                          # 0 ... 6 and the negatives, float64, sorted
    a = x.abs().double().clamp(max=6.0)                  # saturate at E2M1's largest value
    i = torch.searchsorted(grid, a, right=True) - 1      # lo = grid[i] <= a
    lo, hi = grid[i], grid[(i + 1).clamp(max=len(grid) - 1)]
    gap = torch.where(hi > lo, hi - lo, 1.0)
    up = u.double() < (a - lo) / gap                     # up with probability (a - lo) / gap
    return torch.copysign(torch.where(up, hi, lo), x.double()).float()'''


# ---- 09b: which of fc1's GEMMs closes NVFP4's gap: a measurement ----------------------------------------------------

SPLIT_TOLERANCE = 0.1  # a reported share of the gap may be this far from the shipped seed-0 run's


def fc1_split_answer() -> dict[str, float]:
    """The share of NVFP4's final-loss gap to bf16 that fc1's forward and fc1's weight gradient, each kept in high
    precision alone, close on the lesson MLP, seed 0 (the shipped split, fp8lab.training.measured_fp4.split(), as
    fp8lab.training.parts.split_gaps reads it): keys "whole", "forward", "wgrad"."""
    t = split()
    return split_gaps(t[t.seed == 0].set_index("run"))


def check_fc1_split(forward: float, wgrad: float) -> Feedback:
    """The shares of NVFP4's gap to bf16 that fc1's forward in high precision, and fc1's weight gradient in high
    precision, each close (split_gaps of your fc1_split(seed=0)): graded against the shipped seed-0 run within
    SPLIT_TOLERANCE."""
    want = fc1_split_answer()
    got = {}
    for name, value in (("forward", forward), ("wgrad", wgrad)):
        if value is None:
            return Feedback(False, "measure first: result = fc1_split(seed=0), then split_gaps(result.table) gives "
                                   "the share of the gap each run closes; fill in forward and wgrad with those two "
                                   "numbers (None is the blank)")
        number, err = as_number(value, f"{name}: the share of the gap it closes, one number (1 closes it, 0 leaves it)")
        if err:
            return Feedback(False, err + ".")
        if number != number or abs(number) == float("inf"):
            return Feedback(False, f"{name} is {number}: a share of the gap is a finite number (1 closes it, 0 "
                                   "leaves it, below 0 widens it)")
        got[name] = number
    if any(abs(v) > 2 for v in got.values()) and all(abs(v / 100 - want[k]) <= SPLIT_TOLERANCE for k, v in got.items()):
        return Feedback(False, "those look like percentages: give shares (0.95 for 95%)")
    close = {k: abs(got[k] - want[k]) <= SPLIT_TOLERANCE for k in got}
    if all(close.values()):
        return Feedback(True, f"fc1's forward in high precision closes {100 * want['forward']:.0f}% of the gap, its "
                              f"weight gradient {100 * want['wgrad']:+.0f}% (fc1 whole: {100 * want['whole']:.0f}%; "
                              "shipped seed 0). fc1's gain is its forward pass: the 4-bit noise on every input it "
                              "reads, not the error of its weight gradient, large as that is.")
    tol = SPLIT_TOLERANCE
    if abs(got["forward"] - want["wgrad"]) <= tol and abs(got["wgrad"] - want["forward"]) <= tol:
        return Feedback(False, "the two are swapped: forward is the run named \"fc1's forward in high precision\", "
                               "wgrad the one named \"fc1's weight gradient in high precision\"")
    wrong = [k for k, ok in close.items() if not ok]
    return Feedback(False, f"{' and '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} more than "
                           f"{SPLIT_TOLERANCE:g} from the shipped run (seed 0): did you train seed 0, 150 steps, and "
                           "read split_gaps(result.table)? A share is (nvfp4 - run) / (nvfp4 - bf16) in final loss.")


def hint_fc1_split() -> str:
    return ("from fp8lab.training.parts import fc1_split, split_gaps; result = fc1_split(seed=0) trains bf16, NVFP4 "
            "1x16 and NVFP4 with fc1 whole, fc1's forward, or fc1's weight gradient in high precision (about a "
            "minute); split_gaps(result.table) gives each its share of NVFP4's gap to bf16: pass the 'forward' and "
            "'wgrad' ones.")


def solution_fc1_split() -> str:
    want = fc1_split_answer()
    return (f"forward, wgrad = {want['forward']:.2f}, {want['wgrad']:.2f}   # shipped seed 0; fc1 whole closes "
            f"{want['whole']:.2f}: the gain is fc1's forward pass, not its weight gradient")
