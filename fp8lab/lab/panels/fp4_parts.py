"""Notebook 09's panels that show each backward part of the NVFP4 recipe doing its job.

Public: SumRoundingPanel (stochastic rounding in a GEMM's sum and over small updates), HadamardContrastPanel (the
transform on trained gradients in wgrad's layout: MXFP4 against NVFP4, to nearest and stochastic), DepthPanel
(dgrad through a chain of layers: 1-D weight copies against 2-D blocks), BackwardOnlyPanel (NVFP4 in the backward
GEMMs only, beside the full runs: shipped runs). Wiring only: the numbers come from fp8lab.training.fp4_effects and
fp8lab.training.measured_fp4.
"""

from __future__ import annotations

import html

import numpy as np
import torch

from fp8lab.figures import fp4_parts as figs
from fp8lab.lab import redraw
from fp8lab.lab.panels.base import Panel, dropdown, memo, metrics_html, percent, selection_slider
from fp8lab.settings import smoke
from fp8lab.training.fp4_effects import (
    depth_drift,
    flush_threshold,
    hadamard_contrast,
    signed_values,
    small_update,
    sum_rounding,
)
from fp8lab.training.gradients import WHEN, lesson_records
from fp8lab.training.measured_fp4 import BACKWARD_ON, backward_runs, parts
from fp8lab.training.parts import part_label

__all__ = ["BackwardOnlyPanel", "DepthPanel", "HadamardContrastPanel", "SumRoundingPanel"]

POSITIVE = (0.5, 0.75, 0.9, 0.98, 1.0)  # the share of one sign (the synthetic values)
KS = (16, 64, 256, 1024)  # the sums' lengths (the LLM-like model's batch holds 1024 tokens)
RATIOS = (0.01, 0.02, 0.03, 0.05, 0.1)  # an update over its block's largest value
STEPS = (50, 200, 1000)
SUM_SOURCES = {"the LLM-like model's head: dy at the first step": "head_first",
               "the LLM-like model's head: dy at the last step": "head_last",
               **{f"synthetic, heavy-tailed, {100 * p:g}% positive": p for p in POSITIVE}}


def _head_dy(when: str) -> torch.Tensor:
    """The LLM-like model's head dy[M, N] (tokens, classes) at the first or last recorded step (the recording notebook
    09's gradient panel shows: fp8lab.training.gradients.lesson_records)."""
    rec = lesson_records(0, smoke())["llm_like"]
    step = rec.at[0] if when == "first" else rec.at[-1]
    return rec.snapshots[step, "head"]


class SumRoundingPanel(Panel):
    """Left: a GEMM's sums (each row summed over k values, the values quantized to NVFP4 along k) against k, to
    nearest and with one stochastic draw, beside each rounding's error per value. Right: a weight updated by one
    value of a gradient block, step by step, the value a share of its block's largest."""
    title = "stochastic rounding: in a GEMM's sum, and over many small updates"
    _drawn: dict | None  # what the figure shows and the artists a drag moves (draw_in_place)
    ncols, width, height = 2, 4.2, 3.2
    keep_axes = True

    def __init__(self) -> None:
        self._sums: dict[str | float, dict] = {}
        self._updates: dict[tuple[float, int], dict] = {}  # small_update per (ratio, steps), made once each
        super().__init__(
            source=dropdown(list(SUM_SOURCES.items()), "head_first", "values"),
            k=selection_slider(list(KS), 1024, "k marked"),
            ratio=selection_slider([(f"{r:g}", r) for r in RATIOS], 0.03, "update / its block's largest"),
            steps=selection_slider(list(STEPS), 200, "steps"),
        )

    def _sum(self, source: str | float) -> dict:
        """source: "head_first", "head_last", or the share of positive synthetic values."""
        def make() -> dict:
            if isinstance(source, float):
                values = signed_values(64, KS[-1], source)
            else:  # wgrad's layout: dy^T[classes, tokens], each class's sum over the tokens
                values = _head_dy("first" if source == "head_first" else "last").t().contiguous()
            return sum_rounding(values, [k for k in KS if k <= values.shape[1]])

        return memo(self._sums, source, make)

    def compute(self, source, k, ratio, steps) -> dict:
        s = self._sum(source)
        mark = min(s["ks"], key=lambda x: abs(x - k))
        at = s["ks"].index(mark)
        update = memo(self._updates, (ratio, steps), lambda: small_update(ratio, steps))
        return {"sum": s, "k": mark, "at": {r: s["sum"][r][at] for r in ("nearest", "stochastic")},
                "update": update, "threshold": flush_threshold(), "source": source}

    @staticmethod
    def _path(update: dict) -> tuple[list, str]:
        """The right plot's three lines (exact, nearest, stochastic: numpy arrays) and its title."""
        return ([update[r].numpy() for r in ("exact", "nearest", "stochastic")],
                f"an update {update['ratio']:g} of its block's largest, each step")

    def draw(self, data, axes) -> None:
        s, u = data["sum"], data["update"]
        figs.sum_error(s["ks"], s["sum"]["nearest"], s["sum"]["stochastic"], s["per_value"], data["k"], axes[0],
                       f"sums of k values in NVFP4 ({percent(s['positive'])} of them positive)")
        lines, title = self._path(u)
        figs.weight_path(*lines, axes[1], title)
        self._drawn = {"source": data["source"], "k": data["k"], "update": u,
                       "mark": next(line for line in axes[0].lines if line.get_gid() == "mark"),
                       "path": list(axes[1].lines)}

    def draw_in_place(self, data) -> bool:
        """The same values, another k, ratio or steps: the left plot's mark moves, the right plot's three lines take
        the new path (limits from their data again, title set), as sum_error and weight_path draw them."""
        drawn = self._drawn
        if drawn is None or drawn["source"] != data["source"]:
            return False
        if data["k"] != drawn["k"]:
            drawn["mark"].set_xdata([data["k"], data["k"]])
            drawn["k"] = data["k"]
        if data["update"] is not drawn["update"]:
            ax = self._figure[1][1]
            lines, title = self._path(data["update"])
            for line, y in zip(drawn["path"], lines, strict=True):
                line.set_data(np.arange(len(y)), y)
            redraw.rescale(ax)
            ax.set_title(title, fontsize=9)
            drawn["update"] = data["update"]
        return True

    def describe(self, data) -> str:
        s, u, at = data["sum"], data["update"], data["at"]
        rows = {"values positive": percent(s["positive"]),
                "error per value": f"round to nearest {s['per_value']['nearest']:.3g}, stochastic "
                                   f"{s['per_value']['stochastic']:.3g}",
                f"error of the {s['rows']} sums of {data['k']} values": f"round to nearest {at['nearest']:.3g}, "
                                                                        f"stochastic (one draw) {at['stochastic']:.3g}",
                "NVFP4 flushes a value under this share of its block's largest": f"{data['threshold']:.4f} (0.25 / 6)",
                f"the weight's mean update over {u['steps']} steps, over the exact one":
                    f"round to nearest {u['rate']['nearest']:.3g}, stochastic {u['rate']['stochastic']:.3g}"}
        return metrics_html(rows)


