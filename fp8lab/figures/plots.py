"""Figures: each function takes data (and an optional ax), draws, and returns the ax.

Public: histogram_log2 (histogram_log2_parts: what it draws; move_histogram_log2: new counts on it), number_line,
scale_heatmap (scale_heatmap_parts), block_error_heatmap (block_error_grid), metric_vs_block, overflow_vs_block
(overflow_top: its y axis' top), gemm_error_vs_k, bars (bar_colors: their colours), loss_curves, monitor_lines,
amax_over_steps, outlier_cliff, sink_cliff, published_markers, readiness_heatmap, PALETTE, and the pieces other
figure modules build on (ax_or_new, block_grid, heatmap); and from fp8lab.figures.axes, which makes the figures and
their axes: use_theme, figure, to_png, log_axis, steady_limits, magnitude, PIXEL_RATIO. One seaborn theme and a
colour-blind-safe palette everywhere; axes carry units and tick labels (tests/test_widgets.py checks every panel's
axes).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch
from matplotlib.collections import LineCollection
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator, PercentFormatter

from fp8lab.figures.axes import PIXEL_RATIO, figure, log_axis, magnitude, steady_limits, to_png, use_theme
from fp8lab.numerics.formats import FloatFormat, get_format
from fp8lab.numerics.quantize import QuantizedTensor
from fp8lab.numerics.scaling import padded_blocks

__all__ = [
    "LAYER_STYLES",
    "PALETTE",
    "PIXEL_RATIO",
    "amax_over_steps",
    "ax_or_new",
    "bar_colors",
    "bars",
    "block_error_grid",
    "block_error_heatmap",
    "block_grid",
    "figure",
    "gemm_error_vs_k",
    "heatmap",
    "histogram_log2",
    "histogram_log2_parts",
    "log_axis",
    "loss_curves",
    "magnitude",
    "metric_vs_block",
    "monitor_lines",
    "move_histogram_log2",
    "number_line",
    "outlier_cliff",
    "overflow_top",
    "overflow_vs_block",
    "published_markers",
    "readiness_heatmap",
    "run_colors",
    "runs_legend",
    "scale_heatmap",
    "scale_heatmap_parts",
    "sink_cliff",
    "steady_limits",
    "to_png",
    "use_theme",
]

PALETTE = sns.color_palette("colorblind")
CLIP = "#d55e00"  # vermillion: values that clip (overflow)
FLUSH = "#7f7f7f"  # grey: values that flush to zero (underflow)
WINDOW = "#009e73"  # green: the representable window
LAYER_STYLES = ("-", "--", ":", "-.")


def ax_or_new(ax):
    """`ax`, or a new figure's single axes where it is None (every plot function takes an optional ax)."""
    return ax if ax is not None else figure()[1]



# ---- distributions and formats ---------------------------------------------------------------------


def histogram_log2(x: torch.Tensor, q: QuantizedTensor | None = None, fmt: FloatFormat | str | None = None,
                   scale: float | None = None, ax=None, bins: int = 80, title: str = "",
                   xlim: tuple[float, float] | None = None, parts: dict | None = None):
    """Histogram of log2|x| with the format's window shaded: green where values keep full
    precision (normal range), lighter where subnormal, grey where they flush to zero,
    vermillion beyond the max where they clip. A per-tensor scale sets the window. xlim: the
    x range (log2) to show at least (a panel's fixed axis); wider where the data or window are.
    What it draws is histogram_log2_parts(...); parts: those, where the caller has them."""
    ax = ax_or_new(ax)
    if parts is None:
        parts = histogram_log2_parts(x, q, fmt, scale, bins, xlim)
    for x0, x1, color, alpha, label in parts["spans"]:
        ax.axvspan(x0, x1, color=color, alpha=alpha, lw=0, label=label)
    ax.stairs(parts["counts"], parts["edges"], fill=True, color=PALETTE[0], alpha=0.9, label="|x|", baseline=0.5)
    ax.set_xlim(*parts["xlim"])
    ax.set_yscale("log")
    steady_limits(ax, "y", lo=0.5)  # whole decades of counts
    ax.set_xlabel("log2 |x|  (each unit is a binade: a factor of 2)")
    ax.set_ylabel("count (log)")
    ax.set_title(title or parts["title"])
    ax.legend(loc="upper left", fontsize=7, frameon=True)
    return ax


