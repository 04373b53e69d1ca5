"""Exercises 02 and 03 (notebooks 02, 03): the per-tensor E4M3 scale; the amax delayed scaling uses.

Public: check_scale, hint_scale, solution_scale; check_delayed_amax, hint_delayed_amax, solution_delayed_amax.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from fp8lab.data.synthetic import FLOAT32_CPU
from fp8lab.lab.exercises.base import Feedback, as_number, call_learner, describe, not_a_function
from fp8lab.numerics.formats import E4M3
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.scaling import PerTensor

__all__ = [
    "check_delayed_amax",
    "check_scale",
    "hint_delayed_amax",
    "hint_scale",
    "solution_delayed_amax",
    "solution_scale",
]



def _scale_cases() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [
        ("a standard normal tensor", torch.randn(64, 64, generator=g, **FLOAT32_CPU)),
        ("a tensor whose largest magnitude is negative", -torch.rand(8, 8, generator=g, **FLOAT32_CPU) * 1000),
        ("a tiny tensor (|x| < 1e-3)", torch.randn(16, 16, generator=g, **FLOAT32_CPU) * 1e-4),
        ("an all-zero tensor", torch.zeros(4, 4, **FLOAT32_CPU)),
    ]


def check_scale(scale_fn: Callable[[torch.Tensor], float]) -> Feedback:
    """scale_fn(x) -> fp8lab's per-tensor E4M3 scale: the dequantization multiplier."""
    if (wrong := not_a_function(scale_fn, "check_scale(scale_fn)")) is not None:
        return wrong
    for name, x in _scale_cases():
        got, err = call_learner(scale_fn, x)
        if err:
            return Feedback(False, f"{name}: {err}")
        want = float(quantize(x, E4M3, PerTensor()).scale)
        if got is None:
            return Feedback(False, "scale_fn returned None: write the code that returns the scale.")
        got, err = as_number(got, f"the scale of x{list(x.shape)}, one number (per tensor: one scale for all of x)")
        if err:
            return Feedback(False, f"{name}: {err}.")
        if math.isclose(got, want, rel_tol=1e-5):
            continue
        amax = float(x.abs().max())
        msg = f"{name}: expected {want:.6g}, got {got:.6g}."
        if amax > 0 and math.isclose(got * want, 1.0, rel_tol=1e-4):
            msg += " That is the reciprocal: fp8lab's scale is the DEQUANTIZATION multiplier, x ~ q * scale."
        elif amax > 0 and math.isclose(got, float(x.max()) / 448, rel_tol=1e-4):
            msg += " Use the largest MAGNITUDE, max(|x|), not max(x)."
        elif amax > 0 and math.isclose(got, amax / 57344, rel_tol=1e-4):
            msg += " 57344 is E5M2's maximum; E4M3's is 448."
        elif amax == 0:
            msg += " An all-zero tensor has amax 0: fp8lab gives it scale 1 (any scale stores zeros)."
        return Feedback(False, msg)
    return Feedback(True, "scale = amax / 448, with the all-zero case handled.")


def hint_scale() -> str:
    return "Map the largest magnitude onto E4M3's largest value, 448. x ~ q * scale, so scale = ... / ... ."


def solution_scale() -> str:
    return '''def scale_fn(x):
    amax = x.abs().max().item()
    return amax / 448 if amax > 0 else 1.0     # x ~ q * scale; zeros need any scale: 1'''



def _delayed_cases():
    return [
        ("history [1, 5, 2], algo 'max'", [1.0, 5.0, 2.0], 9.0, "max", 5.0),
        ("history [1, 5, 2], algo 'most_recent'", [1.0, 5.0, 2.0], 9.0, "most_recent", 2.0),
        ("an empty history (the first step)", [], 3.0, "max", 3.0),
        ("history [4, 4], current amax 100 (a spike)", [4.0, 4.0], 100.0, "max", 4.0),
    ]


def check_delayed_amax(fn: Callable[[list[float], float, str], float]) -> Feedback:
    """fn(history, current_amax, algo) -> the amax this step's scale uses (before recording)."""
    if (wrong := not_a_function(fn, "check_delayed_amax(fn)")) is not None:
        return wrong
    for name, hist, current, algo, want in _delayed_cases():
        got, err = call_learner(fn, list(hist), current, algo)
        if err:
            return Feedback(False, f"{name}: {err}")
        if got is not None:
            answer = got
            got, err = as_number(got, f"one amax, the number this step's scale uses ({want:g} here)")
            if err:
                itself = (" - the history itself: pick one amax from it"
                          if isinstance(answer, list | tuple) and hist and list(answer) == hist else "")
                return Feedback(False, f"{name}: {err}{itself}.")
        if got is None or not math.isclose(got, want):
            msg = f"{name}: expected {want:g}, got {describe(got)}."
            if got is not None and math.isclose(got, max([*hist, current])) and hist:
                msg += " Delayed scaling uses only PAST amaxes: the current one is recorded after quantizing."
            elif hist and got is not None and math.isclose(got, sum(hist) / len(hist)):
                msg += " 'max' takes the maximum of the history, not its mean."
            elif not hist:
                msg += (" With nothing recorded yet, fp8lab calibrates on the current amax (fp8lab's convention: "
                        "TransformerEngine starts from scale 1 instead, and its first step can clip).")
            return Feedback(False, msg)
    return Feedback(True, "past amaxes only, 'max' or 'most_recent', first step calibrated on its own amax - as "
                          "fp8lab's AmaxHistory does (TransformerEngine starts from scale 1 instead).")


def hint_delayed_amax() -> str:
    return ("The point of delayed scaling: the scale is known BEFORE seeing this step's tensor. Which values "
            "can it use, then? What if the history is still empty?")


def solution_delayed_amax() -> str:
    return '''def fn(history, current_amax, algo):
    if not history:
        return current_amax      # first step: fp8lab calibrates on it (TransformerEngine starts at scale 1)
    return max(history) if algo == "max" else history[-1]'''
