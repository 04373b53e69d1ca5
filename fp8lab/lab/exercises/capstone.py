"""Exercise 08 (notebook 08, the capstone): a recipe and a statistic to monitor, predicted for a model and
graded against fp8lab.inspect's report and a short training.

Public: MONITORS, check_capstone, hint_capstone, solution_capstone.
"""

from __future__ import annotations

from fp8lab.lab.exercises.base import Feedback, describe
from fp8lab.numerics.recipes import RECIPES
from fp8lab.training.capstone import CaseResult
from fp8lab.training.cost import cost_class
from fp8lab.training.readiness import ReadinessReport

__all__ = [
    "MONITORS",
    "check_capstone",
    "hint_capstone",
    "solution_capstone",
]


MONITORS = ("loss", "amax", "overflow", "underflow", "sqnr")


def _fp8_runs(result) -> list[str]:
    return [r for r in result.table.index if r in RECIPES]


def _monitor_feedback(monitor: str, result, report) -> tuple[bool, str]:
    """Would `monitor` have flagged the cheapest recipe that failed this model? Judged on the report."""
    runs = sorted(_fp8_runs(result), key=cost_class)
    failed = [r for r in runs if not result.suits(r)]
    if not failed:
        return True, ("nothing failed here, so any statistic would do; per-layer underflow stays the cheap early "
                      "warning for the day a few channels grow.")
    bad = failed[0]
    if bad not in report.recipes:
        return True, f"{bad} failed in training but was not inspected, so the report cannot judge the monitor."
    f = report.frame
    part = f[f.recipe == bad].assign(score=f[["sqnr_db", "sqnr_ordinary_db"]].min(axis=1))
    row = part.loc[part["score"].idxmin()]
    where = f"{row.layer}'s {row.gemm} {row.operand} under {bad}"
    passing = [r for r in runs if result.suits(r)]
    if monitor == "underflow":
        if row.underflow > 0.01:
            return True, f"underflow flags it from step 0: {100 * row.underflow:.1f}% of {where} flushed to zero."
        return False, f"underflow of {where} is only {100 * row.underflow:.2f}%; look at its SQNR instead."
    if monitor == "sqnr":
        if row.sqnr_db < report.target_db:
            return True, f"whole-tensor SQNR flags it: {row.sqnr_db:.1f} dB for {where}."
        return False, (f"whole-tensor SQNR of {where} reads {row.sqnr_db:.1f} dB (the outliers carry the energy) "
                       f"while {100 * row.underflow:.1f}% of its values flushed to zero: it looks fine and isn't. "
                       f"Its ordinary channels are at {row.sqnr_ordinary_db:.1f} dB.")
    if monitor == "overflow":
        if row.overflow > 0:
            return True, f"overflow flags it: {100 * row.overflow:.2f}% of {where} clipped."
        return False, (f"overflow of {where} is 0: current scaling takes the scale from the tensor's own amax, so "
                       f"nothing clips. The damage is at the other end: {100 * row.underflow:.1f}% flushed to zero.")
    if monitor == "amax":
        other = f" {passing[0]} sees the same amax and stays within the budget." if passing else ""
        return False, (f"amax shows the outliers ({row.amax:.3g} in {row.layer}) but not the damage: it is the same "
                       f"under every recipe.{other} Watch what the amax does to the other values: underflow.")
    return False, (f"the loss ends {result.evidence(bad)}: it says something is off, late and not where, while "
                   f"{100 * row.underflow:.1f}% of {where} flushed to zero from the first step.")


def check_capstone(prediction: dict, result, report) -> Feedback:
    """Grade a prediction {"recipe": ..., "monitor": ...} for one of notebook 08's models against what
    was measured: result (fp8lab.capstone.train_case) and report (fp8lab.inspect).

    recipe: within the budget (CaseResult.suits) and no recipe of a cheaper class (fp8lab.cost.
    cost_class: per-tensor < per-row < blocks) also within it. monitor (one of MONITORS): the
    per-layer statistic that would have flagged the cheapest recipe that failed, judged on the report.
    """
    if not isinstance(prediction, dict) or not {"recipe", "monitor"} <= set(prediction):
        return Feedback(False, "predict with a dict: {'recipe': 'tensorwise', 'monitor': 'underflow'}; got "
                               f"{describe(prediction)}")
    if not isinstance(result, CaseResult):
        return Feedback(False, f"pass what capstone.train_case returned as result (a CaseResult); got "
                               f"{describe(result)}")
    if not isinstance(report, ReadinessReport):
        return Feedback(False, f"pass what fp8lab.inspect returned as report (a ReadinessReport); got "
                               f"{describe(report)}")
    runs = _fp8_runs(result)
    if prediction["recipe"] is None or prediction["monitor"] is None:
        return Feedback(False, f"fill in your prediction first: a recipe ({', '.join(runs)}) and a monitor "
                               f"({', '.join(MONITORS)})")
    for key, choices in (("recipe", runs), ("monitor", MONITORS)):
        if not isinstance(prediction[key], str):
            return Feedback(False, f"the {key} is a name, a string (one of {', '.join(choices)}); got "
                                   f"{describe(prediction[key])}")
    recipe = prediction["recipe"].strip().lower()
    monitor = prediction["monitor"].strip().lower()
    if recipe not in runs:
        return Feedback(False, f"{recipe!r} was not trained here; choose from {', '.join(runs)}")
    if monitor not in MONITORS:
        return Feedback(False, f"unknown monitor {monitor!r}; choose from {', '.join(MONITORS)}")
    if not result.suits(recipe):
        skip = report.skip(recipe) if recipe in report.recipes else []
        why = f" The report flags {', '.join(skip)} for it." if skip else ""
        recipe_ok, recipe_msg = False, f"{recipe} misses the budget: {result.evidence(recipe)}.{why}"
    else:
        cheaper = [r for r in runs if result.suits(r) and cost_class(r) < cost_class(recipe)]
        if cheaper:
            recipe_ok, recipe_msg = False, (f"{recipe} works ({result.evidence(recipe)}), but {cheaper[0]} is "
                                            f"cheaper and also within the budget ({result.evidence(cheaper[0])}).")
        else:
            recipe_ok, recipe_msg = True, f"{recipe} is within the budget ({result.evidence(recipe)}) and none " \
                                          "cheaper is."
    monitor_ok, monitor_msg = _monitor_feedback(monitor, result, report)
    return Feedback(recipe_ok and monitor_ok, f"Recipe: {recipe_msg} Monitor: {monitor_msg}")


def hint_capstone() -> str:
    return ("Read the report before the training: report.heatmap() shows, per layer, which recipes keep the worst "
            "operand above the target, and report.frame has each operand's underflow beside its SQNR. Which layers "
            "have outlier channels in their input (outlier_channels > 0)? What does a per-tensor scale do to the "
            "other values of such a tensor?")


def solution_capstone(result, report) -> str:
    """The answer for this model, from what was measured: the cheapest recipe within the budget, and
    the statistic that flags the cheapest one that failed."""
    runs = sorted(_fp8_runs(result), key=cost_class)
    good = [r for r in runs if result.suits(r)]
    best = good[0] if good else "none of these: keep the flagged layers in high precision (report.skip)"
    monitors = [m for m in MONITORS if _monitor_feedback(m, result, report)[0]]
    return (f"recipe: {best} ({result.evidence(best) if good else ''}); monitor: {' or '.join(monitors)}. "
            f"inspect's whole-model pick: {report.best_recipe()} with skip={report.skip(report.best_recipe())}")