def histogram_log2_parts(x: torch.Tensor, q: QuantizedTensor | None = None, fmt: FloatFormat | str | None = None,
                         scale: float | None = None, bins: int = 80,
                         xlim: tuple[float, float] | None = None) -> dict:
    """What histogram_log2 draws, as data: "fmt", "scale", "spans" ((x0, x1, colour, alpha, label) per shaded
    region, in log2 units), "counts" (per bin, at least 0.5: the log axis' floor), "edges" (bins + 1 of them),
    "xlim" (left, right) and "title"."""
    fmt = get_format(fmt if fmt is not None else q.fmt if q is not None else "e4m3")
    if scale is None:
        scale = float(q.scale.max()) if q is not None and q.scale.numel() == 1 else 1.0
    a = x.detach().abs().flatten().float()  # float32 log2 is exact enough to bin at 1/80 of the range
    a = a[a > 0]
    if len(a) > 200_000:
        a = a[torch.randperm(len(a), generator=torch.Generator().manual_seed(0))[:200_000]]
    logs = torch.log2(a).numpy()
    lo_flush = math.log2(fmt.min_subnormal * scale / 2)  # below half the smallest subnormal: zero
    lo_normal = math.log2(fmt.min_normal * scale)
    hi = math.log2(fmt.max_value * scale)
    # whole multiples of 5 binades (the ticks' step): a slider that moves the data or the window a
    # little keeps the axis (and what the panel keeps drawn)
    left = 5 * math.floor(min(logs.min(initial=lo_flush) - 1, lo_flush - 2, *(xlim or ())[:1]) / 5)
    right = 5 * math.ceil(max(logs.max(initial=hi) + 1, hi + 2, *(xlim or ())[1:]) / 5)
    spans = [(left, lo_flush, FLUSH, 0.18, "flushes to 0"), (lo_flush, lo_normal, WINDOW, 0.08, "subnormal"),
             (lo_normal, hi, WINDOW, 0.18, f"{fmt.name} normal range"), (hi, right, CLIP, 0.15, "clips to max")]
    counts, edges = np.histogram(logs, bins=bins, range=(left, right))
    return {"fmt": fmt, "scale": scale, "spans": spans, "counts": np.maximum(counts, 0.5), "edges": edges,
            "xlim": (left, right), "title": f"|x| against the {fmt.name} window (scale {scale:.3g})"}


def move_histogram_log2(ax, stairs, parts: dict, title: str | None = None) -> None:
    """Show `parts` (histogram_log2_parts of new values, the same bins' range) on the histogram `stairs` that
    histogram_log2 drew on `ax`: the counts and edges, the y limits and the title as histogram_log2 sets them (title:
    a caller's own, as histogram_log2's). The shaded spans and the x range are the caller's to move, where they move."""
    stairs.set_data(parts["counts"], parts["edges"])
    # the y data limits a drawing gets from its stairs (the spans give x only): from the baseline 0.5 to the largest
    # count (ax.relim() gives the same, walking every step of the outline)
    ax.dataLim.intervaly = (0.5, float(parts["counts"].max()))
    ax.dataLim.minposy = 0.5
    steady_limits(ax, "y", lo=0.5)  # whole decades of counts
    ax.set_title(title or parts["title"])


