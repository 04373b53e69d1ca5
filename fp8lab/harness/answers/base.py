"""What every answer of the key is: the notebook, the question verbatim, the answer with its measured numbers,
and the claims the notebook's prose makes, as booleans.

Public: Answer, KEY_PATH (notebooks/ANSWERS.md), decibels(v), lab_panel(name) (a fresh panel of the lab, as a
notebook makes it: each answer reads its numbers off one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fp8lab.lab.panels import PANELS

__all__ = ["KEY_PATH", "Answer", "decibels", "lab_panel"]

KEY_PATH = Path(__file__).resolve().parents[3] / "notebooks" / "ANSWERS.md"


@dataclass(frozen=True)
class Answer:
    """notebook: e.g. "02_per_tensor_scaling"; question: its text, verbatim from the notebook;
    answer: the answer with the measured numbers; claims: comparison -> whether it holds."""

    notebook: str
    question: str
    answer: str
    claims: dict[str, bool] = field(default_factory=dict)


def decibels(v: float) -> str:
    """A dB value as the key prints it: one decimal, and 0.0 for a value that rounds to -0.0."""
    text = f"{v:.1f}"
    return "0.0" if text == "-0.0" else text


def lab_panel(name: str):
    """A fresh fp8lab.lab.panels.PANELS[name], as its notebook builds it."""
    return PANELS[name]()
