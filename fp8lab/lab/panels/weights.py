"""Notebook 06's panel on a weight's two copies: the forward GEMM reads w[N, K] scaled along K, the input-gradient
GEMM reads w^T scaled along N; with 1-D blocks the two copies hold different codes, with 2-D blocks the same
(WeightCopiesPanel).

Public: WeightCopiesPanel, WEIGHT_RECIPES (recipes with 1-D and 2-D weight blocks side by side), weight_copies (one
weight's two copies under one recipe). Wiring only: the copies come from fp8lab.nn.layer_gemms, as FP8Linear builds
them; the mismatch and the losses beside them from fp8lab.training.operands and fp8lab.training.measured.
"""

from __future__ import annotations

import torch

from fp8lab.data.synthetic import FLOAT32_CPU
from fp8lab.figures import gemms, scales
from fp8lab.lab import redraw
from fp8lab.lab.panels.base import Panel, dropdown, metrics_html, percent
from fp8lab.numerics.formats import E2M1, E4M3
from fp8lab.numerics.recipes import RECIPES, VARIANTS, Recipe, TensorScaling
from fp8lab.numerics.scaling import PerBlock
from fp8lab.training.layers import layer_gemms
from fp8lab.training.measured import cliff_means, mismatch
from fp8lab.training.models import make_model
from fp8lab.training.operands import lesson_mismatch

__all__ = ["WEIGHT_RECIPES", "WeightCopiesPanel", "weight_copies"]

# the lab's recipes, and blockwise and nvfp4 with 1-D weight blocks (along K, as their activations) for contrast
WEIGHT_RECIPES: dict[str, Recipe] = {
    "tensorwise": RECIPES["tensorwise"],
    "rowwise": RECIPES["rowwise"],
    "rowwise_with_gw_hp": VARIANTS["rowwise_with_gw_hp"],
    "blockwise, 1-D weight blocks (1x128)": RECIPES["blockwise"].replace(
        name="blockwise, 1-D weight blocks (1x128)", weight=TensorScaling(E4M3, PerBlock(1, 128))),
    "blockwise (128x128 weight blocks)": RECIPES["blockwise"],
    "mxfp8 (1x32)": RECIPES["mxfp8"],
    "nvfp4, 1-D weight blocks (1x16)": RECIPES["nvfp4"].replace(
        name="nvfp4, 1-D weight blocks (1x16)", weight=TensorScaling(E2M1, PerBlock(1, 16), "exact", E4M3,
                                                                     two_level=True)),
    "nvfp4 (16x16 weight blocks)": RECIPES["nvfp4"],
}
SHORT = {"tensorwise": "tensorwise", "rowwise": "rowwise", "rowwise_with_gw_hp": "rowwise_with_gw_hp",
         "blockwise, 1-D weight blocks (1x128)": "blockwise, 1x128 w", "blockwise (128x128 weight blocks)":
         "blockwise, 128x128 w", "mxfp8 (1x32)": "mxfp8, 1x32 w", "nvfp4, 1-D weight blocks (1x16)": "nvfp4, 1x16 w",
         "nvfp4 (16x16 weight blocks)": "nvfp4, 16x16 w"}  # the bars' labels
# the lab's own recipe behind each entry: its final loss and fc2's input mismatch in notebook 06 (None: not trained)
TRAINED = {"tensorwise": "tensorwise", "rowwise": "rowwise", "rowwise_with_gw_hp": "rowwise_with_gw_hp",
           "blockwise (128x128 weight blocks)": "blockwise", "mxfp8 (1x32)": "mxfp8",
           "nvfp4 (16x16 weight blocks)": "nvfp4"}


def weight_copies(weight: torch.Tensor, recipe: Recipe | str) -> dict:
    """weight[N, K] as `recipe`'s forward GEMM (fprop: w along K) and input-gradient GEMM (dgrad: w^T along N)
    quantize it (fp8lab.nn.layer_gemms): "fprop" and "dgrad" (the two dequantized copies, in w's layout), "differ"
    (where they hold different values: another code, or the same code under another scale), "share" (of the
    elements), "gap" (||fprop - dgrad|| / ||w||), and each copy's relative error against w ("fprop_error",
    "dgrad_error")."""
    w = weight.detach().float()
    n, k = w.shape
    g = torch.Generator().manual_seed(0)  # an activation and a gradient: any; they only shape the other operands
    x, dy = (torch.randn(16, size, generator=g, **FLOAT32_CPU) for size in (k, n))
    pairs = layer_gemms(x, w, dy, recipe)
    fprop = pairs["fprop"][1].dequantize().reshape(n, k)
    dgrad = pairs["dgrad"][1].dequantize().reshape(k, n).t()
    differ = fprop != dgrad
    norm = torch.linalg.norm(w)
    return {"fprop": fprop, "dgrad": dgrad, "differ": differ, "share": float(differ.float().mean()),
            "gap": float(torch.linalg.norm(fprop - dgrad) / norm),
            "fprop_error": float(torch.linalg.norm(fprop - w) / norm),
            "dgrad_error": float(torch.linalg.norm(dgrad - w) / norm)}