def number_line(formats: list[FloatFormat | str], ax=None, lo: float = -10, hi: float = 17, mark: float | None = None):
    """Where each format's positive values sit on a log2 axis (one row per format)."""
    ax = ax_or_new(ax)
    formats = [get_format(f) for f in formats]
    inside = []  # each format's positive values in [2^lo, 2^hi]
    for fmt in formats:
        v = fmt.values()
        inside.append(v[(v > 0) & (v >= 2.0**lo) & (v <= 2.0**hi)].numpy())
    # too many values to tell ticks apart: a band, darker where subnormals thin out; else a tick per value
    dense = [len(v) > 1500 for v in inside]
    parts = []  # (row, dense, values, half height, alpha): normal values, then subnormals, per row
    for row, (fmt, v) in enumerate(zip(formats, inside, strict=True)):
        normal = v >= fmt.min_normal
        parts += [(row, dense[row], np.log2(v[normal]), 0.35, 0.8 if dense[row] else None),
                  (row, dense[row], np.log2(v[~normal]), 0.2, 0.35 if dense[row] else 0.5)]

    for row, band, values, half, alpha in parts:
        if band:
            span = [values.min(), values.max()] if len(values) else [np.nan, np.nan]
            ax.fill_between(span, row - half, row + half, color=PALETTE[row % 10], alpha=alpha, lw=0)
        else:  # what ax.vlines draws, without its masked arrays and data limits (the limits are set below)
            ticks = np.empty((len(values), 2, 2))  # (values, the tick's two ends, x and y)
            ticks[:, :, 0] = values[:, None]
            ticks[:, 0, 1], ticks[:, 1, 1] = row - half, row + half
            ax.add_collection(LineCollection(ticks, colors=PALETTE[row % 10], linewidths=0.8, alpha=alpha),
                              autolim=False)
    for row, v in enumerate(inside):
        ax.text(hi + 0.3, row, f"{len(v)} values", va="center", fontsize=8)
    if mark is not None and mark > 0:
        ax.axvline(math.log2(mark), color=CLIP, lw=1.5, ls="--", label=f"{mark:g}")
        ax.legend(loc="upper left", fontsize=8)
    ax.set_yticks(range(len(formats)), [f.name for f in formats])
    ax.set_ylim(-0.6, len(formats) - 0.4)
    ax.set_xlim(lo, hi + 3)
    ax.set_xlabel("log2(value)  (short ticks: subnormals)")
    ax.set_title("positive values of each format")
    ax.grid(axis="y", visible=False)
    return ax


# ---- blocks ------------------------------------------------------------------------------------------


def block_grid(values: torch.Tensor, max_cells: int = 64) -> np.ndarray:
    """A (rows, cols) grid of values as a float64 array for a heatmap, average-pooled to at most max_cells a side."""
    v = values.detach().double()
    if v.dim() == 0:
        v = v.reshape(1, 1)
    # average-pool big grids so that a heatmap stays readable and fast
    while v.shape[0] > max_cells or v.shape[1] > max_cells:
        pr = 2 if v.shape[0] > max_cells else 1
        pc = 2 if v.shape[1] > max_cells else 1
        v = torch.nn.functional.avg_pool2d(v[None, None], (pr, pc), ceil_mode=True)[0, 0]
    return v.numpy()


def heatmap(ax, grid: np.ndarray, cmap: str, label: str, vmin: float | None = None, vmax: float | None = None,
             shape: tuple[int, int] | None = None, colorbar=None):
    """imshow + colorbar (what seaborn's heatmap draws, at a fraction of the cost). shape: the
    (rows, cols) of blocks the grid stands for (it may be pooled): the ticks count blocks.
    colorbar: an existing Colorbar to show this image's colours (else one is made beside ax)."""
    rows, cols = shape or grid.shape
    im = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest",
                   extent=(0, cols, rows, 0))
    if colorbar is None:
        ax.figure.colorbar(im, ax=ax, label=label)
    else:
        im.colorbar = colorbar
        if not _colorbar_shows(colorbar, im, label):  # else it already shows these colours, range and label
            colorbar.update_normal(im)
            colorbar.set_label(label)
    ax.set_xticks([0, cols], ["0", str(cols)])
    ax.set_yticks([0, rows], ["0", str(rows)])
    ax.grid(False)


