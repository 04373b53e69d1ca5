"""What every exercise checker shares: Feedback (printed in the notebook) and the helpers that call a
learner's function without letting it raise.

Public: Feedback. The checkers are fp8lab.lab.exercises' other modules.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "Feedback",
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


def _call(fn: Callable, *args) -> tuple[object, str | None]:
    try:
        return fn(*args), None
    except Exception as err:  # the learner's code: report, don't raise
        return None, f"your function raised {type(err).__name__}: {err}"


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _tensor(v) -> torch.Tensor:
    return v if isinstance(v, torch.Tensor) else torch.as_tensor(v, dtype=torch.float32)
