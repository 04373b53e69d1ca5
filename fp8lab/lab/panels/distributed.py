"""Notebook 07's panels: a recipe written for torchao / TransformerEngine / torchtitan
(ExportPanel), one process against two (DistributedPanel).

Public: DistributedPanel, ExportPanel. Wiring only: the numbers come from fp8lab's functions.
"""


from __future__ import annotations

import html

import ipywidgets as W
import pandas as pd

from fp8lab.figures import plots
from fp8lab.lab.panels.base import (
    Panel,
    dropdown,
)
from fp8lab.numerics.recipes import RECIPES
from fp8lab.settings import size
from fp8lab.training.distributed import DistributedRunError, compare
from fp8lab.training.export import TARGETS, export

__all__ = ["DistributedPanel", "ExportPanel"]


class ExportPanel(Panel):
    """The recipe picked in the lab, written for torchao, TransformerEngine or torchtitan."""

    title = "take your recipe to a real training job"
    height = 0.6

    def __init__(self) -> None:
        super().__init__(recipe=dropdown([*RECIPES, "rowwise_with_gw_hp"], "mxfp8", "recipe"),
                         target=dropdown(TARGETS, "torchao", "target"))
        self._line = None  # the one line of text drawn: what another choice rewrites in place

    def compute(self, recipe, target) -> dict:
        e = export(recipe, target)
        return {"recipe": e.recipe, "target": e.target, "available": e.available, "text": e.text,
                "differences": e.differences, "source": e.source}

    @staticmethod
    def _line_of(data) -> tuple[str, str]:
        """The line drawn and its colour."""
        return (f"{data['recipe']} -> {data['target']}: {'available' if data['available'] else 'not available'}",
                plots.PALETTE[2] if data["available"] else plots.CLIP)

    def draw(self, data, ax) -> None:
        ax.set_axis_off()
        text, color = self._line_of(data)
        self._line = ax.text(0.0, 0.5, text, fontsize=11, color=color, va="center")

    def draw_in_place(self, data) -> bool:
        """Another choice: the line's text and colour set again."""
        if self._line is None:
            return False
        text, color = self._line_of(data)
        self._line.set_text(text)
        self._line.set_color(color)
        return True

    def describe(self, data) -> str:
        diff = f"<p><b>Differs from fp8lab:</b> {html.escape(data['differences'])}</p>" if data["differences"] else ""
        return (f"<pre style='font-size:12px'>{html.escape(data['text'])}</pre>{diff}"
                f"<p style='font-size:11px'>source: {html.escape(data['source'])}</p>")


class DistributedPanel(Panel):
    """One recipe trained in this process and on 2 processes (FSDP2 under torchrun), side by side."""

    title = "one process vs two (FSDP2): the same loss curve?"
    live_sliders = False  # its controls set up the next run; Run trains
    ncols, width = 2, 4.6

    def __init__(self) -> None:
        self.run_button = W.Button(description="Run", button_style="success", icon="play")
        self.log = W.Textarea(value="", layout=W.Layout(width="100%", height="120px"), disabled=True)
        super().__init__(
            recipe=dropdown([*RECIPES, "fp32"], "tensorwise", "recipe"),
            engine=dropdown(("fp8lab", "torchao"), "fp8lab", "engine"),
            amax_all_reduce=W.Checkbox(value=False, description="all-reduce amax over ranks"),
            steps=W.IntSlider(value=size(12, 4), min=2, max=40, description="steps"),
        )
        self.run_button.on_click(lambda _: self.run(blocking=False))
        self.widget.children = (*self.widget.children[:-2], W.HBox([self.run_button]), self.log,
                                *self.widget.children[-2:])
        self.result = None
        self.settings: dict | None = None  # the controls the result was run with

    def compute(self, recipe, engine, amax_all_reduce, steps) -> dict:
        df = self.result if self.result is not None else pd.DataFrame(columns=["step", "single", "distributed",
                                                                                  "abs_diff"])
        values = {"recipe": recipe, "engine": engine, "amax all-reduce": "on" if amax_all_reduce else "off",
                  "steps": str(steps)}
        # every control acts on the next run: name the ones the plot does not show yet
        pending = {k: v for k, v in values.items() if self.settings is None or self.settings.get(k) != v}
        return {"df": df, "pending": pending, "first": self.settings is None, "values": values}

    def draw(self, data, axes) -> None:
        df = data["df"]
        long = df.melt(id_vars="step", value_vars=["single", "distributed"], var_name="run", value_name="loss")
        plots.loss_curves(long, axes[0], smooth=1, title="loss: 1 process vs 2")
        if len(df):
            axes[1].plot(df["step"], df["abs_diff"].clip(lower=1e-9), marker="o", color=plots.PALETTE[3])
            axes[1].set_yscale("log")
            plots.log_axis(axes[1], "y")
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("|difference| (log)")
        axes[1].set_title("where the two runs part")
        if data["pending"]:
            head = "Press Run to train with:" if data["first"] else "Changed since this run (press Run):"
            note = "\n".join([head, *(f"{k}: {v}" for k, v in data["pending"].items())])
            axes[0].text(0.03, 0.96, note, transform=axes[0].transAxes, fontsize=8, color=plots.CLIP, va="top",
                         bbox={"facecolor": "white", "alpha": 0.9, "edgecolor": plots.CLIP, "lw": 0.5})

    def run(self, blocking: bool = True):
        """Train in this process and on 2 ranks; the workers' output streams into the log."""
        if self._thread is not None and self._thread.is_alive():
            return None

        v = self.values()
        lines: list[str] = []

        def stream(line: str) -> None:
            lines.append(line.rstrip())
            self.log.value = "\n".join(lines[-200:])

        def work():
            self.run_button.disabled = True
            try:
                self.result = compare(v["recipe"], nproc=2, steps=v["steps"], engine=v["engine"],
                                      amax_all_reduce=v["amax_all_reduce"], stream=stream)
                self.settings = self.compute(**v)["values"]
            except (DistributedRunError, ValueError) as err:
                stream(f"FAILED: {err}")
            finally:
                self.run_button.disabled = False
                self.refresh()

        thread = self._launch(work, blocking)
        return self.result if blocking else thread