def _colorbar_shows(colorbar, im, label: str) -> bool:
    """Whether `colorbar` already shows what it would show for image `im` and `label`: the same colour map, the same
    kind of norm over the same range, the same label (then drawing it again gives the same pixels)."""
    norm, shown = im.norm, colorbar.norm
    long_axis = colorbar.ax.yaxis if colorbar.orientation == "vertical" else colorbar.ax.xaxis
    return (type(norm) is type(shown) and (norm.vmin, norm.vmax) == (shown.vmin, shown.vmax)
            and im.get_cmap() == colorbar.cmap and long_axis.get_label().get_text() == label)


def scale_heatmap(q: QuantizedTensor, ax=None, colorbar=None, parts: dict | None = None):
    """log2 of each block's scale: where the blocks with large values are (scale_heatmap_parts(q): what it draws;
    parts: those, where the caller has them)."""
    ax = ax_or_new(ax)
    if parts is None:
        parts = scale_heatmap_parts(q)
    heatmap(ax, parts["grid"], "viridis", "log2(scale)", vmin=parts["vmin"], vmax=parts["vmax"], shape=parts["shape"],
            colorbar=colorbar)
    ax.set_xlabel(parts["xlabel"])
    ax.set_ylabel(parts["ylabel"])
    ax.set_title(parts["title"])
    return ax


def scale_heatmap_parts(q: QuantizedTensor) -> dict:
    """What scale_heatmap draws: "grid" (log2 of each block's scale, pooled by block_grid), "vmin" and "vmax" (the
    colours' range), "shape" ((rows, cols) of blocks), "xlabel", "ylabel", "title"."""
    s = q.scale if q.tensor_scale is None else q.scale * q.tensor_scale
    grid = block_grid(torch.log2(s.clamp(min=1e-45)))
    # colours on whole multiples of 4 binades: the same colour is the same scale across settings
    lo, hi = 4 * math.floor(float(grid.min()) / 4), 4 * math.ceil(float(grid.max()) / 4)
    return {"grid": grid, "vmin": lo, "vmax": max(hi, lo + 4),
            "shape": tuple(s.reshape(-1, s.shape[-1]).shape) if s.dim() else (1, 1),
            "xlabel": f"block column ({s.shape[-1] if s.dim() else 1} along K)",
            "ylabel": f"block row ({s.shape[0] if s.dim() else 1} along M)",
            "title": f"scales, {q.granularity.label} blocks"}


def block_error_heatmap(x: torch.Tensor, q: QuantizedTensor, ax=None, colorbar=None):
    """The fraction of each block's values that lost more than rounding allows: a relative
    error beyond half a step of the format's normal range, 2^-(mantissa_bits + 1) (flushed
    and subnormal values). A block's SQNR would hide it: its energy is the outlier's.
    (block_error_grid: the cells it colours.)"""
    ax = ax_or_new(ax)
    grid, shape = block_error_grid(x, q)
    heatmap(ax, grid, "magma_r", "fraction of values lost", vmin=0, vmax=1, shape=shape, colorbar=colorbar)
    ax.set_xlabel("block column (along K)")
    ax.set_ylabel("block row (along M)")
    ax.set_title("values lost per block (dark: most)")
    return ax


def block_error_grid(x: torch.Tensor, q: QuantizedTensor) -> tuple[np.ndarray, tuple[int, int]]:
    """What block_error_heatmap colours: (the fraction of each block's values lost, pooled by block_grid; the
    (rows, cols) of blocks)."""
    r, c = q.block_shape
    x2 = x.detach().reshape(q.shape).float()
    lost = ((x2 - q.dequantize()).abs() > x2.abs() * 2.0 ** -(q.fmt.mantissa_bits + 1)).float()
    # padding counts as neither lost nor present: divide by the real elements of each block
    frac = padded_blocks(lost, (r, c)).sum((1, 3)) / padded_blocks(torch.ones_like(lost), (r, c)).sum((1, 3))
    return block_grid(frac), tuple(frac.shape)


