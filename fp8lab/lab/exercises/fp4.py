"""Exercise 09 (notebook 09): stochastic rounding to E2M1, written by hand, checked against fp8lab's float64 reference
and for bias; 09b: which layer of the lesson MLP to keep in high precision, from the shipped runs.

Public: check_stochastic_round, hint_stochastic_round, solution_stochastic_round, check_keep_layer,
hint_keep_layer, solution_keep_layer, keep_layer_answer, KEEP_BUDGET.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fp8lab.lab.exercises.base import Feedback, _as_tensor, _call, _function, _one_name_not_a_list, describe
from fp8lab.numerics.formats import E2M1, cast, stochastic_reference

__all__ = [
    "KEEP_BUDGET",
    "check_keep_layer",
    "check_stochastic_round",
    "hint_keep_layer",
    "hint_stochastic_round",
    "keep_layer_answer",
    "solution_keep_layer",
    "solution_stochastic_round",
]


def _cases() -> tuple[torch.Tensor, torch.Tensor]:
    """Values on and between E2M1's grid points, negative ones, beyond the max, zeros; and one draw each."""
    g = torch.Generator().manual_seed(9)
    grid = E2M1.values().float()
    x = torch.cat([torch.empty(4000).uniform_(-7.0, 7.0, generator=g), grid, (grid[1:] + grid[:-1]) / 2,
                   torch.tensor([0.0, -0.0, 6.0, -6.0, 100.0, -1e9, 0.1, -0.2])])
    return x, torch.rand(x.shape, generator=g)


def check_stochastic_round(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Feedback:
    """fn(x, u) -> x rounded to E2M1 stochastically with the uniform draws u (one per element, in [0, 1)): |x| up
    to its next E2M1 value when u < (|x| - lo) / (hi - lo), else down to lo, the sign kept, beyond 6 saturated.
    Graded element by element against fp8lab's float64 reference (formats.stochastic_reference), then over many
    draws for bias."""
    if (wrong := _function(fn, "check_stochastic_round(my_round)")) is not None:
        return wrong
    x, u = _cases()
    got, err = _call(fn, x.clone(), u.clone())
    if err:
        return Feedback(False, err)
    got, err = _as_tensor(got, f"x rounded to E2M1, a tensor shaped like x {tuple(x.shape)}")
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
    v = torch.full((20000,), 0.7)
    mean, err = _call(fn, v, torch.rand(v.shape, generator=torch.Generator().manual_seed(1)))
    if err is None:
        mean, err = _as_tensor(mean, "a tensor")
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


# ---- 09b: which layer to keep in high precision --------------------------------------------------------------------

KEEP_BUDGET = 0.25  # at most this share of the GEMM work kept in bf16


def keep_layer_answer() -> tuple[str, dict[str, float], dict[str, float]]:
    """The layer of the lesson MLP that, kept in bf16 alone within KEEP_BUDGET of the GEMM work, brings NVFP4's final
    loss (no parts; shipped runs, mean of 3 seeds) closest to bf16's: (layer, each layer's change vs bf16, each
    layer's share of the work)."""
    from fp8lab.training.measured_fp4 import parts
    from fp8lab.training.parts import layer_costs

    t = parts()
    t = t[t.model == "mlp"].pivot_table(index="seed", columns="run", values="final loss")
    costs = layer_costs("mlp")["share of flops"].to_dict()
    change = {layer: float((t[f"nvfp4 1x16, {layer} in bf16"] / t["bf16"] - 1).mean()) for layer in costs}
    allowed = [layer for layer in costs if costs[layer] <= KEEP_BUDGET]
    return min(allowed, key=lambda layer: change[layer]), change, costs


def check_keep_layer(layer: str) -> Feedback:
    """Which one layer of the lesson MLP (fc1, fc2, fc3) kept in bf16, within KEEP_BUDGET of the GEMM work, brings
    NVFP4's final loss closest to bf16's?"""
    best, change, costs = keep_layer_answer()
    if not isinstance(layer, str):
        return Feedback(False, f"answer with one layer's name, a string (one of {', '.join(costs)}); got "
                               f"{describe(layer)}" + _one_name_not_a_list(layer))
    layer = layer.strip()
    if layer not in costs:
        return Feedback(False, f"pick one of the lesson MLP's layers: {', '.join(costs)}; got {layer!r}")
    where = ", ".join(f"{n} {100 * change[n]:+.1f}% ({100 * costs[n]:.1f}% of the work)" for n in costs)
    if costs[layer] > KEEP_BUDGET:
        return Feedback(False, f"{layer} is {100 * costs[layer]:.0f}% of the GEMM work: over the budget of "
                               f"{100 * KEEP_BUDGET:.0f}% (keeping it in bf16 gives up most of FP4's speed). {where}.")
    if layer != best:
        return Feedback(False, f"{layer} fits the budget, but another layer within it does better. {where}.")
    return Feedback(True, f"{layer}. Final loss against bf16, mean of 3 seeds: {where}.")


def hint_keep_layer() -> str:
    return ("The HighPrecisionPanel gives each layer's share of the GEMM work; the PartsPanel's shipped runs include "
            "NVFP4 with each single layer in bf16 (fp8lab.training.measured_fp4.parts(): the runs named "
            "'nvfp4 1x16, fcN in bf16').")


def solution_keep_layer() -> str:
    best, change, costs = keep_layer_answer()
    return (f"{best}: " + ", ".join(f"{n} {100 * change[n]:+.1f}% vs bf16 ({100 * costs[n]:.1f}% of the work)"
                                    for n in costs))
