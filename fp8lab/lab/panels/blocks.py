"""Notebook 04's panels: one block size's scales and losses (BlockPanel), SQNR and overhead against
block size (BlockSweepPanel).

Public: BlockPanel, BlockSweepPanel. Wiring only: the numbers come from fp8lab's functions.
"""


from __future__ import annotations

import ipywidgets as W
import pandas as pd

from fp8lab.data.synthetic import DISTRIBUTIONS, sample
from fp8lab.figures import plots
from fp8lab.lab import redraw
from fp8lab.lab.panels.base import (
    BLOCKS,
    ELEMENT_FORMATS,
    OUTLIERS,
    SCALES,
    Panel,
    dropdown,
    memo,
    metrics_html,
    outlier_options,
    percent,
    selection_slider,
)
from fp8lab.numerics.metrics import (
    channel_sqnr,
    overflow_fraction,
    quantization_report,
    sqnr,
)
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.recipes import SCALE_PRESETS
from fp8lab.settings import size

__all__ = ["BlockPanel", "BlockSweepPanel", "activation_shape", "block_table"]


def activation_shape() -> tuple[int, int]:
    """The one activation shape of notebook 04's panels and table (smaller under FP8LAB_SMOKE): the outlier
    channels' largest value, and so what one scale per tensor costs the rest, grows with the rows drawn."""
    return size(128, 64), size(1024, 256)


def block_table(blocks: tuple[str, ...] = ("per-tensor", "per-row", "128x128", "1x128", "1x32"),
                outliers: float = 1e5, seed: int = 0):
    """The panels' tensor (activation_shape(), normal, outlier channels) quantized with each block, E4M3, fp32 exact
    scales (per-row: rounded up to powers of two, as torchao's rowwise; 1x32: E8M0 rceil, as MX): DataFrame of
    quantization reports, indexed by block (notebook 04 reveals its prediction's options with it)."""
    x, idx = sample("normal", activation_shape(), outliers, seed=seed, return_outliers=True)
    scales = {"per-row": SCALE_PRESETS["fp32_pow2"], "1x32": SCALE_PRESETS["e8m0_rceil"]}
    rows = {}
    for b in blocks:
        spec = scales.get(b, SCALE_PRESETS["fp32"]).scaling("e4m3", b)
        rows[b] = quantization_report(x, quantize(x, spec), idx)
    return pd.DataFrame(rows).T[["scale_rule", "ordinary_sqnr_db", "ordinary_underflow", "sqnr_db",
                                 "scale_bits_per_element"]]


class BlockPanel(Panel):
    """One block size at a time: where the scales are and where the error is."""

    title = "per-block scaling: scales and error per block"
    ncols, width, height = 2, 4.0, 3.2
    keep_axes = True  # two heatmaps, their colorbars kept

    def __init__(self) -> None:
        super().__init__(
            block=selection_slider(BLOCKS, "1x128", "block"),
            fmt=dropdown(ELEMENT_FORMATS, "e4m3", "format"),
            scales=dropdown(SCALES, "fp32, exact", "scales (format, rule)"),
            distribution=dropdown(DISTRIBUTIONS, "normal", "distribution"),
            outliers=selection_slider(outlier_options(), 1e5, "outlier channels"),
        )
        self.shape = activation_shape()
        self._computed: dict[tuple, dict] = {}  # the controls' values -> compute's data: a drag back only draws

    def compute(self, block, fmt, scales, distribution, outliers) -> dict:
        key = (block, fmt, scales, distribution, outliers, self.shape)

        def make() -> dict:
            x, idx = sample(distribution, self.shape, outliers, return_outliers=True)
            q = quantize(x, SCALES[scales].scaling(fmt, block))
            return {"x": x, "q": q, "report": quantization_report(x, q, idx)}

        return dict(memo(self._computed, key, make))

    def draw(self, data, axes) -> None:
        parts = plots.scale_heatmap_parts(data["q"])
        plots.scale_heatmap(data["q"], axes[0], colorbar=redraw.kept_colorbar(axes[0]), parts=parts)
        plots.block_error_heatmap(data["x"], data["q"], axes[1], colorbar=redraw.kept_colorbar(axes[1]))
        self._drawn = (self._layout(data["q"], parts), [ax.images[0] for ax in axes])

    @staticmethod
    def _layout(q, parts: dict) -> tuple:
        """What stays while only the values move: the blocks, the labels, the scales' colour range."""
        return tuple(q.block_shape), tuple(q.shape), {k: v for k, v in parts.items() if k != "grid"}

    def draw_in_place(self, data) -> bool:
        """The same blocks, labels and colour range (an outlier magnitude dragged that keeps them): the two maps'
        cells change, drawn into the same images (scale_heatmap_parts, block_error_grid: what the heatmaps
        draw); the axes and colorbars stay."""
        moving = self._drawn
        if moving is None:
            return False
        parts = plots.scale_heatmap_parts(data["q"])
        if moving[0] != self._layout(data["q"], parts):
            return False
        scales, errors = moving[1]
        scales.set_data(parts["grid"])
        errors.set_data(plots.block_error_grid(data["x"], data["q"])[0])
        return True

    def describe(self, data) -> str:
        r = data["report"]
        return metrics_html({"SQNR of ordinary channels (each alike)": f"{r['ordinary_sqnr_db']:.1f} dB",
                              "ordinary values flushed to 0": percent(r["ordinary_underflow"]),
                              "SQNR, whole tensor": f"{r['sqnr_db']:.1f} dB",
                              "overflow (clipped)": percent(r["overflow"]),
                              "scale overhead": f"{r['scale_bits_per_element']:.3g} bits / element",
                              "scales": str(tuple(data["q"].scale.shape))})


