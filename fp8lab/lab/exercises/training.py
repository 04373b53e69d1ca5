"""Exercises 06a-c (notebook 06): who survives the sinks; the longest amax history; does step 30 predict
step 150? Graded against the runs fp8lab.training.measured ships (06c: against the learner's own run).

Public: check_survivors, check_history, check_ranking (with hint_* and solution_*), history_answer,
ranking_answer.
"""

from __future__ import annotations

import numbers

from fp8lab.lab.exercises.base import Feedback, describe
from fp8lab.numerics.recipes import RECIPES
from fp8lab.training.measured import cliff, recovery, survivors
from fp8lab.training.train import BASELINES, HISTORIES

__all__ = [
    "RECOVER_WITHIN",
    "SURVIVAL_LIMIT",
    "SURVIVAL_SINKS",
    "check_history",
    "check_ranking",
    "check_survivors",
    "hint_history",
    "hint_ranking",
    "hint_survivors",
    "history_answer",
    "ranking_answer",
    "solution_history",
    "solution_ranking",
    "solution_survivors",
]


SURVIVAL_SINKS = 1e6
SURVIVAL_LIMIT = 0.05
_WHY = {
    "tensorwise": "one scale for the whole tensor is set by the 10^6 sinks: every other activation flushes to zero",
    "delayed": "per-tensor too, and its scale comes from past steps as well",
    "rowwise": "in the forward GEMM every row (token) holds the sinks, so every row's scale is theirs and fc2's "
               "ordinary inputs flush; its weight-gradient GEMM, scaled per channel, keeps them: it trains fc2 on "
               "inputs the forward pass dropped and ends worse than predicting the mean",
    "nvfp4": "E2M1 has 3.6 binades: even its 16-element blocks lose the rest of a sink's block, and it starts "
             "worse than the FP8 recipes anyway",
    "blockwise": "its 1x128 blocks along K keep the damage in the sinks' own block",
    "mxfp8": "its 1x32 blocks along K keep the damage in the sinks' own block",
}


def _names(answer) -> tuple[set[str] | None, str]:
    """The recipe names of an answer (a set, list or tuple of names, or a string of them), or why it is none."""
    if isinstance(answer, str):  # "blockwise" or "blockwise, mxfp8": names, not characters
        answer = [a for a in answer.replace(",", " ").split() if a]
    expected = "answer with a set of recipe names (strings), e.g. {'tensorwise', 'mxfp8'}"
    if not isinstance(answer, set | frozenset | list | tuple | dict):
        return None, f"{expected}; got {describe(answer)}."
    odd = next((a for a in answer if not isinstance(a, str)), None)
    if odd is not None or any(not isinstance(a, str) for a in answer):
        return None, f"{expected}; your answer holds {describe(odd)}."
    return {a.strip().lower() for a in answer}, ""


def check_survivors(answer) -> Feedback:
    """Which FP8 recipes end within 5% of their own no-outlier loss with 4 sink channels at 1e6
    (LESSON settings, mean of 3 seeds: fp8lab.training.measured)? A set of names (a string of names works)."""
    chosen, err = _names(answer)
    if chosen is None:
        return Feedback(False, err)
    if not chosen:
        return Feedback(False, "an empty set: name the recipes you found within 5% in the live panel.")
    unknown = chosen - set(RECIPES) - set(BASELINES)
    if unknown:
        return Feedback(False, f"unknown recipes {sorted(unknown)}; choose from {', '.join(RECIPES)}")
    note = ""
    if chosen & set(BASELINES):
        note = (f" ({', '.join(sorted(chosen & set(BASELINES)))} never sees the sinks - their next layer's weights "
                "are zero - so it survives trivially; the question is about the FP8 recipes.)")
    chosen -= set(BASELINES)
    truth = survivors(SURVIVAL_SINKS, SURVIVAL_LIMIT)
    wrong = chosen - truth
    if wrong:
        name = sorted(wrong)[0]
        return Feedback(False, f"{name} does not survive: {_WHY.get(name, 'its loss ends more than 5% higher')}.{note}")
    missing = truth - chosen
    if missing:
        name = sorted(missing)[0]
        return Feedback(False, f"{name} survives too: {_WHY.get(name, 'it ends within 5%')}, and in the weight-"
                               f"gradient GEMM (blocks along M) a sink channel shares its blocks with nothing else."
                               f"{note}")
    return Feedback(True, f"{' and '.join(sorted(truth))}: blocks along K keep the damage in the sinks' own block."
                          f"{note}")


