"""Notebook 03's panel: delayed scaling's amax history against a spike and drift (DelayedPanel).

Public: DelayedPanel. Wiring only: the numbers come from fp8lab's functions.
"""


from __future__ import annotations

import ipywidgets as W
import pandas as pd
import torch

from fp8lab.data.synthetic import FLOAT32_CPU, activation_stream
from fp8lab.figures import plots
from fp8lab.lab import redraw
from fp8lab.lab.panels.base import (
    Panel,
    dropdown,
    memo,
    metrics_html,
    percent,
    selection_slider,
)
from fp8lab.numerics.metrics import (
    row_overflow,
    row_sqnr,
)
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.scaling import AmaxHistory, PerRow

__all__ = ["DelayedPanel"]


class DelayedPanel(Panel):
    """Delayed scaling over a stream of activations with a spike: the history's lag."""

    title = "delayed vs current scaling over training steps"
    ncols, width = 2, 4.0
    keep_axes = True

    def __init__(self) -> None:
        super().__init__(
            history=selection_slider([1, 2, 4, 8, 16, 32, 64], 16, "history length"),
            algo=dropdown(AmaxHistory.ALGOS, "max", "amax algo"),
            spike=selection_slider([(plots.magnitude(v), v) for v in (1, 2, 5, 20, 100, 1000, 1e4, 1e5)], 20,
                                   "spike (x)"),
            drift=selection_slider([0.0, 0.02, 0.05, 0.1], 0.0, "drift per step"),
            fmt=dropdown(("e4m3", "e5m2"), "e4m3", "format"),
            margin=W.IntSlider(value=0, min=0, max=4, description="margin"),
        )
        self.steps = 80  # longer than the longest history after the spike, so every length shows
        self.seed = 0  # the stream's draw (tests and the prediction's margins try others)
        # (steps, seed, spike, drift, fmt, margin) -> the stream and its current scaling: a drag of the history
        # (or back over a value) quantizes only the delayed side again
        self._current: dict[tuple, tuple] = {}

    def _stream_and_current(self, spike, drift, fmt, margin) -> tuple:
        """(steps[S, 32 * 128], current scaling's QuantizedTensor, each step's amax, each step's SQNR), cached."""
        key = (self.steps, self.seed, spike, drift, fmt, margin)

        def make() -> tuple:
            # every step as one row: per-row scaling of the stack is per-tensor scaling of each step
            steps = torch.stack(activation_stream(self.steps, (16, 128), spike_step=self.steps // 4, spike=spike,
                                                  drift=drift, seed=self.seed)).reshape(self.steps, -1)
            current = quantize(steps, fmt, PerRow(), "exact", margin)  # each step's own amax
            return steps, current, current.amax.flatten(), row_sqnr(steps, current).tolist()

        return memo(self._current, key, make)

    def compute(self, history, algo, spike, drift, fmt, margin) -> dict:
        steps, _, amax, sqnr_current = self._stream_and_current(spike, drift, fmt, margin)
        used = torch.tensor(AmaxHistory(history, algo).replay(amax.tolist()), **FLOAT32_CPU)
        delayed = quantize(steps, fmt, PerRow(), "exact", margin, amax=used[:, None])
        rows = {"step": range(self.steps), "amax": amax.tolist(), "scale amax (delayed)": used.tolist(),
                "overflow (delayed)": row_overflow(steps, delayed).tolist(),
                "sqnr delayed": row_sqnr(steps, delayed).tolist(), "sqnr current": sqnr_current}
        return {"df": pd.DataFrame(rows)}

    def draw(self, data, axes) -> None:
        df = data["df"]
        plots.amax_over_steps(df[["step", "amax", "scale amax (delayed)", "overflow (delayed)"]], axes[0])
        steps = df["step"].to_numpy()
        axes[1].plot(steps, df["sqnr current"].to_numpy(), color=plots.PALETTE[0])
        axes[1].plot(steps, df["sqnr delayed"].to_numpy(), color=plots.PALETTE[1])
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("SQNR (dB)")
        axes[1].set_title("SQNR: current (blue), delayed (orange)")
        self._steady(axes)
        self._drawn = (axes, len(df))

    @staticmethod
    def _steady(axes) -> None:
        # axes that hold every setting's data (amax 3 to 2.4e6, SQNR 0 to 32 dB): the learner sees
        # the spike grow, not the axis move
        plots.steady_limits(axes[0], "y", lo=1, hi=1e7)
        plots.steady_limits(axes[1], "y", step=10, lo=0, hi=40)

    def draw_in_place(self, data) -> bool:
        """Any control: the same steps, lines and legend; the amax, the amax used, the clipped steps and the two
        SQNR curves move, and the limits follow the data as the drawing sets them."""
        moving = self._drawn
        df = data["df"]
        if moving is None or moving[1] != len(df):
            return False
        axes = moving[0]
        redraw.move_lines(axes[0].lines, [df["amax"].to_numpy(), df["scale amax (delayed)"].to_numpy()])
        hit = df[df["overflow (delayed)"] > 0]
        redraw.move_points(axes[0].collections[0], hit["step"], hit["amax"])
        redraw.move_lines(axes[1].lines, [df["sqnr current"].to_numpy(), df["sqnr delayed"].to_numpy()])
        for ax in axes:
            ax.relim()  # as a new drawing's data set them
        self._steady(axes)
        return True

    def describe(self, data) -> str:
        df = data["df"]
        spike = self.steps // 4
        bad = df[df["overflow (delayed)"] > 0]
        low = df[df["sqnr delayed"] < df["sqnr current"] - 3]
        after = low[low.step > spike]
        return metrics_html({"steps that clipped": f"{len(bad)} ({len(bad[bad.step != spike])} besides the spike step "
                                                    f"{spike})",
                              "share of values clipped, all steps": percent(float(df["overflow (delayed)"].mean())),
                              "steps > 3 dB worse than current scaling": f"{len(low)} ({len(after)} after the spike)",
                              "worst SQNR (delayed)": f"{df['sqnr delayed'].min():.1f} dB"})