class BlockSweepPanel(Panel):
    """SQNR against block size for each scale strategy, with the scales' memory cost."""

    title = "SQNR and clipping vs block size, with the scales' memory under each block"
    ncols, width, height, bottom = 2, 5.0, 4.0, 1.5
    keep_axes = True

    def __init__(self) -> None:
        super().__init__(
            fmt=dropdown(ELEMENT_FORMATS, "e4m3", "format"),
            distribution=dropdown(DISTRIBUTIONS, "normal", "distribution"),
            outliers=selection_slider(outlier_options(), 1e5, "outlier channels"),
            measure=dropdown(("ordinary channels", "all values"), "ordinary channels", "SQNR of"),
            threshold=W.IntSlider(value=20, min=5, max=45, description="target SQNR (dB)"),
        )
        self.shape = activation_shape()
        self._cache: dict[tuple, pd.DataFrame] = {}
        start = self.values()
        for magnitude in OUTLIERS:  # the settings the notebook opens on, at every magnitude: their drag only draws
            self.sweep(start["fmt"], start["distribution"], magnitude, start["measure"])

    def sweep(self, fmt: str, distribution: str, outliers: float, measure: str) -> pd.DataFrame:
        """Every strategy at every block size: SQNR, clipped share, scale bits (cached: the target
        SQNR only redraws)."""
        # "ordinary channels": the SQNR of every channel but the outliers. Over all values the
        # outliers' energy dominates and hides what happens to everything else.
        key = (fmt, distribution, outliers, measure)
        if key in self._cache:
            return self._cache[key]
        x, idx = sample(distribution, self.shape, outliers, return_outliers=True)
        strategies = {"fp32 scales, exact": SCALE_PRESETS["fp32"], "E8M0 scales, rceil": SCALE_PRESETS["e8m0_rceil"],
                      "E8M0 scales, floor (OCP)": SCALE_PRESETS["e8m0_floor"]}
        rows = []
        for name, preset in strategies.items():
            for block in BLOCKS:
                q = quantize(x, preset.scaling(fmt, block))
                deq = q.dequantize()
                db = channel_sqnr(x, deq, idx) if measure == "ordinary channels" else sqnr(x, deq)
                rows.append({"strategy": name, "block": block, "sqnr_db": db, "overflow": overflow_fraction(x, q),
                             "scale_bits_per_element": q.scale_bits_per_element})
        if len(self._cache) > 32:
            self._cache.clear()
        self._cache[key] = pd.DataFrame(rows)
        return self._cache[key]

    def compute(self, fmt, distribution, outliers, measure, threshold) -> dict:
        df = self.sweep(fmt, distribution, outliers, measure)
        ok = df[(df.strategy == "fp32 scales, exact") & (df.sqnr_db >= threshold)]
        best = ok.sort_values("scale_bits_per_element").iloc[0]["block"] if len(ok) else None
        return {"df": df, "threshold": threshold, "cheapest": best, "fmt": fmt}

    def draw(self, data, axes) -> None:
        plots.metric_vs_block(data["df"], ax=axes[0], threshold=data["threshold"])
        plots.steady_limits(axes[0], "y", step=20)
        plots.overflow_vs_block(data["df"], ax=axes[1])
        n = data["df"]["strategy"].nunique()
        threshold = next(line for line in axes[0].lines if line.get_gid() == "threshold")
        self._drawn = {"fmt": data["fmt"], "axes": axes, "sqnr": axes[0].lines[:n], "threshold": threshold,
                        "label": axes[0].get_legend().get_texts()[n], "overflow": axes[1].lines[:n]}

    def draw_in_place(self, data) -> bool:
        """The same format (the same blocks, strategies and tick labels): the lines' values, the target's line and
        its legend entry move, and the limits follow as metric_vs_block, steady_limits and overflow_vs_block set
        them; the axes, ticks and legend stay."""
        moving = self._drawn
        if moving is None or moving["fmt"] != data["fmt"]:
            return False
        parts = [part for _, part in data["df"].groupby("strategy", sort=False)]
        redraw.move_lines(moving["sqnr"], [part["sqnr_db"].to_numpy() for part in parts])
        redraw.move_lines(moving["overflow"], [part["overflow"].to_numpy() for part in parts])
        t = data["threshold"]
        moving["threshold"].set_ydata([t, t])
        moving["threshold"].set_label(f"{t:g} dB")
        moving["label"].set_text(f"{t:g} dB")
        sqnr_ax, overflow_ax = moving["axes"]
        sqnr_ax.relim()  # the lines and the target, as a new drawing's data set the limits
        plots.steady_limits(sqnr_ax, "y", step=20)
        overflow_ax.set_ylim(bottom=0, top=plots.overflow_top(data["df"]["overflow"]))
        return True

    def describe(self, data) -> str:
        df = data["df"].set_index(["strategy", "block"])
        mx = {s: df.loc[(s, "1x32")] for s in ("E8M0 scales, rceil", "E8M0 scales, floor (OCP)")}
        return metrics_html({
            f"cheapest block with fp32 scales >= {data['threshold']} dB": str(data["cheapest"] or "none reaches it"),
            "MX 1x32, rceil vs floor": " vs ".join(f"{r['sqnr_db']:.1f} dB, {percent(r['overflow'])} clipped"
                                                   for r in mx.values())})
