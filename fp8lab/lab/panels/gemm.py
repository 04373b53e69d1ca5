"""Notebook 05's panels: one activation as a layer's forward and weight-gradient GEMMs quantize it
(GemmOperandsPanel), each recipe's GEMM error (GemmPanel), accumulation precision against K (AccumulationPanel).

Public: AccumulationPanel, GemmOperandsPanel, GemmPanel. Wiring only: the numbers come from fp8lab's functions.
"""


from __future__ import annotations

from typing import ClassVar

import ipywidgets as W
import pandas as pd
import torch

from fp8lab.data.synthetic import DISTRIBUTIONS, sample
from fp8lab.figures import gemms, plots
from fp8lab.gemm import AccumulatorModel, accumulation_curves, accumulation_errors, matmul, resolve_backend
from fp8lab.gemm.accumulation import deepseek_check, operand_rounding_error
from fp8lab.lab import redraw
from fp8lab.lab.panels.base import (
    OUTLIERS,
    Panel,
    dropdown,
    memo,
    metrics_html,
    outlier_options,
    percent,
    selection_slider,
)
from fp8lab.numerics.recipes import RECIPES, VARIANTS, get_recipe
from fp8lab.settings import size, smoke
from fp8lab.training.operands import operand_losses

__all__ = ["AccumulationPanel", "GemmOperandsPanel", "GemmPanel"]


class GemmOperandsPanel(Panel):
    """One activation x[M, K] with outlier channels, quantized as a recipe's forward GEMM reads it (along K) and
    as its weight-gradient GEMM reads it (x^T, along M), shown side by side in x's layout: what each flushes."""

    title = "one activation, two GEMMs: what the forward and the weight-gradient GEMM each keep of x"
    ncols, width, height = 2, 4.2, 3.2
    keep_axes = True  # two heatmaps, their colorbars kept

    def __init__(self) -> None:
        super().__init__(
            # (delayed is left out: on one tensor its first step calibrates on the current amax, as tensorwise does)
            recipe=dropdown([r for r in (*RECIPES, *VARIANTS) if r != "delayed"], "blockwise", "recipe"),
            outliers=selection_slider(outlier_options(), 1e6, "outlier channels"),
        )
        self.shape = (size(128, 64), size(1024, 256))
        self._views: dict[tuple, dict] = {}  # (recipe, outliers) -> compute's data: a drag back only draws
        for magnitude in OUTLIERS:  # the recipe the notebook opens on, at every magnitude: its drag only draws
            self.compute(self.controls["recipe"].value, magnitude)

    def compute(self, recipe, outliers) -> dict:
        key = (recipe, outliers, self.shape)

        def make() -> dict:
            x, idx = sample("normal", self.shape, outliers, seed=0, return_outliers=True)
            r = get_recipe(recipe)
            roles = {role: getattr(r, role).fmt.name.upper() for role in ("input", "weight", "grad_output")}
            return {"x": x, "outlier_channels": idx.tolist(), "views": operand_losses(x, r, idx), "recipe": r.name,
                    "formats": roles}

        return dict(memo(self._views, key, make))

    @staticmethod
    def _titles(data) -> tuple[str, str]:
        return tuple(f"{gemm}: x scaled {v['label']}" if v["values"] is not None else
                     f"{gemm}: high precision (nothing quantized)"
                     for gemm, v in ((g, data["views"][g]) for g in ("fprop", "wgrad")))

    def draw(self, data, axes) -> None:
        for ax, title, gemm in zip(axes, self._titles(data), ("fprop", "wgrad"), strict=True):
            gemms.flushed_map(data["x"], data["views"][gemm]["values"], ax, title=title,
                              colorbar=redraw.kept_colorbar(ax), outlier_channels=data["outlier_channels"])
        self._drawn = ((self._titles(data), data["outlier_channels"], tuple(data["x"].shape)),
                        [ax.images[0] for ax in axes])

    def draw_in_place(self, data) -> bool:
        """The same titles, outlier channels and shape (an outlier magnitude dragged): the two maps' cells change,
        drawn into the same images (their colour scale is 0 to 1 whatever the data); the rest stays."""
        moving = self._drawn
        if moving is None or moving[0] != (self._titles(data), data["outlier_channels"], tuple(data["x"].shape)):
            return False
        for image, gemm in zip(moving[1], ("fprop", "wgrad"), strict=True):
            image.set_data(gemms.flushed_grid(data["x"], data["views"][gemm]["values"]))
        return True

    def describe(self, data) -> str:
        rows = {}
        for gemm, what in (("fprop", "forward, y = x w^T: sums over K"), ("wgrad", "weight gradient, dw = dy^T x: "
                                                                              "sums over M")):
            v = data["views"][gemm]
            rows[f"{gemm} ({what})"] = (
                "high precision: nothing flushes" if v["values"] is None else
                f"scaled {v['label']}, {v['format'].upper()}: {percent(v['ordinary_flushed'])} of the ordinary values "
                f"flushed, SQNR {v['ordinary_sqnr_db']:.1f} dB")
        f = data["formats"]
        rows["formats by role"] = f"x {f['input']}, w {f['weight']}, dy {f['grad_output']}"
        return metrics_html(rows)