def metric_vs_block(df, metric: str = "sqnr_db", ax=None, threshold: float | None = None):
    """A metric (default SQNR in dB) against block size, one line per strategy; each tick
    also gives the scales' memory in bits per element (of the first strategy)."""
    ax = ax_or_new(ax)
    labels = list(dict.fromkeys(df["block"]))
    xs = {b: i for i, b in enumerate(labels)}
    for i, (strategy, part) in enumerate(df.groupby("strategy", sort=False)):
        ax.plot([xs[b] for b in part["block"]], part[metric].to_numpy(), marker="o", color=PALETTE[i % 10],
                label=strategy)
    if threshold is not None:  # gid "threshold": a panel moves it in place
        ax.axhline(threshold, color=CLIP, ls="--", lw=1, label=f"{threshold:g} dB", gid="threshold")
    ticks = labels
    if "scale_bits_per_element" in df:
        bits = df.drop_duplicates("block").set_index("block")["scale_bits_per_element"]
        ticks = [f"{b}: {bits[b]:.2g} b" for b in labels]
    ax.set_xticks(range(len(labels)), ticks, fontsize=7, rotation=90)
    ax.set_xlabel("block: its scales' bits per element")
    ax.set_ylabel({"sqnr_db": "SQNR (dB, higher is better)"}.get(metric, metric))
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("quality and cost of each block size")
    return ax


def overflow_vs_block(df, ax=None):
    """The share of values that clipped (overflow) against block size, one line per strategy:
    where the OCP floor rule pays for its higher SQNR."""
    ax = ax_or_new(ax)
    labels = list(dict.fromkeys(df["block"]))
    xs = {b: i for i, b in enumerate(labels)}
    for i, (strategy, part) in enumerate(df.groupby("strategy", sort=False)):
        ax.plot([xs[b] for b in part["block"]], part["overflow"].to_numpy(), marker="o", color=PALETTE[i % 10],
                label=strategy)
    ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=90)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=None))
    ax.set_ylim(bottom=0, top=overflow_top(df["overflow"]))
    ax.set_xlabel("block")
    ax.set_ylabel("values clipped (overflow)")
    ax.set_title("what each rule clips")
    return ax


def overflow_top(overflow) -> float:
    """overflow_vs_block's top: 1.1 x the largest share (at least 0.001), rounded up to 1, 2 or 5 x a power of ten:
    an axis that stays put while the data move a little."""
    top = max(float(overflow.max()) * 1.1, 1e-3)
    power = 10.0 ** math.floor(math.log10(top))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= top)


def outlier_cliff(df, metric: str = "ordinary_sqnr_db", ax=None, clean: dict | None = None,
                  markers: dict[str, float] | None = None):
    """A quantization metric against outlier magnitude (log x), one line per recipe: where
    each recipe's ordinary values fall off. df: recipe, outliers, and the metric's column.
    markers: label -> outlier magnitude, drawn as labelled dotted lines (published ratios)."""
    ax = ax_or_new(ax)
    if markers:
        published_markers(ax, markers, at="top" if metric.endswith("underflow") else "bottom")
    for i, (recipe, part) in enumerate(df.groupby("recipe", sort=False)):
        ax.plot(part["outliers"].to_numpy(), part[metric].to_numpy(), marker="o", ms=4, color=PALETTE[i % 10],
                label=recipe)
    ax.set_xscale("log")
    log_axis(ax, "x")
    if metric.endswith("underflow"):
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))
        ax.set_ylim(-0.03, 1.03)
        ax.set_ylabel("ordinary values flushed to 0")
    else:
        steady_limits(ax, "y", step=10, lo=0, hi=40)  # every recipe's SQNR; the axis stays put
        ax.set_ylabel("SQNR of ordinary channels (dB)")
    ax.set_xlabel("outlier channels' magnitude (x the others; 1: no outliers)")
    ax.legend(fontsize=7, loc="lower center" if not metric.endswith("underflow") else "center")
    ax.set_title("the outlier cliff: where each recipe breaks")
    return ax


