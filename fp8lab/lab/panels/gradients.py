"""Notebook 09's panel on the gradient side: dy over training, and what each FP8 choice for it keeps (GradientPanel).

Public: GradientPanel, dy_loss_table (the shipped runs of the four choices for dy). Wiring only: dy comes from
fp8lab.training.gradients (each linear layer's output gradient in a high-precision run of the lesson MLP and of
notebook 08's LLM-like model), the statistics from its dy_choice_table, the plots from fp8lab.figures.
"""

from __future__ import annotations

import numpy as np
import torch
from matplotlib.patches import StepPatch

from fp8lab.figures import fp4 as figs
from fp8lab.figures import plots
from fp8lab.lab import redraw
from fp8lab.lab.panels.base import Panel, dropdown, memo, metrics_html, percent, selection_slider
from fp8lab.numerics.formats import E4M3, E5M2
from fp8lab.numerics.quantize import quantize
from fp8lab.settings import smoke
from fp8lab.training.gradients import DY_CHOICES, WHEN, dy_choice_table, lesson_records
from fp8lab.training.measured_fp4 import dy_control_runs, dy_runs, means

__all__ = ["GradientPanel", "dy_loss_table"]

MODEL_NAMES = {"mlp": "lesson MLP", "llm_like": "LLM-like"}


class GradientPanel(Panel):
    """dy of one linear layer at one point of training: as the chosen FP8 choice sees it (each value over its
    block's scale, against the format's window) and its range over the whole run; in the text, how far apart the
    scales of a 1x128 tiling lie (tokens differ), and every choice's flushed share and SQNR."""
    title = "the gradient side: dy over training, and what E4M3 / E5M2, per tensor / 1x128 keep of it"
    _drawn: tuple | None  # (the layer drawn, its step mark): what a drag keeps and moves
    ncols, width, height = 2, 4.2, 3.2
    keep_axes = True

    def __init__(self) -> None:
        self.records = lesson_records(0, smoke())
        layers = [(f"{MODEL_NAMES[m]}: {layer}", (m, layer)) for m, rec in self.records.items() for layer in rec.layers]
        self._tables: dict = {}  # per (model, layer, step): what every choice shares (_step)
        self._computed: dict = {}  # compute's result per (layer, when, choice): a drag back reuses it
        super().__init__(
            layer=dropdown(layers, ("llm_like", "blocks.0.qkv") if "llm_like" in self.records else layers[0][1],
                          "layer"),
            when=selection_slider(WHEN, WHEN[-1], "when"),
            choice=dropdown([c[0] for c in DY_CHOICES], "E4M3 per-tensor", "dy in"),
        )
        self._histogram_drawn: tuple | None = None  # (the stairs, what else the histogram drew): what a drag moves
        model, name = self.controls["layer"].value
        for when in WHEN:  # a drag of `when` over the layer shown first finds every step made
            self._step(model, name, self.records[model].at[WHEN.index(when)])

    SAMPLE_ROWS = 64  # rows of dy the histogram shows (all its columns): what a redraw bins

    def _step(self, model: str, name: str, step: int) -> dict:
        """What every choice shares at one layer and step: the table, the 1x128 tiles' scales, the span; made once."""

        def make() -> dict:
            dy = self.records[model].snapshots[step, name]
            a = dy.abs()
            rows = torch.linspace(0, dy.shape[0] - 1, min(self.SAMPLE_ROWS, dy.shape[0]), dtype=torch.float32,
                                  device="cpu").round().long()
            return {"dy": dy, "table": dy_choice_table(dy), "rows": rows,
                    "tiles": self._tile_span(quantize(dy, "e4m3", "1x128")),
                    "span": float(torch.log2(a.max() / a[a > 0].min())) if bool((a > 0).any()) else 0.0}

        return memo(self._tables, (model, name, step), make)

    @staticmethod
    def _tile_span(q) -> float:
        """How many binades a 1x128 tiling's scales span (one per token per 128 channels; all-zero tiles aside)."""
        s = q.scale[q.amax > 0]
        return float(torch.log2(s.max() / s.min())) if s.numel() else 0.0

    def compute(self, layer, when, choice) -> dict:
        return dict(memo(self._computed, (layer, when, choice), lambda: self._seen(layer, when, choice)))

    def _seen(self, layer, when, choice) -> dict:
        model, name = layer
        rec = self.records[model]
        step = rec.at[WHEN.index(when)]
        shared = self._step(model, name, step)
        dy, rows = shared["dy"], shared["rows"]
        _, fmt, granularity = next(c for c in DY_CHOICES if c[0] == choice)
        q = quantize(dy, fmt, granularity)
        scale = q.scale if q.scale.dim() == 0 else q.scale[rows].repeat_interleave(q.block_shape[1], 1)[:, :dy.shape[1]]
        seen = dy[rows] / scale  # sampled rows, each value as the format sees it: over its block's scale
        return {"model": model, "layer": name, "step": step, "steps": rec.steps, "choice": choice, "q": q,
                "seen": seen, "tiles": shared["tiles"], "table": shared["table"], "ranges": rec.ranges,
                "span": shared["span"], "shape": tuple(dy.shape)}

    def _histogram(self, data, ax, cleared: bool = False) -> None:
        """histogram_log2 of what the choice sees, drawn on `ax` (cleared: as a new drawing finds it), or moved in
        place where it can be."""
        parts = plots.histogram_log2_parts(data["seen"], fmt=data["q"].fmt, scale=1.0, xlim=self.HISTOGRAM_X)
        if not self._histogram_in_place(parts, data, ax):
            if not cleared:
                redraw.clear_data(ax)
            plots.histogram_log2(data["seen"], ax=ax, title=self._histogram_title(data), parts=parts)
            stairs = next(p for p in ax.patches if isinstance(p, StepPatch))
            self._histogram_drawn = (stairs, parts["spans"], parts["xlim"], parts["edges"])

    HISTOGRAM_X = (-40, 15)  # the histogram's x range (log2) shown at least

    @staticmethod
    def _histogram_title(data) -> str:
        return f"dy over its scale: {data['choice']} ({len(data['seen'])} tokens)"

    def _histogram_in_place(self, parts: dict, data, ax) -> bool:
        """The same window and bins as drawn (spans, x range, edges): the stairs take the new counts, and the y limits
        and title are set as histogram_log2 sets them; True if done."""
        drawn = self._histogram_drawn
        if drawn is None or drawn[1:3] != (parts["spans"], parts["xlim"]) or not np.array_equal(drawn[3],
                                                                                                 parts["edges"]):
            return False
        plots.move_histogram_log2(ax, drawn[0], parts, title=self._histogram_title(data))
        return True

    def draw(self, data, axes) -> None:
        self._histogram_drawn = None
        self._histogram(data, axes[0], cleared=True)
        figs.dy_range(data["ranges"], data["layer"], data["step"], {"E4M3": E4M3.dynamic_range_binades,
                                                                     "E5M2": E5M2.dynamic_range_binades}, axes[1])
        self._drawn = ((data["model"], data["layer"]), next(line for line in axes[1].lines if line.get_gid() == "mark"))

    def draw_in_place(self, data) -> bool:
        """The same layer: on the histogram the stairs move where the window and bins stay (else it is drawn again
        on its cleared axes), and on the range over training (the same for every step) only the step's mark moves,
        as dy_range draws it."""
        if self._drawn is None or self._drawn[0] != (data["model"], data["layer"]):
            return False
        self._histogram(data, self._figure[1][0])
        self._drawn[1].set_xdata([data["step"], data["step"]])
        return True

    def describe(self, data) -> str:
        t = data["table"]
        rows = {c: (f"{percent(r['flushed'])} of dy's nonzero values flushed to 0, SQNR {r['sqnr_db']:.1f} dB, "
                    f"{r['binades_used']:.0f} binades used") for c, r in t.iterrows()}
        where = f"{MODEL_NAMES[data['model']]} {data['layer']}, step {data['step']} of {data['steps']}"
        return (f"<p><b>{where}</b>: dy[{data['shape'][0]}, {data['shape'][1]}] spans {data['span']:.1f} binades "
                f"(largest over smallest nonzero); E4M3 covers 17.8, E5M2 31.8. The scales of 1x128 tiles (one per "
                f"token per 128 output channels) lie {data['tiles']:.1f} binades apart: that much of the range is "
                "between tokens.</p>" + metrics_html(rows))