def lesson_weight(seed: int = 0) -> torch.Tensor:
    """fc2's weight of notebook 06's MLP at its initial values (1024 x 1024; its sink columns are zero)."""
    return make_model("mlp", seed, 0.0).fc2.weight.detach().clone()


def uneven_weight(shape: tuple[int, int] = (1024, 1024), spread: float = 3.0, seed: int = 0) -> torch.Tensor:
    """A weight whose rows and columns differ in size: w[i, j] = z[i, j] * 2^(a_i + b_j), z normal, a and b uniform
    in [-spread, spread] (as rows and columns of trained weights drift apart)."""
    g = torch.Generator().manual_seed(seed)
    n, k = shape
    a = (torch.rand(n, 1, generator=g, **FLOAT32_CPU) * 2 - 1) * spread
    b = (torch.rand(1, k, generator=g, **FLOAT32_CPU) * 2 - 1) * spread
    return torch.randn(n, k, generator=g, **FLOAT32_CPU) * torch.exp2(a + b) * 0.03


WEIGHTS = {"fc2 of notebook 06's MLP (its initial values)": "lesson",
           "rows and columns of different sizes": "uneven"}


class WeightCopiesPanel(Panel):
    """fc2's weight in notebook 06's MLP, as each recipe's forward and input-gradient GEMMs quantize it: where the
    two copies differ, how far apart they are, beside fc2's input mismatch and each recipe's final loss with sinks
    at 1e6."""
    title = "the weight's two copies: fprop reads w along K, dgrad along N"
    live_sliders = False  # no slider: two dropdowns, each redrawn on a change
    ncols, width, height = 2, 4.4, 3.2
    keep_axes = True

    def __init__(self) -> None:
        super().__init__(recipe=dropdown(list(WEIGHT_RECIPES), "blockwise, 1-D weight blocks (1x128)", "recipe"),
                         weight=dropdown(list(WEIGHTS.items()), "lesson", "weight"))
        self.weights = {"lesson": lesson_weight(), "uneven": uneven_weight()}
        self._copies: dict[str, dict] = {}  # per weight: every recipe's two copies, made once
        self._lesson = None  # fc2's input mismatch and the final losses, read once

    def copies(self, weight: str) -> dict[str, dict]:
        """weight_copies of the chosen weight under every WEIGHT_RECIPES entry (made once per weight)."""
        if weight not in self._copies:
            self._copies[weight] = {name: weight_copies(self.weights[weight], r) for name, r in WEIGHT_RECIPES.items()}
        return self._copies[weight]

    def lesson(self) -> dict:
        """Per trained recipe: fc2's input flushed in fprop and in wgrad at sinks 1e6 (fp8lab.inspect, one batch at
        the initial weights) and the final loss against its own no-sink run (3 seeds, shipped)."""
        if self._lesson is None:

            flush = lesson_mismatch(tuple(TRAINED.values()))
            change = cliff_means()[2]
            runs = mismatch()
            absolute = runs.groupby("run")["loss"].mean()  # the mismatch runs at 1e6: rowwise_with_gw_hp's loss
            constant = float(runs.groupby("seed")["constant"].first().mean())
            self._lesson = {}
            for entry, recipe in TRAINED.items():
                wg = flush.loc[(recipe, "wgrad")]
                self._lesson[entry] = {
                    "fprop": float(flush.loc[(recipe, "fprop"), "underflow"]),
                    "wgrad": None if wg["format"] == "high precision" else float(wg["underflow"]),
                    "loss": float(change[recipe, 1e6]) if (recipe, 1e6) in change.index else None,
                    "final": float(absolute[recipe]) if recipe in absolute.index else None, "constant": constant}
        return self._lesson

    def compute(self, recipe, weight) -> dict:
        return {"recipe": recipe, "copies": self.copies(weight), "lesson": self.lesson(), "weight": weight}

    def draw(self, data, axes) -> None:
        c = data["copies"][data["recipe"]]
        scales.weight_copies(c["differ"], axes[0], title=f"copies differ: {SHORT[data['recipe']]}",
                             colorbar=redraw.kept_colorbar(axes[0]))
        gemms.copies_bars({SHORT[name]: v["share"] for name, v in data["copies"].items()}, axes[1],
                          highlight=SHORT[data["recipe"]])

    def describe(self, data) -> str:
        rows = {}
        for name, c in data["copies"].items():
            text = (f"the copies differ in {percent(c['share'])} of the elements, by {percent(c['gap'])} of the "
                    "weight's norm")
            lesson = data["lesson"].get(name)
            if lesson is not None:
                wg = "high precision" if lesson["wgrad"] is None else f"{percent(lesson['wgrad'])} flushed"
                text += f"; fc2's input at sinks 1e6: fprop {percent(lesson['fprop'])} flushed, wgrad {wg}; "
                text += (f"final loss {lesson['final']:.3g} (predicting the mean: {lesson['constant']:.3g})"
                         if lesson["loss"] is None else
                         f"final loss {100 * lesson['loss']:+.0f}% against its own no-sink run")
            rows[name] = text
        return metrics_html(rows)
