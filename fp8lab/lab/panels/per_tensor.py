"""Notebook 02's panels: one scale per tensor against outlier channels (PerTensorPanel), the outlier
cliff per recipe (CliffPanel).

Public: CliffPanel, PerTensorPanel. Wiring only: the numbers come from fp8lab's functions.
"""


from __future__ import annotations

import math

import ipywidgets as W
import pandas as pd
import torch

from fp8lab.data.synthetic import DISTRIBUTIONS, OUTLIER_TOKENS, sample
from fp8lab.figures import plots
from fp8lab.lab.panels.base import (
    CLIFF_RECIPES,
    ELEMENT_FORMATS,
    OUTLIERS,
    RULES,
    Panel,
    dropdown,
    memo,
    metrics_html,
    outlier_options,
    percent,
    selection_slider,
    torch_threads,
)
from fp8lab.numerics.metrics import (
    channel_sqnr,
    flushed_fraction,
    quantization_report,
)
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.recipes import RECIPES
from fp8lab.numerics.scaling import PerTensor
from fp8lab.settings import size
from fp8lab.training.operands import operand_losses
from fp8lab.training.published import PUBLISHED, measured_at, outlier_multiplier

__all__ = ["CliffPanel", "PerTensorPanel"]

# where the outliers sit (fp8lab.data.synthetic.OUTLIER_PLACEMENTS), as a control names them
PLACED = (("4 channels, every token", "channels"), (f"4 channels, first {OUTLIER_TOKENS} tokens", "tokens"),
          ("both, in 4 channels each", "both"))


class PerTensorPanel(Panel):
    """One scale for the whole tensor: the histogram of |x| against the format's window, and
    what it costs the ordinary values (every channel but the outlier channels)."""

    title = "per-tensor scaling: what lands in the window, what clips, what flushes"
    left = 1.0  # the counts' labels reach 100000
    keep_axes = True
    XLIM = (-30, 40)  # an x axis that holds every setting's values and window: they move, not the axis

    def __init__(self) -> None:
        super().__init__(
            distribution=dropdown(DISTRIBUTIONS, "normal", "distribution"),
            outliers=selection_slider(outlier_options(), 0.0, "outlier channels"),
            placement=dropdown(PLACED, "channels", "outliers in"),
            fmt=dropdown(ELEMENT_FORMATS, "e4m3", "format"),
            rule=dropdown(RULES, "exact", "scale rule"),
            margin=W.IntSlider(value=0, min=0, max=6, description="margin (powers of 2)"),
            normalize=W.Checkbox(value=False, description="divide each channel by its amax first"),
        )
        self.shape = (size(128, 64), size(1024, 256))
        self._samples: dict[tuple, tuple] = {}  # (distribution, outliers, placement, normalize, shape) -> (x, idx)

    def compute(self, distribution, outliers, placement, fmt, rule, margin, normalize) -> dict:
        key = (distribution, outliers, placement, normalize, self.shape)

        def make() -> tuple:  # a drag of the margin (or back over a value) draws no new sample
            x, idx = sample(distribution, self.shape, outliers, return_outliers=True, placement=placement)
            if normalize:  # the tensor the cast sees, outlier channels included: x[:, c] / amax_c (the factors go to
                # the next layer's weights' columns, as SmoothQuant folds them, or are an input feature's
                # normalization)
                x = x / x.abs().amax(0).clamp(min=torch.finfo(torch.float32).tiny)
            return x, idx

        x, idx = memo(self._samples, key, make)
        q = quantize(x, fmt, PerTensor(), rule, margin)
        return {"x": x, "q": q, "outlier_channels": idx, "report": quantization_report(x, q, idx), "margin": margin,
                "normalized": normalize, "placement": placement}

    def draw(self, data, ax) -> None:
        plots.histogram_log2(data["x"], data["q"], ax=ax, xlim=self.XLIM)
        self._drawn = (ax, data["q"].fmt.name, ax.patches[:4], ax.patches[4])  # the 4 shaded spans, the histogram

    def draw_in_place(self, data) -> bool:
        """The same format (the same legend): the shaded window, the histogram, the x range and the title move,
        the count axis follows as histogram_log2 sets it (histogram_log2_parts: the same numbers)."""
        moving = self._drawn
        if moving is None or moving[1] != data["q"].fmt.name:
            return False
        ax, _, spans, stairs = moving
        parts = plots.histogram_log2_parts(data["x"], data["q"], xlim=self.XLIM)
        for span, (x0, x1, *_) in zip(spans, parts["spans"], strict=True):
            span.set_x(x0)
            span.set_width(x1 - x0)
        ax.set_xlim(*parts["xlim"])
        plots.move_histogram_log2(ax, stairs, parts)
        return True

    def describe(self, data) -> str:
        r = data["report"]
        idx = data["outlier_channels"]
        if idx.dtype == torch.bool:  # a few tokens' outliers: a mask of x's shape
            n = int(idx.sum())
            ordinary = f"ordinary values ({'all of them' if n == 0 else f'all but the {n} outliers'})"
        else:
            n = len(idx)
            ordinary = f"ordinary values ({'all channels' if n == 0 else f'all but the {n} outlier channels'})"
        if data["normalized"]:
            ordinary += ", each channel divided by its amax"
        head = (f"<p style='font-size:14px'><b>{ordinary}: SQNR {r['ordinary_sqnr_db']:.1f} dB "
                f"(each channel counts alike), {percent(r['ordinary_underflow'])} flushed to 0</b></p>")
        q = data["q"]
        fmt = q.fmt
        rule = {"exact": f"amax / {fmt.max_value:g}", "rceil": f"2^ceil(log2(amax / {fmt.max_value:g}))",
                "floor": f"2^(floor(log2 amax) - {math.floor(math.log2(fmt.max_value))})"}[q.scale_rule]
        margin = f" x 2^{data['margin']}" if data["margin"] else ""  # what compute used, not the control
        return head + metrics_html({"outliers in": dict((v, k) for k, v in PLACED)[data["placement"]],
                                     "amax": f"{r['amax']:.4g}",
                                     f"scale = {rule}{margin}": f"{float(q.scale):.4g}",
                                     "SQNR, whole tensor (energy-weighted: the largest values decide it)":
                                     f"{r['sqnr_db']:.1f} dB",
                                     "overflow (clipped)": percent(r["overflow"]),
                                     "underflow, whole tensor (flushed to 0)": percent(r["underflow"]),
                                     "subnormal": percent(r["subnormal"])})