def dy_loss_table():
    """The shipped gradient runs (fp8lab.training.measured_fp4.dy_runs: fp32 and the four choices for dy, forward as
    blockwise's; dy_control_runs: blockwise's forward with dy unquantized), mean of the seeds, each loss also as its
    change against fp32's, and the final loss against the control's (what quantizing the backward pass costs, the
    forward's share taken out): a DataFrame per (model, run)."""
    import pandas as pd


    runs = pd.concat([dy_runs(), dy_control_runs()])
    order = ["fp32", "dy unquantized", *[r for r in dict.fromkeys(dy_runs().run) if r != "fp32"]]
    m = means(runs).reindex([(model, r) for model in dict.fromkeys(runs.model) for r in order])
    out = m.copy()
    for col in m.columns:
        fp32 = m[col].xs("fp32", level="run")
        out[f"{col} vs fp32"] = [f"{100 * (v / fp32[model] - 1):+.2f}%" for (model, _), v in m[col].items()]
    control = m["final loss"].xs("dy unquantized", level="run")
    out["final loss vs dy unquantized"] = [f"{100 * (v / control[model] - 1):+.2f}%" if r != "fp32" else "-"
                                           for (model, r), v in m["final loss"].items()]
    out = out.rename(index={"mlp": "lesson MLP", "llm_like": "LLM-like"}, level="model")
    return out[[c for pair in zip(m.columns, [f"{c} vs fp32" for c in m.columns], strict=True) for c in pair]
               + ["final loss vs dy unquantized"]]
