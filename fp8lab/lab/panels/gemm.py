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
from fp8lab.gemm import AccumulatorModel, accumulation_errors, matmul, resolve_backend
from fp8lab.lab import redraw
from fp8lab.lab.panels.base import (
    Panel,
    _metrics_html,
    _outlier_options,
    _pct,
    _select,
    _slider,
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
            recipe=_select([r for r in (*RECIPES, *VARIANTS) if r != "delayed"], "blockwise", "recipe"),
            outliers=_slider(_outlier_options(), 1e6, "outlier channels"),
        )
        self.shape = (size(128, 64), size(1024, 256))

    def compute(self, recipe, outliers) -> dict:
        x, idx = sample("normal", self.shape, outliers, seed=0, return_outliers=True)
        r = get_recipe(recipe)
        roles = {role: getattr(r, role).fmt.name.upper() for role in ("input", "weight", "grad_output")}
        return {"x": x, "outlier_channels": idx.tolist(), "views": operand_losses(x, r, idx), "recipe": r.name,
                "formats": roles}

    def draw(self, data, axes) -> None:
        for ax, gemm in zip(axes, ("fprop", "wgrad"), strict=True):
            v = data["views"][gemm]
            title = (f"{gemm}: x scaled {v['label']}" if v["values"] is not None else
                     f"{gemm}: high precision (nothing quantized)")
            gemms.flushed_map(data["x"], v["values"], ax, title=title, colorbar=redraw.kept_colorbar(ax),
                              outlier_channels=data["outlier_channels"])

    def describe(self, data) -> str:
        rows = {}
        for gemm, what in (("fprop", "forward, y = x w^T: sums over K"), ("wgrad", "weight gradient, dw = dy^T x: "
                                                                              "sums over M")):
            v = data["views"][gemm]
            rows[f"{gemm} ({what})"] = (
                "high precision: nothing flushes" if v["values"] is None else
                f"scaled {v['label']}, {v['format'].upper()}: {_pct(v['ordinary_flushed'])} of the ordinary values "
                f"flushed, SQNR {v['ordinary_sqnr_db']:.1f} dB")
        f = data["formats"]
        rows["formats by role"] = f"x {f['input']}, w {f['weight']}, dy {f['grad_output']}"
        return _metrics_html(rows)


class GemmPanel(Panel):
    """The error of an FP8 GEMM per recipe, against the exact product of the unquantized inputs."""

    title = "FP8 GEMM error per recipe (relative to the exact product)"
    keep_axes = True
    WEIGHTS: ClassVar[dict[str, str]] = {"random": "random", "zero rows for the outlier channels (sinks)": "zero rows"}

    def __init__(self) -> None:
        super().__init__(
            k=_slider([64, 256, 1024, 4096], 1024, "K"),
            outliers=_slider(_outlier_options(), 0.0, "outlier channels in a"),
            distribution=_select(DISTRIBUTIONS, "normal", "distribution"),
            weights=_select(list(self.WEIGHTS.items()), "random", "b's rows for those channels"),
        )
        self.m = size(128, 32)
        self._backends: dict[str, str] | None = None

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
        true = a.double() @ b.double()
        return {name: (torch.linalg.norm(matmul(a, b, name, verbose=False).double() - true)
                       / torch.linalg.norm(true)).item() for name in RECIPES}

    def compute(self, k, outliers, distribution, weights) -> dict:
        _, _, idx, zeroed = self.operands(k, outliers, distribution, weights)
        errs = self.errors(k, outliers, distribution, weights)
        if self._backends is None:  # decided once per machine: no need to ask again on every redraw
            self._backends = {n: resolve_backend(n).reason for n in RECIPES}
        return {"errors": errs, "backend": self._backends, "zeroed": zeroed.tolist(),
                "outlier_channels": idx.tolist(), "weights": weights}

    def draw(self, data, ax) -> None:
        errs = data["errors"]
        plots.bars(errs, ax, ylabel="relative error (log)", log=True, highlight=max(errs, key=errs.get),
                   title="error of each recipe's GEMM")
        plots.steady_limits(ax, "y")  # whole decades

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
        return head + _metrics_html({"b's rows": rows,
                                     **{n: f"{100 * v:.2f}%  ({data['backend'][n]})" for n, v in e.items()}})