def published_markers(ax, markers: dict[str, float], at: str = "top") -> None:
    """Dotted vertical lines at published outlier ratios, placed on a cliff's x axis (markers: label -> x in the
    axis' own units), each labelled at the top or the bottom (`at`), turned 90 degrees."""
    y, va = (0.98, "top") if at == "top" else (0.02, "bottom")
    for label, x in markers.items():
        ax.axvline(x, color="black", ls=(0, (1, 2)), lw=1, gid=f"published: {label}")
        ax.text(x, y, f" {label} ", transform=ax.get_xaxis_transform(), rotation=90, fontsize=6.5, va=va,
                ha="right", color="black")


def sink_cliff(df, ax=None, relative: bool = False, mark: float | None = None, live=None,
               markers: dict[str, float] | None = None, extra=None):
    """Final training loss against sink magnitude (log x; 'none' drawn at 1), one line per run.

    df: run, sinks, loss (mean over seeds). relative=True: the change against each run's own
    no-sink loss. live: optional rows (run, sinks, loss) recomputed now, drawn as crosses.
    mark: a sink value drawn as a dotted line (gid "mark", which a panel moves in place); markers: label ->
    sink value, drawn as labelled dotted lines (published ratios); extra: optional
    rows (run, sinks, loss, change) trained at such a value, drawn as diamonds (change: against the
    run's own no-sink run, for relative=True)."""
    ax = ax_or_new(ax)
    if markers:
        published_markers(ax, markers)
    d = df.copy()
    d["x"] = d["sinks"].where(d["sinks"] > 0, 1.0)
    base = d[d.sinks == 0].set_index("run")["loss"]
    if relative:
        d["y"] = d["loss"] / d["run"].map(base) - 1
    else:
        d["y"] = d["loss"]
    colors = {}
    for i, (run, part) in enumerate(d.groupby("run", sort=False)):
        colors[run] = PALETTE[i % 10]
        ax.plot(part["x"], part["y"], marker="o", ms=4, color=colors[run], label=run)
    if live is not None and len(live):
        lv = live.copy()
        lv["x"] = lv["sinks"].where(lv["sinks"] > 0, 1.0)
        lv["y"] = lv["loss"] / lv["run"].map(base) - 1 if relative else lv["loss"]
        for run, part in lv.groupby("run", sort=False):
            ax.scatter(part["x"], part["y"], marker="x", s=60, color=colors.get(run, "black"), zorder=5,
                       label="recomputed now" if run == lv["run"].iloc[0] else None)
    if extra is not None and len(extra):  # one collection, a colour per run's diamond (one legend entry)
        ax.scatter(extra["sinks"], extra["change"] if relative else extra["loss"], marker="D", s=28,
                   c=[colors.get(run, "black") for run in extra["run"]], edgecolor="black", linewidth=0.5,
                   zorder=5, label="at 1e5x the median")
    if mark is not None:
        ax.axvline(mark if mark > 0 else 1.0, color=FLUSH, ls=":", lw=1, gid="mark")
    ax.set_xscale("log")
    log_axis(ax, "x")
    if relative:
        ax.axhline(0.05, color=CLIP, ls="--", lw=1, label="+5%")
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))
        ax.set_ylabel("final loss vs its own no-sink run")
    else:
        ax.set_yscale("log")
        log_axis(ax, "y")
        ax.set_ylabel("final loss (log)")
    ax.set_xlabel("the sinks' value (1: no sinks)")
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    ax.set_title("the sink cliff: final loss after 150 steps")
    return ax


# ---- GEMM ---------------------------------------------------------------------------------------------------