class CliffPanel(Panel):
    """Outlier magnitude from none to 1e7 against each recipe's activation scaling: the cliff
    where ordinary values start to flush, per recipe, with the outliers in every token's channels or in a few
    tokens' channels, and the activation as the forward GEMM reads it (along K) or the weight-gradient GEMM
    (along M). Every table its controls offer is measured when the panel is made (about a second at workshop
    size, once), so that a click only draws."""

    title = "the outlier cliff: each recipe's activation scaling against outlier magnitude"
    width, height = 6.4, 3.4
    keep_axes = True

    def __init__(self) -> None:
        super().__init__(
            measure=dropdown([("SQNR of ordinary channels", "ordinary_sqnr_db"),
                             ("share of ordinary values flushed", "ordinary_underflow")],
                            "ordinary_sqnr_db", "measure"),
            distribution=dropdown(DISTRIBUTIONS[:4], "normal", "distribution"),
            placement=dropdown(PLACED, "channels", "outliers in"),
            gemm=dropdown([("forward (x along K)", "fprop"), ("weight gradient (x along M)", "wgrad")], "fprop",
                         "GEMM"),
            recipes=W.SelectMultiple(options=list(CLIFF_RECIPES), value=list(CLIFF_RECIPES), description="recipes",
                                     rows=5),
        )
        self.shape = (size(64, 32), size(1024, 256))
        self._cache: dict[tuple[str, str, str], pd.DataFrame] = {}
        self._published: dict[tuple[str, str, str], pd.DataFrame] = {}
        with torch_threads(1):  # every table a click can ask for, built once here (small tensors: one thread)
            for key in self.keys():
                self.table(*key)
                self.published(*key)

    def keys(self) -> list[tuple[str, str, str]]:
        """Every (distribution, placement, gemm) the controls offer, the default placement and GEMM first."""
        def values(name: str) -> list[str]:
            return [o[1] if isinstance(o, tuple) else o for o in self.controls[name].options]

        return [(d, p, g) for p in values("placement") for g in values("gemm") for d in values("distribution")]

    @staticmethod
    def _measured(x: torch.Tensor, idx: torch.Tensor, name: str, gemm: str) -> dict[str, float]:
        """The ordinary values' SQNR and flushed share of x as recipe `name`'s fprop or wgrad GEMM reads it."""
        if gemm == "fprop":
            deq = quantize(x, RECIPES[name].input).dequantize()  # fprop's activation operand, along K
            return {"ordinary_sqnr_db": channel_sqnr(x, deq, idx), "ordinary_underflow": flushed_fraction(x, deq, idx)}
        seen = operand_losses(x, name, idx, gemms=("wgrad",))["wgrad"]  # x^T along M, back in x's layout
        return {"ordinary_sqnr_db": seen["ordinary_sqnr_db"], "ordinary_underflow": seen["ordinary_flushed"]}

    def published(self, distribution: str, placement: str = "channels", gemm: str = "fprop") -> pd.DataFrame:
        """Every recipe at the outlier magnitude of each published ratio measured at `placement` (fp8lab.training.
        published: the largest outlier that many times the median of the other channels): columns label, ratio,
        outliers, recipe, ordinary_sqnr_db, ordinary_underflow."""

        key = (distribution, placement, gemm)
        if key not in self._published:
            rows = []
            for pub in (p for p in PUBLISHED if measured_at(p, placement)):
                magnitude = outlier_multiplier(pub.ratio, distribution, self.shape, placement=placement)
                x, idx = sample(distribution, self.shape, magnitude, return_outliers=True, placement=placement)
                for name in CLIFF_RECIPES:
                    rows.append({"label": pub.label, "ratio": pub.ratio, "outliers": magnitude, "recipe": name,
                                 **self._measured(x, idx, name, gemm)})
            self._published[key] = pd.DataFrame(rows, columns=["label", "ratio", "outliers", "recipe",
                                                               "ordinary_sqnr_db", "ordinary_underflow"])
        return self._published[key]

    def table(self, distribution: str, placement: str = "channels", gemm: str = "fprop") -> pd.DataFrame:
        """Every recipe at every outlier magnitude (1: none): SQNR of the ordinary channels and the
        share of ordinary values flushed to zero (none of these recipes' rules clips)."""
        key = (distribution, placement, gemm)
        if key not in self._cache:
            rows = []
            for magnitude in (1.0, *OUTLIERS[1:]):
                x, idx = sample(distribution, self.shape, magnitude, return_outliers=True, placement=placement)
                for name in CLIFF_RECIPES:
                    rows.append({"recipe": name, "outliers": magnitude, **self._measured(x, idx, name, gemm)})
            self._cache[key] = pd.DataFrame(rows)
        return self._cache[key]

    def compute(self, measure, distribution, placement, gemm, recipes) -> dict:
        if not recipes:
            raise ValueError(f"pick at least one recipe; valid: {', '.join(CLIFF_RECIPES)}")
        df = self.table(distribution, placement, gemm)
        df = df[df.recipe.isin(recipes)]
        pub = self.published(distribution, placement, gemm)
        pub = pub[pub.recipe.isin(recipes)]
        parts = {name: part.set_index("outliers") for name, part in df.groupby("recipe", sort=False)}
        # the cliff: the first magnitude where a recipe's ordinary SQNR is 3 dB below its own clean value
        cliffs = {}
        for name, part in parts.items():
            sqnr = part["ordinary_sqnr_db"]
            worse = sqnr.index[sqnr < float(sqnr.iloc[0]) - 3]
            cliffs[name] = float(worse[0]) if len(worse) else None
        markers = dict(zip(pub["label"], pub["outliers"], strict=False))
        return {"df": df, "measure": measure, "cliffs": cliffs, "published": pub, "markers": markers,
                "placement": placement, "gemm": gemm, "parts": parts,
                "marked": {name: part for name, part in pub.groupby("recipe", sort=False)}}

    def draw(self, data, ax) -> None:
        plots.outlier_cliff(data["df"], data["measure"], ax=ax, markers=data["markers"])
        for i, name in enumerate(data["parts"]):  # (a recipe without published points: an empty scatter, as ever)
            at = data["marked"].get(name, data["published"].iloc[:0])
            ax.scatter(at["outliers"], at[data["measure"]], marker="D", s=22, color=plots.PALETTE[i % 10],
                       edgecolor="black", linewidth=0.5, zorder=5)

    def describe(self, data) -> str:
        rows = {}
        for name, at in data["cliffs"].items():
            part = data["parts"][name]
            rows[name] = (f"3 dB below its clean SQNR from {plots.magnitude(at)}x on" if at is not None else
                          "within 3 dB of clean up to 1e7x") + \
                f"; at 1e6x: {part.loc[1e6, 'ordinary_sqnr_db']:.1f} dB, " \
                f"{percent(part.loc[1e6, 'ordinary_underflow'])} flushed"
        pub = data["published"]
        for label, part in pub.groupby("label", sort=False):
            where = (f"{label} (the largest outlier {part['ratio'].iloc[0]:g}x the others' median: "
                     f"{part['outliers'].iloc[0]:.3g}x here)")
            rows[where] = ", ".join(f"{r.recipe} {r.ordinary_sqnr_db:.1f} dB ({percent(r.ordinary_underflow)} flushed)"
                                    for r in part.itertuples())
        return metrics_html(rows)