def hint_survivors() -> str:
    return ("Run the TrainingPanel with the sink knob at 1e6 and again at 'none'; compare each recipe's final loss "
            "with its own. Then ask: how many values share a scale with a sink channel?")


def solution_survivors() -> str:
    return f"{sorted(survivors(SURVIVAL_SINKS, SURVIVAL_LIMIT))} - the sink cliff panel below shows the losses"


RECOVER_WITHIN = 20  # steps after the input drop


def history_answer() -> int:
    """The longest amax history (of fp8lab.training.train.HISTORIES) with which the delayed recipe brings
    fc1's input underflow back under 1% within RECOVER_WITHIN steps of the drop (fp8lab.training.measured)."""
    rec = recovery()
    if rec.empty:
        raise ValueError("fp8lab.training.measured holds no results: run `python -m fp8lab measured --write`")
    ok = [int(h) for h, n in zip(rec["history"], rec["steps_to_recover"], strict=True)
          if n is not None and n <= RECOVER_WITHIN]
    return max(ok)


def check_history(history: int) -> Feedback:
    """The longest amax history that brings fc1's input underflow back under 1% within 20 steps
    after the input shrinks 1e5-fold at step 75 (delayed recipe, algo max, margin 0)."""
    lengths = (*HISTORIES, 1024)  # the panel's lengths; 1024 (TransformerEngine's default) lags longer than 256
    if isinstance(history, bool) or not isinstance(history, numbers.Integral) or int(history) not in lengths:
        return Feedback(False, f"answer with one of the panel's history lengths, an integer: "
                               f"{', '.join(map(str, lengths))}; got {describe(history)}")
    history = int(history)
    rec = dict(zip(recovery()["history"], recovery()["steps_to_recover"], strict=True))
    best = history_answer()
    steps = rec.get(history)  # None for 1024: a longer history than one that never recovered
    took = "does not recover within the run" if steps is None else f"needs {steps} steps"
    if history == best:
        return Feedback(True, f"history {history} {took} after the drop: with algo max the scale uses the largest of "
                              f"the last {history} amaxes, and the old ones leave one per step. Longer histories ride "
                              "out one-step spikes (notebook 03); this is as long as the drop allows.")
    if history > best:
        return Feedback(False, f"history {history} {took} after the drop (more than {RECOVER_WITHIN}): the old, large "
                               "amax stays the max of the history for that many steps.")
    return Feedback(False, f"history {history} recovers in time ({steps} steps), but a longer one does too - and a "
                           "longer history is what protects against one-step spikes.")


def hint_history() -> str:
    return ("In the live panel pick only 'delayed', tick the input drop, monitor 'underflow' of 'input', and try "
            "histories. Count the steps after step 75 until fc1's line falls back to 0: how does it relate to the "
            "history length?")


def solution_history() -> str:
    return (f"{history_answer()}: with algo 'max' the delayed recipe recovers exactly `history` steps after the drop; "
            f"the longest of the panel's lengths within {RECOVER_WITHIN} steps is {history_answer()}.")


SHORT, LONG = 30, 150


def _rankings(history) -> tuple[list[str], list[str], dict, dict]:
    """The runs ordered by loss at step SHORT (mean of steps SHORT-10..SHORT-1) and at the end."""
    early = history[history.step < SHORT].groupby("run", sort=False)["loss"].apply(lambda s: s.tail(10).mean())
    final = history.groupby("run", sort=False)["loss"].apply(lambda s: s.tail(10).mean())
    return list(early.sort_values().index), list(final.sort_values().index), early.to_dict(), final.to_dict()