def gemm_error_vs_k(df, ax=None, title: str = "accumulation precision and K", dashed: tuple[str, ...] = (),
                    reference: dict[str, float] | None = None, legend: bool = True):
    """Relative error of the GEMM against K, one line per accumulation setting (log-log); the settings named in
    `dashed` drawn dashed (a comparison, not an accumulator); `reference`: label -> a level drawn as a dotted
    horizontal line, labelled at its right end."""
    ax = ax_or_new(ax)
    for i, (label, part) in enumerate(df.groupby("accumulation", sort=False)):
        ax.plot(part["K"].to_numpy(), part["relative error"].to_numpy(), marker="o", color=PALETTE[i % 10],
                label=label, linestyle="--" if label in dashed else "-")
    for label, level in (reference or {}).items():
        ax.axhline(level, color=CLIP, linestyle=":", linewidth=1.2)
        ax.text(0.02, level, label, transform=ax.get_yaxis_transform(), ha="left", va="bottom", fontsize=8,
                color=CLIP)
    log_axis(ax, "x", base=2)
    log_axis(ax, "y")
    ax.set_xlabel("K (length of each dot product)")
    ax.set_ylabel("relative error vs exact")
    if legend:
        ax.legend(fontsize=7, loc="lower right")  # under fp32's curve: the caller leaves room below it
    ax.set_title(title, fontsize=9)
    return ax


def bar_colors(names, highlight: str | None = None) -> list:
    """bars' colours: the palette in order, the highlighted name in vermillion."""
    return [CLIP if n == highlight else PALETTE[i % 10] for i, n in enumerate(names)]


def bars(values: dict[str, float], ax=None, ylabel: str = "", title: str = "", log: bool = False,
         highlight: str | None = None):
    """A bar per named value (e.g. error per recipe, time per backend), the highlighted one in vermillion."""
    ax = ax_or_new(ax)
    names = list(values)
    ax.bar(range(len(names)), [values[n] for n in names], color=bar_colors(names, highlight))
    labels = [n.replace(" (", "\n(") for n in names]
    # upright where they fit side by side (~0.6 em per character at 8 pt), else turned 90 degrees
    per_bar = ax.get_position().width * ax.figure.get_figwidth() / max(len(names), 1)
    longest = max((len(line) for lab in labels for line in lab.split("\n")), default=0)
    upright = longest * 8 * 0.6 / 72 < 0.95 * per_bar
    ax.set_xticks(range(len(names)), labels, fontsize=8, rotation=0 if upright else 90)
    if log:
        log_axis(ax, "y")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return ax


# ---- training ---------------------------------------------------------------------------------------------------


def run_colors(runs) -> dict:
    """One colour per run name, in order, shared by every plot of the same runs."""
    return {run: PALETTE[i % 10] for i, run in enumerate(dict.fromkeys(runs))}


def loss_curves(history, ax=None, smooth: int = 5, title: str = "training loss", colors: dict | None = None,
                legend: bool = True):
    """Loss against step, one line per run (a rolling mean over `smooth` steps), log y."""
    ax = ax_or_new(ax)
    colors = colors or run_colors(history["run"])
    for run, part in history.groupby("run", sort=False):
        y = part["loss"].rolling(smooth, min_periods=1).mean() if smooth > 1 else part["loss"]
        ax.plot(part["step"], y, color=colors[run], label=run, lw=1.5)
    log_axis(ax, "y")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("loss (log scale)")
    ax.set_title(title)
    if len(history) and legend:
        ax.legend(fontsize=8, loc="upper right")
    return ax


def monitor_lines(monitor, metric: str = "underflow", ax=None, gemm: str = "fprop", role: str = "input",
                  colors: dict | None = None, legend: bool = True):
    """A per-layer statistic over training (fraction underflowed, overflowed, amax), per run:
    colour = run, line style = layer."""
    ax = ax_or_new(ax)
    if monitor is None or len(monitor) == 0:
        ax.set_title(f"{metric}: nothing recorded yet")
        return ax
    part = monitor[(monitor["gemm"] == gemm) & (monitor["role"] == role)]
    colors = colors or run_colors(part["run"])
    for run, by_run in part.groupby("run", sort=False):
        for j, (layer, d) in enumerate(by_run.groupby("layer", sort=False)):
            ax.plot(d["step"], d[metric], color=colors[run], ls=LAYER_STYLES[j % 4], lw=1.2, label=f"{run} {layer}")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.set_xlabel("step")
    if metric in ("underflow", "overflow"):  # shares as percent: no '1e-3' offset text over the title
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=None))
        ax.set_ylim(bottom=0, top=max(float(part[metric].max()) * 1.1, 1e-3) if len(part) else 1)
    else:
        ax.set_yscale("log")
        log_axis(ax, "y")
    ax.set_ylabel({"underflow": "flushed to 0", "overflow": "clipped"}.get(metric, metric))
    ax.set_title(f"{metric} of each layer's {role} ({gemm})")
    if legend:  # beside the plot, not over the lines
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    return ax