class HadamardContrastPanel(Panel):
    """A trained gradient (the LLM-like model's dy, as notebook 09's gradient panel records it) in wgrad's layout,
    blocks along the tokens, quantized in NVFP4 and MXFP4, to nearest and stochastically, without and with NVFP4's
    random Hadamard transform: the relative error of dy, measured back in its own values."""
    title = "the Hadamard transform by contrast: NVFP4 against MXFP4, on trained gradients"
    live_sliders = False
    ncols, width, height = 1, 6.5, 3.2

    def __init__(self) -> None:
        self.record = lesson_records(0, smoke())["llm_like"]
        self._tables: dict = {}
        super().__init__(
            layer=dropdown(list(self.record.layers), "blocks.0.qkv", "layer (LLM-like model)"),
            when=dropdown([(w, i) for i, w in enumerate(WHEN)], len(WHEN) - 1, "when"),
        )

    def compute(self, layer, when) -> dict:
        step = self.record.at[when]
        t = memo(self._tables, (layer, step), lambda: hadamard_contrast(self.record.snapshots[step, layer]))
        return {"table": t, "layer": layer, "step": step}

    def draw(self, data, ax) -> None:
        figs.contrast_bars(data["table"], ax, f"{data['layer']}'s dy at step {data['step']}, blocks along tokens")

    def describe(self, data) -> str:
        t = data["table"]
        rows = {f"{f}, {'to nearest' if r == 'nearest' else 'stochastic'}":
                f"{t.loc[(f, r), 'without']:.3f} as it is, {t.loc[(f, r), 'with']:.3f} transformed "
                f"({100 * t.loc[(f, r), 'change']:+.0f}%)" for f, r in t.index}
        return metrics_html(rows)


DEPTHS = (1, 2, 4, 8, 16, 32)