class GemmPanel(Panel):
    """The error of an FP8 GEMM per recipe, against the exact product of the unquantized inputs."""

    title = "FP8 GEMM error per recipe (relative to the exact product)"
    keep_axes = True
    WEIGHTS: ClassVar[dict[str, str]] = {"random": "random", "zero rows for the outlier channels (sinks)": "zero rows"}

    def __init__(self) -> None:
        super().__init__(
            k=selection_slider([64, 256, 1024, 4096], 1024, "K"),
            outliers=selection_slider(outlier_options(), 0.0, "outlier channels in a"),
            distribution=dropdown(DISTRIBUTIONS, "normal", "distribution"),
            weights=dropdown(list(self.WEIGHTS.items()), "random", "b's rows for those channels"),
        )
        self.m = size(128, 32)
        self._backends: dict[str, str] | None = None
        # (k, outliers, distribution, weights) -> (each recipe's error, the outlier channels, the zeroed rows)
        self._errors: dict[tuple, tuple[dict[str, float], list[int], list[int]]] = {}

    def operands(self, k: int, outliers: float, distribution: str, weights: str, seed: int = 0):
        """a[m, k] with outlier channels (drawn with seed 1 + seed), b[k, 64] (seed 2 + seed), b's rows for the
        outlier channels zeroed if weights == "zero rows"; returns a, b, the outlier channels, the zeroed rows."""
        a, idx = sample(distribution, (self.m, k), outliers, seed=1 + seed, return_outliers=True)
        b = sample("normal", (k, 64), 0.0, seed=2 + seed)
        zeroed = idx if weights == "zero rows" else idx[:0]
        b[zeroed] = 0.0  # as LLM sinks meet weights that ignore them: the product never sees them
        return a, b, idx, zeroed

    def errors(self, k: int, outliers: float, distribution: str, weights: str, seed: int = 0) -> dict[str, float]:
        """Each recipe's GEMM error ||out - a @ b|| / ||a @ b|| on operands(...) (seed 0: the panel's)."""
        a, b, _, _ = self.operands(k, outliers, distribution, weights, seed)
        return self.recipe_errors(a, b)

    @staticmethod
    def recipe_errors(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
        """Each recipe's GEMM error ||matmul(a, b, recipe) - a @ b|| / ||a @ b||, a[m, k] @ b[k, n]."""
        true = a.double() @ b.double()
        return {name: (torch.linalg.norm(matmul(a, b, name, verbose=False).double() - true)
                       / torch.linalg.norm(true)).item() for name in RECIPES}

    def compute(self, k, outliers, distribution, weights) -> dict:
        key = (k, outliers, distribution, weights)

        def make() -> tuple:  # a drag back over a value draws it again: no sampling, no multiplying
            a, b, idx, zeroed = self.operands(k, outliers, distribution, weights)
            return self.recipe_errors(a, b), idx.tolist(), zeroed.tolist()

        errors, idx, zeroed = memo(self._errors, key, make)
        errs = dict(errors)
        if self._backends is None:  # decided once per machine: no need to ask again on every redraw
            self._backends = {n: resolve_backend(n).reason for n in RECIPES}
        return {"errors": errs, "backend": self._backends, "zeroed": list(zeroed), "outlier_channels": list(idx),
                "weights": weights}

    def draw(self, data, ax) -> None:
        errs = data["errors"]
        plots.bars(errs, ax, ylabel="relative error (log)", log=True, highlight=max(errs, key=errs.get),
                   title="error of each recipe's GEMM")
        plots.steady_limits(ax, "y")  # whole decades
        self._drawn = (ax, list(ax.patches), tuple(errs))

    def draw_in_place(self, data) -> bool:
        """The same recipes: the bars' heights and which one is highlighted move, the limits follow as the drawing
        sets them (plots.bars, steady_limits); the axes, ticks and labels stay."""
        moving = self._drawn
        errs = data["errors"]
        if moving is None or moving[2] != tuple(errs):
            return False
        ax, bars, names = moving
        redraw.move_bars(bars, [errs[n] for n in names])
        for bar, color in zip(bars, plots.bar_colors(names, highlight=max(errs, key=errs.get)), strict=True):
            bar.set_facecolor(color)
        ax.relim()  # as a new drawing's bars set them
        plots.steady_limits(ax, "y")
        return True

    def describe(self, data) -> str:
        e = data["errors"]
        head = (f"<p style='font-size:14px'><b>tensorwise {100 * e['tensorwise']:.2f}% vs blockwise "
                f"{100 * e['blockwise']:.2f}%: {e['tensorwise'] / e['blockwise']:.2g}x</b></p>")
        if data["weights"] == "zero rows":
            rows = (f"zero at {data['zeroed']} (a's outlier channels): the product never sees them" if data["zeroed"]
                    else "zero for a's outlier channels - none here: raise the outliers")
        elif data["outlier_channels"]:
            rows = "random: a's outlier channels' products dominate the output"
        else:
            rows = "random"
        return head + metrics_html({"b's rows": rows,
                                     **{n: f"{100 * v:.2f}%  ({data['backend'][n]})" for n, v in e.items()}})


class AccumulationPanel(Panel):
    """Limited-precision accumulation (Hopper's ~14 bits) and DeepSeek-V3's promotion fix, in both readings of
    DeepSeek-V3's sentence side by side (fp8lab.gemm.accumulation.ALIGNMENTS), beside what rounding the same inputs
    to E4M3 costs and DeepSeek-V3's "nearly 2%"."""

    title = "accumulation precision: error vs K, in both readings of DeepSeek-V3's sentence"
    ncols, width, height, right = 2, 4.0, 3.2, 0.3
    keep_axes = True
    READINGS: ClassVar[dict[str, str]] = {"running": "aligned with the running sum",
                                          "group": "each group aligned alone"}

    def __init__(self) -> None:
        super().__init__(
            bits=W.IntSlider(value=14, min=8, max=24, description="accumulator bits"),
            promote=selection_slider([("never", 0), ("32", 32), ("64", 64), ("128", 128), ("256", 256), ("512", 512)],
                                     128, "promote to fp32 every"),
            distribution=dropdown(("uniform", "normal"), "uniform", "inputs"),
            measure=dropdown(list(self.MEASURES.items()), "frobenius", "error of"),
        )
        self.ks = [128, 256, 512, 1024] if smoke() else [128, 256, 512, 1024, 2048, 4096]
        self._curves: dict[tuple, list[float]] = {}  # (model or None for fp32, distribution, measure) -> error per K
        self._check = None  # both readings against DeepSeek-V3's 2% at K = 4096, 14 bits: computed once

    # what the error is measured over: the whole output, or its worst element (DeepSeek-V3's "maximum relative error")
    MEASURES: ClassVar[dict[str, str]] = {"the whole output (Frobenius norm)": "frobenius",
                                          "the worst output element (maximum)": "max"}

    def _curves_for(self, models: list, distribution: str, measure: str) -> list[list[float]]:
        """One curve (error per K) per model, computed once per model, inputs and measure: a drag back over a value
        (or a promotion change, which leaves the unpromoted curve as it was) reuses it. The models not met yet walk
        together (accumulation_curves). model "inputs": what rounding the inputs to E4M3 costs (no accumulation
        error at all); None: fp32 accumulation."""
        missing = [m for m in dict.fromkeys(models) if (m, distribution, measure) not in self._curves]
        if len(self._curves) + len(missing) > 256:
            self._curves.clear()
            missing = list(dict.fromkeys(models))
        walked = [m for m in missing if isinstance(m, AccumulatorModel)]
        walks = accumulation_curves(self.ks, walked, distribution)  # one walk, every measure's curves
        self._curves.update({(m, distribution, other): [max(e, 1e-9) for e in errors]
                             for other, curves in walks.items() for m, errors in zip(walked, curves, strict=True)})
        found = dict(zip(walked, walks[measure], strict=True))
        for m in missing:
            if m == "inputs":
                found[m] = [operand_rounding_error(k, distribution, measure=measure) for k in self.ks]
            elif m is None:
                found[m] = accumulation_errors(self.ks, None, distribution, measure=measure)
            self._curves[(m, distribution, measure)] = [max(e, 1e-9) for e in found[m]]
        return [self._curves[(m, distribution, measure)] for m in models]

    def compute(self, bits, promote, distribution, measure) -> dict:
        settings = {}
        for alignment in self.READINGS:
            # the settings go in the title, not the legend: the legend stays as the sliders move
            settings[alignment] = {"fp32 accumulation": None,
                                   "no promotion": AccumulatorModel(bits - 1, 32, None, alignment)}
            if promote:
                settings[alignment]["promoted to fp32"] = AccumulatorModel(bits - 1, 32, promote, alignment)
            settings[alignment]["E4M3 rounding of the inputs"] = "inputs"
        models = [model for shown in settings.values() for model in shown.values()]
        curves = iter(self._curves_for(models, distribution, measure))
        frames, errors = {}, {}
        for alignment, shown in settings.items():
            errors[alignment] = {label: next(curves) for label in shown}  # the error per K of each setting shown
            rows = [{"accumulation": label, "K": k, "relative error": e}
                    for label in shown for k, e in zip(self.ks, errors[alignment][label], strict=True)]
            frames[alignment] = pd.DataFrame(rows)
        if self._check is None:
            self._check = deepseek_check()
        return {"frames": frames, "df": frames["running"], "errors": errors, "distribution": distribution,
                "bits": bits, "promote": promote, "measure": measure, "check": self._check}

    def draw(self, data, axes) -> None:
        for ax, (alignment, df) in zip(axes, data["frames"].items(), strict=True):
            # the title stays put (it is drawn with the kept background); the settings go in the plot
            plots.gemm_error_vs_k(df, ax, title=self.READINGS[alignment], dashed=("E4M3 rounding of the inputs",),
                                  reference={"DeepSeek-V3: nearly 2%": 0.02}, legend=alignment == "group")
            ax.text(0.03, 0.04, self._settings(data), transform=ax.transAxes, fontsize=8)
            plots.steady_limits(ax, "y", lo=1e-12, hi=10)  # every setting's errors, and room for the legend below
        # what a drag moves: each axes' lines (one per setting, in the frame's order) and its settings' text
        self._drawn = (self._curves_shown(data), [(ax, ax.lines[:len(df["accumulation"].unique())], ax.texts[-1])
                                                  for ax, df in zip(axes, data["frames"].values(), strict=True)])

    @staticmethod
    def _settings(data) -> str:
        every = f"promoted every {data['promote']}" if data["promote"] else "never promoted"
        return f"{data['bits']}-bit accumulator, {every}"

    @staticmethod
    def _curves_shown(data) -> tuple:
        return tuple(tuple(errors) for errors in data["errors"].values())

    def draw_in_place(self, data) -> bool:
        """The same settings shown (promotion on or off as drawn): the curves and the settings' text move, the
        limits follow as the drawing sets them; the axes, ticks, titles and legend stay."""
        moving = self._drawn
        if moving is None or moving[0] != self._curves_shown(data):
            return False
        for (ax, lines, text), errors in zip(moving[1], data["errors"].values(), strict=True):
            redraw.move_lines(lines, list(errors.values()))  # in the frame's order, as the drawing's lines
            text.set_text(self._settings(data))
            ax.relim()  # as a new drawing's data set them
            plots.steady_limits(ax, "y", lo=1e-12, hi=10)
        return True

    def describe(self, data) -> str:
        k = max(self.ks)
        rows = {}
        named = {"no promotion": f"{data['bits']}-bit, no promotion",
                 "promoted to fp32": f"{data['bits']}-bit, promoted every {data['promote']}",
                 "fp32 accumulation": "fp32"}
        for alignment, errors in data["errors"].items():
            at_k = {name: e[self.ks.index(k)] for name, e in errors.items()}
            rows[f"{self.READINGS[alignment]}, at K={k}"] = ", ".join(
                f"{named.get(name, name)} {100 * v:.3g}%" for name, v in at_k.items())
        rows["inputs"] = ("uniform [0, 1): every product has the same sign, so the truncated bits add up"
                          if data["distribution"] == "uniform" else
                          "normal: products of both signs, so the truncated bits partly cancel")
        rows["error of"] = ("the worst of the 8x8 output elements, |out - exact| / |exact|: DeepSeek-V3's 'maximum "
                            "relative error'" if data["measure"] == "max" else
                            "the whole 8x8 output, ||out - exact|| / ||exact||")
        c = data["check"]
        verdicts = {}
        for r in c.itertuples():
            over = "worst element" if r.measure == "max" else "whole output"
            head = f"{self.READINGS[r.alignment]}, {r.inputs} inputs, {over}"
            ratio = r.vs_deepseek
            how = "meets it" if r.meets else f"{ratio:.2g}x above it" if ratio > 1 else f"{1 / ratio:.2g}x below it"
            verdicts[head] = f"{100 * r.error:.3g}% ({how}; rounding the inputs: {100 * r.operand_rounding:.3g}%)"
        table = metrics_html(verdicts)
        return (metrics_html(rows) + "<p><b>Against DeepSeek-V3's \"nearly 2%\"</b> (K=4096, 14 bits, no promotion; "
                "meets: within 1.5x of 2%)</p>" + table)