def runs_legend(ax, colors: dict, layers=()) -> None:
    """One legend beside `ax` for a figure of runs (colours) and layers (line styles)."""
    handles = [Line2D([], [], color=c, lw=2, label=run) for run, c in colors.items()]
    handles += [Line2D([], [], color="black", ls=LAYER_STYLES[j % 4], lw=1.2, label=layer)
                for j, layer in enumerate(layers)]
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0,
                  frameon=False)


def amax_over_steps(df, ax=None):
    """Delayed scaling over steps: each step's amax, the amax its scale used, and the clips."""
    ax = ax_or_new(ax)
    ax.plot(df["step"].to_numpy(), df["amax"].to_numpy(), color=PALETTE[0], label="this step's amax")
    for i, col in enumerate(c for c in df.columns if c.startswith("scale amax")):
        ax.plot(df["step"].to_numpy(), df[col].to_numpy(), drawstyle="steps-mid", color=PALETTE[i + 1],
                label=col.replace("scale amax", "used"))
    for i, col in enumerate(c for c in df.columns if c.startswith("overflow")):
        hit = df[df[col] > 0]
        ax.scatter(hit["step"], hit["amax"], color=CLIP, marker="x", s=50, zorder=5,
                   label="clipped (overflow)" if i == 0 else None)
    log_axis(ax, "y")
    ax.set_xlabel("step")
    ax.set_ylabel("amax (log)")
    ax.legend(fontsize=7)
    ax.set_title("current amax vs the amax each scale used")
    return ax


# ---- readiness (fp8lab.inspect) ---------------------------------------------------------------------------------


def readiness_heatmap(worst, target_db: float, chosen: dict[str, str] | None = None, ax=None, max_labels: int = 40):
    """Layers x recipes coloured by each layer's worst operand SQNR (dB); red below target_db,
    blue above; the recipe chosen for each layer (`chosen`: layer -> recipe) is boxed.
    worst: DataFrame indexed by layer, one column per recipe (ReadinessReport.worst())."""
    ax = ax_or_new(ax)
    grid = worst.to_numpy(dtype=float)
    shown = np.clip(np.nan_to_num(grid, nan=-10.0, posinf=target_db + 30, neginf=-10.0), -10.0, target_db + 30)
    span = max(abs(shown.max() - target_db), abs(shown.min() - target_db), 1.0)
    im = ax.imshow(shown, cmap="RdBu", vmin=target_db - span, vmax=target_db + span, aspect="auto",
                   interpolation="nearest")
    ax.figure.colorbar(im, ax=ax, label=f"worst operand SQNR (dB); target {target_db:g}")
    layers, recipes = list(worst.index), list(worst.columns)
    ax.set_xticks(range(len(recipes)), recipes, rotation=20)
    if len(layers) <= max_labels:
        ax.set_yticks(range(len(layers)), [n or "(model)" for n in layers], fontsize=8)
        for i in range(len(layers)):
            for j in range(len(recipes)):
                v = grid[i, j]
                ax.text(j, i, "inf" if v == math.inf else f"{v:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if abs(shown[i, j] - target_db) > 0.6 * span else "black")
    else:
        ax.set_yticks([])
        ax.set_ylabel(f"{len(layers)} layers")
    for i, layer in enumerate(layers):
        recipe = (chosen or {}).get(layer)
        if recipe in recipes:
            j = recipes.index(recipe)
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="black", lw=2))
    ax.grid(False)
    ax.set_xlabel("recipe (cheapest first); boxed: each layer's cheapest passing recipe")
    ax.set_title("FP8 readiness per layer")
    return ax