def ranking_answer(sinks: float = SURVIVAL_SINKS, seed: int = 0) -> tuple[bool, list[str], list[str]]:
    """From fp8lab.training.measured (LESSON settings): (same ranking?, ranking at step 30, at step 150)."""
    df = cliff()
    d = df[(df.sinks == sinks) & (df.seed == seed)]
    r30, r150 = list(d.sort_values("loss_short").run), list(d.sort_values("loss").run)
    return r30 == r150, r30, r150


def check_ranking(result, same_ranking: bool | None) -> Feedback:
    """From your own run (the live panel after >= 150 steps with >= 3 recipes, a TrainResult or its history):
    does ranking the recipes by their loss at step 30 give the same order as at step 150?"""
    import pandas as pd

    history = getattr(result, "result", result)  # a TrainingPanel, its TrainResult, or the result's history
    history = history if isinstance(history, pd.DataFrame) else getattr(history, "history", None)
    if not isinstance(history, pd.DataFrame) or not {"step", "run", "loss"} <= set(history.columns) \
            or len(history) == 0:
        got = "" if result is None else f" (got {describe(result)}, which holds no training run)"
        return Feedback(False, "train first: in the live panel pick 3 or more recipes, 150 steps, and press Start; "
                               f"then pass the panel (or its .result){got}.")
    if not (pd.api.types.is_numeric_dtype(history["loss"]) and pd.api.types.is_numeric_dtype(history["step"])):
        return Feedback(False, f"the history's step and loss columns must hold numbers (a training run's), got "
                               f"{history['step'].dtype} and {history['loss'].dtype}: pass the panel (or its .result) "
                               "after training.")
    runs = history["run"].nunique()
    last = int(history["step"].max()) + 1
    if runs < 3 or last < LONG:
        return Feedback(False, f"your run has {runs} recipes and {last} steps: the exercise needs 3 or more recipes "
                               f"and {LONG} steps.")
    if not isinstance(same_ranking, bool):
        return Feedback(False, f"answer True (the order at step 30 is the order at step 150) or False; got "
                               f"{describe(same_ranking)}.")
    r30, r150, early, final = _rankings(history[history.step < LONG])
    same = r30 == r150
    shown = (f"at step {SHORT}: {' < '.join(f'{r} {early[r]:.3g}' for r in r30)}; at step {LONG}: "
             f"{' < '.join(f'{r} {final[r]:.3g}' for r in r150)}")
    base = "fp32" if "fp32" in final else r150[0]
    flagged30 = {r for r in r30 if early[r] > 1.05 * early[base]}
    flagged150 = {r for r in r150 if final[r] > 1.05 * final[base]}
    f30, f150 = ", ".join(sorted(flagged30)) or "none", ", ".join(sorted(flagged150)) or "none"
    lesson = (f" Beyond the order: the recipes more than 5% behind {base} at step {SHORT} ({f30}) and at step "
              f"{LONG} ({f150}){' are the same' if flagged30 == flagged150 else ' differ'}: a short run flags the "
              "recipes that break; near-ties can swap.")
    if same_ranking == same:
        return Feedback(True, f"{'same' if same else 'different'} order - {shown}.{lesson}")
    return Feedback(False, f"look again: {shown}.")


def hint_ranking() -> str:
    return ("Train once for 150 steps (sinks at 1e6 makes it interesting): the loss each run had around step 30 is "
            "what a 30-step experiment would have ended at. Order the runs by it, then by the final loss.")


def solution_ranking() -> str:
    same, r30, r150 = ranking_answer()
    return (f"At sinks 1e6, seed 0 (fp8lab.training.measured): step 30 {' < '.join(r30)}; "
            f"step 150 {' < '.join(r150)} - "
            f"{'the same order' if same else 'a different order'}. Your own run decides your answer.")
