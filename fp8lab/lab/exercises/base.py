"""What every exercise checker shares: Feedback (printed in the notebook) and the helpers that call a
learner's function without letting it raise and read its answer as a number or a tensor, saying what it
got and what was expected where the answer is neither.

Public: Feedback, describe (an answer in a few words); for the checkers (fp8lab.lab.exercises' other
modules): not_a_function, call_learner, as_number, as_tensor, one_name_not_a_list, same_number.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "Feedback",
    "as_number",
    "as_tensor",
    "call_learner",
    "describe",
    "not_a_function",
    "one_name_not_a_list",
    "same_number",
]


@dataclass(frozen=True)
class Feedback:
    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def _repr_html_(self) -> str:
        color = "#009e73" if self.ok else "#d55e00"
        mark = "correct" if self.ok else "not yet"
        return f"<div style='color:{color}'><b>{mark}:</b> {self.message}</div>"

    def __repr__(self) -> str:
        return f"{'correct' if self.ok else 'not yet'}: {self.message}"


def describe(value: object) -> str:
    """What a learner's answer is, in a few words: None, "the string 'fc3'", "a list of 1 item(s): ['fc3']",
    "a tensor of shape (64, 64) (float32)", "the number 0.5", "a function (scale_fn)"."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return f"the bool {value}"
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"a 0-d tensor ({dtype})" if value.dim() == 0 else \
            f"a tensor of shape {tuple(value.shape)} ({dtype})"
    if isinstance(value, numbers.Number):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {_short(repr(value))}"
    if isinstance(value, list | tuple | set | frozenset | dict):
        return f"a {type(value).__name__} of {len(value)} item(s): {_short(repr(value))}"
    if callable(value):
        return f"a function ({getattr(value, '__name__', type(value).__name__)})"
    shape = getattr(value, "shape", None)
    return f"a {type(value).__name__}" + (f" of shape {tuple(shape)}" if isinstance(shape, tuple) else "")


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def not_a_function(fn: object, example: str) -> Feedback | None:
    """Feedback where `fn` is not a function (a learner passed its result, or nothing), else None."""
    if callable(fn):
        return None
    return Feedback(False, f"pass your function itself, as in {example}; got {describe(fn)}.")


def call_learner(fn: Callable, *args) -> tuple[object, str | None]:
    """A learner's function called on `args`: (its result, None), or (None, what it raised) where it raises."""
    try:
        return fn(*args), None
    except Exception as err:  # the learner's code: report, don't raise
        return None, f"your function raised {type(err).__name__}: {err}"


def as_number(value: object, what: str) -> tuple[float | None, str | None]:
    """A learner's number as a float (a Python or NumPy number, or a one-element tensor or array), or why it is
    not one: (None, "expected <what>, got <what it is>")."""
    if (isinstance(value, torch.Tensor) and value.numel() == 1) or (isinstance(value, np.ndarray) and value.size == 1):
        value = value.item()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value), None
    hint = ""
    if isinstance(value, torch.Tensor | np.ndarray):
        hint = " (one number is asked: reduce the tensor to one element, e.g. with .max(), then .item())"
    return None, f"expected {what}, got {describe(value)}{hint}"


def as_tensor(value: object, what: str) -> tuple[torch.Tensor | None, str | None]:
    """A learner's tensor (a tensor, an array, a list of numbers, a number) as a real float64 tensor, or why it
    is not one: (None, "expected <what>, got <what it is>")."""
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            return None, f"expected {what}, real numbers, got {describe(value)}"
        return value.detach().cpu().to(torch.float64), None
    if isinstance(value, np.ndarray | list | tuple | numbers.Real) and not isinstance(value, bool):
        try:
            return torch.as_tensor(np.asarray(value, dtype=np.float64)), None
        except (TypeError, ValueError, OverflowError):
            pass
    return None, f"expected {what}, got {describe(value)}"


def one_name_not_a_list(answer: object) -> str:
    """The nudge for a name wrapped in a list: "; one name, not a list: 'fc3', not ['fc3']" (else "")."""
    if isinstance(answer, list | tuple | set) and len(answer) == 1 and isinstance(next(iter(answer)), str):
        name = next(iter(answer))
        return f". One name, not a {type(answer).__name__}: {name!r}, not {answer!r}"
    return "."


def same_number(a: float, b: float) -> bool:
    """a == b, with NaN the same as NaN (a decoded code's value compared with the format's)."""
    return (math.isnan(a) and math.isnan(b)) or a == b