class DepthPanel(Panel):
    """dgrad through a chain of layers, against the chain rule of the forward that ran: with 1 x c weight blocks
    each layer's dgrad multiplies by a copy of the weight other than the forward's, and the errors add up with
    depth; with c x c blocks the copy is the forward's, at every depth."""
    title = "2-D weight blocks through depth: dgrad against the chain rule"
    _drawn: tuple[str, object] | None  # (the recipe drawn, its depth mark): what a drag moves
    live_sliders = True
    ncols, width, height = 1, 6.0, 3.2
    keep_axes = True

    def __init__(self) -> None:
        self._curves: dict[str, dict] = {}
        super().__init__(
            recipe=dropdown([("NVFP4 (E2M1, blocks of 16)", "nvfp4"), ("MXFP8 (E4M3, blocks of 32)", "mxfp8")],
                           "nvfp4", "format"),
            depth=selection_slider(list(DEPTHS), 16, "depth marked"),
        )

    def _both(self, recipe: str) -> dict:
        return memo(self._curves, recipe, lambda: {
            "1d": depth_drift(DEPTHS[-1], two_d=False, recipe=recipe, width=128),
            "2d": depth_drift(DEPTHS[-1], two_d=True, recipe=recipe, width=128)})

    def compute(self, recipe, depth) -> dict:
        c = self._both(recipe)
        return {"one_d": c["1d"], "two_d": c["2d"], "depth": depth, "recipe": recipe}

    def draw(self, data, ax) -> None:
        d = list(range(1, DEPTHS[-1] + 1))
        figs.depth_curves(d, data["one_d"]["drift"], data["two_d"]["drift"], data["depth"], ax,
                          f"{data['recipe']}: a chain of 128 x 128 layers, dy sent back through it")
        self._drawn = (data["recipe"], next(line for line in ax.lines if line.get_gid() == "mark"))

    def draw_in_place(self, data) -> bool:
        """The same recipe, another depth: only the mark moves (the curves span every depth)."""
        if self._drawn is None or self._drawn[0] != data["recipe"]:
            return False
        self._drawn[1].set_xdata([data["depth"], data["depth"]])
        return True

    def describe(self, data) -> str:
        i = data["depth"] - 1
        one, two = data["one_d"], data["two_d"]
        rows = {f"after {data['depth']} layers, {one['block']} weight blocks":
                f"dx {percent(one['drift'][i])} from the chain rule's (cosine {one['cosine'][i]:.3f})",
                f"... {two['block']} weight blocks": f"{percent(two['drift'][i])} (cosine {two['cosine'][i]:.3f})",
                "the sum of 16 steps' gradients (same weights, other dy), 1-D blocks":
                    f"{percent(one['drift_mean'][i])} from the chain rule's: it does not average away"}
        return metrics_html(rows)


BACKWARD_SETS = {"none": (), "2D": ("2d_weights",), "RHT": ("hadamard",), "SR": ("stochastic_rounding",),
                 "HP": ("high_precision",), "all four": ("2d_weights", "hadamard", "stochastic_rounding",
                                                          "high_precision")}
BACKWARD_MEASURES = {"final training loss": "final loss", "held-out loss, as trained": "heldout as trained",
                     "held-out loss, trained weights in high precision": "heldout high precision"}


def backward_table(measure: str = "final loss"):
    """Per part set (BACKWARD_SETS): the full NVFP4 run's and the backward-only run's `measure` against bf16's
    (each seed against its own bf16 run, then the mean of 3 seeds), and the seeds' half-spread. DataFrame."""
    import pandas as pd


    rows = []
    for frame, kind in ((parts(), "full"), (backward_runs(), "backward only")):
        by = frame[frame.model == "mlp"].pivot_table(index="seed", columns="run", values=measure)
        rel = by.div(by["bf16"], axis=0) - 1
        for name, chosen in BACKWARD_SETS.items():
            run = part_label(chosen) + (" backward" if kind == "backward only" else "")
            rows.append({"parts": name, "kind": kind, "vs bf16": float(rel[run].mean()),
                         "spread": float(rel[run].max() - rel[run].min()) / 2})
    return pd.DataFrame(rows).pivot_table(index="parts", columns="kind", values=["vs bf16", "spread"],
                                          sort=False)


class BackwardOnlyPanel(Panel):
    """NVFP4 in every GEMM (the parts panel's runs) against NVFP4 in the backward GEMMs only, the forward GEMM in
    high precision, for no part, each part alone and all four: the lesson MLP's loss against bf16 (shipped runs,
    mean of 3 seeds)."""
    title = "the parts act in the backward pass: NVFP4 everywhere, and in the backward GEMMs only"
    live_sliders = False
    ncols, width, height = 1, 6.5, 3.2

    def __init__(self) -> None:
        super().__init__(measure=dropdown(list(BACKWARD_MEASURES.items()), "final loss", "measure"))

    def compute(self, measure) -> dict:
        t = backward_table(measure)
        return {"table": t, "measure": measure}

    def draw(self, data, ax) -> None:
        t = data["table"]
        name = next(k for k, v in BACKWARD_MEASURES.items() if v == data["measure"])
        figs.pair_bars(list(t.index), t[("vs bf16", "full")], t[("vs bf16", "backward only")],
                       ("NVFP4 in every GEMM", "NVFP4 in dgrad and wgrad only"), ax, f"{name} vs bf16",
                       "parts switched on (mean of 3 seeds); dashed: bf16")

    def describe(self, data) -> str:
        t = data["table"]
        rows = {p: f"every GEMM {100 * t.loc[p, ('vs bf16', 'full')]:+.2f}%, backward only "
                   f"{100 * t.loc[p, ('vs bf16', 'backward only')]:+.2f}% (seeds' spread "
                   f"+-{100 * t.loc[p, ('spread', 'backward only')]:.2f})" for p in t.index}
        return metrics_html(rows) + (f"<p style='font-size:11px'>backward-only runs measured on "
                                      f"{html.escape(BACKWARD_ON)}</p>")
