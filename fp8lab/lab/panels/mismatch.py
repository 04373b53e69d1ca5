"""Notebook 06's panel on why rowwise fails: the forward and the weight-gradient GEMM see different inputs
(MismatchPanel).

Public: MismatchPanel. Wiring only: the numbers come from fp8lab.training.operands (fc2's input per recipe and
GEMM, measured now by fp8lab.inspect) and fp8lab.training.measured (the shipped training runs).
"""

from __future__ import annotations

import ipywidgets as W

from fp8lab.figures import gemms
from fp8lab.lab.panels.base import Panel, metrics_html, percent
from fp8lab.training.measured import MISMATCH_ON, MISMATCH_RUNS, mismatch
from fp8lab.training.operands import lesson_mismatch

__all__ = ["MismatchPanel"]


class MismatchPanel(Panel):
    """fc2's input in the lesson MLP with sinks at 1e6: the share each recipe's forward (fprop) and weight-gradient
    (wgrad) GEMMs flush to zero, beside each recipe's final loss and the loss of predicting the mean."""

    title = "why rowwise fails: the forward and the weight-gradient GEMM see different inputs"
    ncols, width, height = 2, 4.2, 3.2
    keep_axes = True  # the axes and their tick objects kept between the recipe lists

    def __init__(self) -> None:
        super().__init__(
            recipes=W.SelectMultiple(options=list(MISMATCH_RUNS), value=list(MISMATCH_RUNS), description="recipes",
                                     rows=3),
        )
        self._flush = None  # fc2's input per recipe and GEMM: measured once (a forward and backward pass)
        self._losses = None  # the shipped runs' losses, with the constant predictor's: read once

    def compute(self, recipes) -> dict:
        if not recipes:
            raise ValueError(f"pick at least one recipe; valid: {', '.join(MISMATCH_RUNS)}")
        if self._flush is None:
            self._flush = lesson_mismatch(MISMATCH_RUNS)
        if self._losses is None:
            self._losses = mismatch()
        losses = self._losses
        keep = [r for r in MISMATCH_RUNS if r in recipes]
        return {"flush": self._flush.loc[keep], "losses": losses[losses.run.isin(keep)],
                "all_losses": losses, "measured_on": MISMATCH_ON}

    def draw(self, data, axes) -> None:
        gemms.mismatch_flush(data["flush"], axes[0])
        gemms.mismatch_losses(data["losses"], axes[1])

    def describe(self, data) -> str:
        f, df = data["flush"], data["all_losses"]
        mean = df.groupby("run", sort=False)["loss"].mean()
        rows = {}
        for recipe in dict.fromkeys(f.index.get_level_values(0)):
            fp, wg = f.loc[(recipe, "fprop")], f.loc[(recipe, "wgrad")]
            wgrad = "high precision" if wg["format"] == "high precision" else f"{percent(wg['underflow'])} flushed"
            rows[recipe] = (f"fprop {percent(fp['underflow'])} flushed, wgrad {wgrad}; final loss {mean[recipe]:.3g} "
                            "(mean of 3 seeds)")
        rows["predicting the mean target"] = f"final loss {df.groupby('seed')['constant'].first().mean():.3g}"
        rows["training runs measured on"] = data["measured_on"]
        return metrics_html(rows)