class AccumulationPanel(Panel):
    """Limited-precision accumulation (Hopper's ~14 bits) and DeepSeek-V3's promotion fix."""

    title = "accumulation precision: error vs K"
    keep_axes = True

    def __init__(self) -> None:
        super().__init__(
            bits=W.IntSlider(value=14, min=8, max=24, description="accumulator bits"),
            promote=_slider([("never", 0), ("32", 32), ("64", 64), ("128", 128), ("256", 256), ("512", 512)], 128,
                            "promote to fp32 every"),
            distribution=_select(("uniform", "normal"), "uniform", "inputs"),
            measure=_select(list(self.MEASURES.items()), "frobenius", "error of"),
        )
        self.ks = [128, 256, 512, 1024] if smoke() else [128, 256, 512, 1024, 2048, 4096]
        self._curves: dict[tuple, list[float]] = {}  # (model or None for fp32, distribution, measure) -> error per K

    # what the error is measured over: the whole output, or its worst element (DeepSeek-V3's "maximum relative error")
    MEASURES: ClassVar[dict[str, str]] = {"the whole output (Frobenius norm)": "frobenius",
                                          "the worst output element (maximum)": "max"}

    def _curve(self, model: AccumulatorModel | None, distribution: str, measure: str) -> list[float]:
        """One curve (error per K), computed once per model, inputs and measure: a drag back over a value
        (or a promotion change, which leaves the unpromoted curve as it was) reuses it."""
        key = (model, distribution, measure)
        if key not in self._curves:
            if len(self._curves) > 256:
                self._curves.clear()
            self._curves[key] = [max(e, 1e-9) for e in accumulation_errors(self.ks, model, distribution,
                                                                          measure=measure)]
        return self._curves[key]

    def compute(self, bits, promote, distribution, measure) -> dict:
        # the settings go in the title, not the legend: the legend stays as the sliders move
        settings = {"fp32 accumulation": None, "no promotion": AccumulatorModel(bits - 1, 32, None)}
        if promote:
            settings["promoted to fp32"] = AccumulatorModel(bits - 1, 32, promote)
        rows = [{"accumulation": label, "K": k, "relative error": e}
                for label, model in settings.items()
                for k, e in zip(self.ks, self._curve(model, distribution, measure), strict=True)]
        return {"df": pd.DataFrame(rows), "distribution": distribution, "bits": bits, "promote": promote,
                "measure": measure}

    def draw(self, data, ax) -> None:
        every = f", promoted every {data['promote']}" if data["promote"] else ", never promoted"
        worst = "; worst element" if data["measure"] == "max" else ""
        plots.gemm_error_vs_k(data["df"], ax, title=f"{data['bits']}-bit accumulator{every}{worst}")
        plots.steady_limits(ax, "y", lo=1e-9, hi=1)  # every setting's errors (1e-9: fp32's floor)

    def describe(self, data) -> str:
        df = data["df"]
        last = df[df.K == df.K.max()].set_index("accumulation")["relative error"]
        inputs = ("uniform [0, 1): every product has the same sign, so the truncated bits add up (the worst case)"
                  if data["distribution"] == "uniform" else
                  "normal: products of both signs, so the truncated bits partly cancel")
        named = {"no promotion": f"{data['bits']}-bit, no promotion",
                 "promoted to fp32": f"{data['bits']}-bit, promoted every {data['promote']}"}
        measured = ("the worst of the 8x8 output elements, |out - exact| / |exact|: DeepSeek-V3's 'maximum relative "
                    "error'" if data["measure"] == "max" else "the whole 8x8 output, ||out - exact|| / ||exact||")
        return _metrics_html({**{f"{named.get(k, k)} at K={df.K.max()}": f"{100 * v:.3g}%" for k, v in last.items()},
                              "inputs": inputs, "error of": measured})
