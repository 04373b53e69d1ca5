"""Figures: each function takes data (and an optional ax), draws, and returns the ax.

Public: use_theme, figure, histogram_log2, number_line, scale_heatmap, block_error_heatmap,
metric_vs_block, gemm_error_vs_k, bars, loss_curves, monitor_lines, amax_over_steps,
readiness_heatmap, PALETTE. One seaborn theme and a colour-blind-safe palette everywhere; axes carry units.
"""

from __future__ import annotations

import io
import math

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from fp8lab.formats import FloatFormat, get_format
from fp8lab.quantize import QuantizedTensor
from fp8lab.scaling import padded_blocks

__all__ = [
    "PALETTE",
    "amax_over_steps",
    "bars",
    "block_error_heatmap",
    "figure",
    "gemm_error_vs_k",
    "histogram_log2",
    "loss_curves",
    "metric_vs_block",
    "monitor_lines",
    "number_line",
    "readiness_heatmap",
    "scale_heatmap",
    "to_png",
    "use_theme",
]

PALETTE = sns.color_palette("colorblind")
CLIP = "#d55e00"  # vermillion: values that clip (overflow)
FLUSH = "#7f7f7f"  # grey: values that flush to zero (underflow)
WINDOW = "#009e73"  # green: the representable window


def use_theme() -> None:
    """The lab's look: seaborn 'whitegrid', the colour-blind palette, compact fonts."""
    sns.set_theme(style="whitegrid", palette="colorblind", context="notebook", font_scale=0.9)
    # axes.titley fixed: matplotlib otherwise measures every tick label on each draw to
    # place titles clear of top ticks (none here), ~40% of a widget's redraw
    plt.rcParams.update({"figure.dpi": 72, "savefig.dpi": 72, "figure.autolayout": False,
                         "axes.titlesize": 11, "axes.titleweight": "bold", "axes.titley": 1.0})


def figure(ncols: int = 1, nrows: int = 1, width: float = 6.0, height: float = 3.2, pyplot: bool = True):
    """A new figure and its axes (a list when there are several).

    pyplot=True: through matplotlib.pyplot, so a notebook shows it inline. pyplot=False: a
    bare Figure (no global state; safe from a background thread), as the widgets use.
    """
    size = (width * ncols, height * nrows)
    if pyplot:
        fig, axes = plt.subplots(nrows, ncols, figsize=size, squeeze=False, layout="constrained")
    else:
        # fixed margins: the constrained-layout solver would double the time of a redraw
        fig = Figure(figsize=size)
        axes = fig.subplots(nrows, ncols, squeeze=False)
        bottom = min(0.55 / size[1], 0.3)
        fig.subplots_adjust(left=0.7 / size[0], right=1 - 0.6 / size[0], bottom=bottom,
                            top=max(1 - 0.35 / size[1], bottom + 0.2), wspace=0.45, hspace=0.5)
    flat = list(axes.flat)
    return fig, (flat[0] if len(flat) == 1 else flat)


def to_png(fig, keep: bool = False) -> bytes:
    """Render a figure to PNG bytes. Unless keep=True (a panel that redraws into the same
    figure), close it and clear it: its reference cycles go now, not in a slow GC pass."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", pil_kwargs={"compress_level": 1})
    if not keep:
        plt.close(fig)
        fig.clear()
    return buf.getvalue()


def _ax(ax):
    return ax if ax is not None else figure()[1]


def _log(ax, axis: str = "y", base: float = 10) -> None:
    """A log axis with a few major ticks and no minor ones (minor log ticks are slow to draw)."""
    getattr(ax, f"set_{axis}scale")("log", base=base)
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=base, numticks=6))
    target.set_minor_locator(NullLocator())
    # plain-text labels ("0.001", "4096"): the default mathtext ones ("10^-3") cost more to
    # lay out than the whole rest of a redraw
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


# ---- distributions and formats ---------------------------------------------------------------------


def histogram_log2(x: torch.Tensor, q: QuantizedTensor | None = None, fmt: FloatFormat | str | None = None,
                   scale: float | None = None, ax=None, bins: int = 80, title: str = ""):
    """Histogram of log2|x| with the format's window shaded: green where values keep full
    precision (normal range), lighter where subnormal, grey where they flush to zero,
    vermillion beyond the max where they clip. A per-tensor scale sets the window."""
    ax = _ax(ax)
    fmt = get_format(fmt if fmt is not None else q.fmt if q is not None else "e4m3")
    if scale is None:
        scale = float(q.scale.max()) if q is not None and q.scale.numel() == 1 else 1.0
    a = x.detach().abs().flatten().double()
    a = a[a > 0]
    if len(a) > 200_000:
        a = a[torch.randperm(len(a), generator=torch.Generator().manual_seed(0))[:200_000]]
    logs = torch.log2(a).numpy()
    lo_flush = math.log2(fmt.min_subnormal * scale / 2)  # below half the smallest subnormal: zero
    lo_normal = math.log2(fmt.min_normal * scale)
    hi = math.log2(fmt.max_value * scale)
    left = min(logs.min(initial=lo_flush) - 1, lo_flush - 2)
    right = max(logs.max(initial=hi) + 1, hi + 2)
    ax.axvspan(left, lo_flush, color=FLUSH, alpha=0.18, lw=0, label="flushes to 0")
    ax.axvspan(lo_flush, lo_normal, color=WINDOW, alpha=0.08, lw=0, label="subnormal")
    ax.axvspan(lo_normal, hi, color=WINDOW, alpha=0.18, lw=0, label=f"{fmt.name} normal range")
    ax.axvspan(hi, right, color=CLIP, alpha=0.15, lw=0, label="clips to max")
    counts, edges = np.histogram(logs, bins=bins, range=(left, right))
    ax.stairs(np.maximum(counts, 0.5), edges, fill=True, color=PALETTE[0], alpha=0.9, label="|x|", baseline=0.5)
    ax.set_xlim(left, right)
    _log(ax, "y")
    ax.set_xlabel("log2 |x|  (each unit is a binade: a factor of 2)")
    ax.set_ylabel("count (log)")
    ax.set_title(title or f"|x| against the {fmt.name} window (scale {scale:.3g})")
    ax.legend(loc="upper left", fontsize=7, frameon=True)
    return ax


def number_line(formats: list[FloatFormat | str], ax=None, lo: float = -10, hi: float = 17, mark: float | None = None):
    """Where each format's positive values sit on a log2 axis (one row per format)."""
    ax = _ax(ax)
    formats = [get_format(f) for f in formats]
    for row, fmt in enumerate(formats):
        v = fmt.values()
        v = v[(v > 0) & (v >= 2.0**lo) & (v <= 2.0**hi)].numpy()
        logs = np.log2(v)
        normal = v >= fmt.min_normal
        color = PALETTE[row % 10]
        if len(v) > 1500:  # too dense to tell ticks apart: a band, darker where subnormals thin out
            if normal.any():
                ax.fill_between([logs[normal].min(), logs[normal].max()], row - 0.35, row + 0.35, color=color,
                                alpha=0.8, lw=0)
            if (~normal).any():
                ax.fill_between([logs[~normal].min(), logs[~normal].max()], row - 0.2, row + 0.2, color=color,
                                alpha=0.35, lw=0)
        else:
            ax.vlines(logs[normal], row - 0.35, row + 0.35, color=color, lw=0.8)
            ax.vlines(logs[~normal], row - 0.2, row + 0.2, color=color, lw=0.8, alpha=0.5)
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


def _block_grid(values: torch.Tensor, max_cells: int = 64) -> np.ndarray:
    v = values.detach().double()
    if v.dim() == 0:
        v = v.reshape(1, 1)
    # average-pool big grids so that a heatmap stays readable and fast
    while v.shape[0] > max_cells or v.shape[1] > max_cells:
        pr = 2 if v.shape[0] > max_cells else 1
        pc = 2 if v.shape[1] > max_cells else 1
        v = torch.nn.functional.avg_pool2d(v[None, None], (pr, pc), ceil_mode=True)[0, 0]
    return v.numpy()


def _heatmap(ax, grid: np.ndarray, cmap: str, label: str, vmin: float | None = None, vmax: float | None = None):
    # imshow + colorbar: what seaborn's heatmap draws, at a fraction of the cost
    im = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.figure.colorbar(im, ax=ax, label=label)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)


def scale_heatmap(q: QuantizedTensor, ax=None):
    """log2 of each block's scale: where the blocks with large values are."""
    ax = _ax(ax)
    s = q.scale if q.tensor_scale is None else q.scale * q.tensor_scale
    grid = _block_grid(torch.log2(s.clamp(min=1e-45)))
    _heatmap(ax, grid, "viridis", "log2(scale)")
    ax.set_xlabel(f"block column ({s.shape[-1] if s.dim() else 1} along K)")
    ax.set_ylabel(f"block row ({s.shape[0] if s.dim() else 1} along M)")
    ax.set_title(f"scales, {q.granularity.label} blocks")
    return ax


def block_error_heatmap(x: torch.Tensor, q: QuantizedTensor, ax=None):
    """The fraction of each block's values that lost more than rounding allows: a relative
    error beyond half a step of the format's normal range, 2^-(mantissa_bits + 1) (flushed
    and subnormal values). A block's SQNR would hide it: its energy is the outlier's."""
    ax = _ax(ax)
    r, c = q.block_shape
    x2 = x.detach().reshape(q.shape).float()
    lost = ((x2 - q.dequantize()).abs() > x2.abs() * 2.0 ** -(q.fmt.mantissa_bits + 1)).float()
    # padding counts as neither lost nor present: divide by the real elements of each block
    frac = padded_blocks(lost, (r, c)).sum((1, 3)) / padded_blocks(torch.ones_like(lost), (r, c)).sum((1, 3))
    _heatmap(ax, _block_grid(frac), "magma_r", "fraction of values lost", vmin=0, vmax=1)
    ax.set_xlabel("block column (along K)")
    ax.set_ylabel("block row (along M)")
    ax.set_title("values lost per block (dark: most)")
    return ax


def metric_vs_block(df, metric: str = "sqnr_db", ax=None, threshold: float | None = None):
    """A metric (default SQNR in dB) against block size, one line per strategy; each tick
    also gives the scales' memory in bits per element (of the first strategy)."""
    ax = _ax(ax)
    labels = list(dict.fromkeys(df["block"]))
    xs = {b: i for i, b in enumerate(labels)}
    for i, (strategy, part) in enumerate(df.groupby("strategy", sort=False)):
        ax.plot([xs[b] for b in part["block"]], part[metric], marker="o", color=PALETTE[i % 10], label=strategy)
    if threshold is not None:
        ax.axhline(threshold, color=CLIP, ls="--", lw=1, label=f"{threshold:g} dB")
    ticks = labels
    if "scale_bits_per_element" in df:
        bits = df.drop_duplicates("block").set_index("block")["scale_bits_per_element"]
        ticks = [f"{b}\n{bits[b]:.2g} b" for b in labels]
    ax.set_xticks(range(len(labels)), ticks, fontsize=8)
    ax.set_xlabel("block (rows x cols along K), and its scale bits per element")
    ax.set_ylabel({"sqnr_db": "SQNR (dB, higher is better)"}.get(metric, metric))
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("quality and cost of each block size")
    return ax


# ---- GEMM ---------------------------------------------------------------------------------------------------


def gemm_error_vs_k(df, ax=None):
    """Relative error of the GEMM against K, one line per accumulation setting (log-log)."""
    ax = _ax(ax)
    for i, (label, part) in enumerate(df.groupby("accumulation", sort=False)):
        ax.plot(part["K"], part["relative error"], marker="o", color=PALETTE[i % 10], label=label)
    _log(ax, "x", base=2)
    _log(ax, "y")
    ax.set_xlabel("K (length of each dot product)")
    ax.set_ylabel("relative error vs exact")
    ax.legend(fontsize=8)
    ax.set_title("accumulation precision and K")
    return ax


def bars(values: dict[str, float], ax=None, ylabel: str = "", title: str = "", log: bool = False,
         highlight: str | None = None):
    """A bar per named value (e.g. error per recipe, time per backend)."""
    ax = _ax(ax)
    names = list(values)
    colors = [CLIP if n == highlight else PALETTE[i % 10] for i, n in enumerate(names)]
    ax.bar(range(len(names)), [values[n] for n in names], color=colors)
    ax.set_xticks(range(len(names)), names, rotation=20)
    if log:
        _log(ax, "y")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return ax


# ---- training ---------------------------------------------------------------------------------------------------


def loss_curves(history, ax=None, smooth: int = 5, title: str = "training loss"):
    """Loss against step, one line per run (a rolling mean over `smooth` steps), log y."""
    ax = _ax(ax)
    for i, (run, part) in enumerate(history.groupby("run", sort=False)):
        y = part["loss"].rolling(smooth, min_periods=1).mean() if smooth > 1 else part["loss"]
        ax.plot(part["step"], y, color=PALETTE[i % 10], label=run, lw=1.5)
    _log(ax, "y")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (log scale)")
    ax.set_title(title)
    if len(history):
        ax.legend(fontsize=8, loc="upper right")
    return ax


def monitor_lines(monitor, metric: str = "underflow", ax=None, gemm: str = "fprop", role: str = "input"):
    """A per-layer statistic over training (fraction underflowed, overflowed, amax), per run."""
    ax = _ax(ax)
    if monitor is None or len(monitor) == 0:
        ax.set_title(f"{metric}: nothing recorded yet")
        return ax
    part = monitor[(monitor["gemm"] == gemm) & (monitor["role"] == role)]
    styles = ["-", "--", ":", "-."]
    for i, (run, by_run) in enumerate(part.groupby("run", sort=False)):
        for j, (layer, d) in enumerate(by_run.groupby("layer", sort=False)):
            ax.plot(d["step"], d[metric], color=PALETTE[i % 10], ls=styles[j % 4], lw=1.2, label=f"{run} {layer}")
    ax.set_xlabel("step")
    ax.set_ylabel({"underflow": "fraction flushed to 0", "overflow": "fraction clipped"}.get(metric, metric))
    ax.set_title(f"{metric} of each layer's {role} ({gemm})")
    ax.legend(fontsize=7, ncol=2, loc="upper right")
    return ax


def amax_over_steps(df, ax=None):
    """Delayed scaling over steps: each step's amax, the amax its scale used, and the clips."""
    ax = _ax(ax)
    ax.plot(df["step"], df["amax"], color=PALETTE[0], label="this step's amax")
    for i, col in enumerate(c for c in df.columns if c.startswith("scale amax")):
        ax.step(df["step"], df[col], where="mid", color=PALETTE[i + 1], label=col.replace("scale amax", "used"))
    for i, col in enumerate(c for c in df.columns if c.startswith("overflow")):
        hit = df[df[col] > 0]
        ax.scatter(hit["step"], hit["amax"], color=CLIP, marker="x", s=50, zorder=5,
                   label="clipped (overflow)" if i == 0 else None)
    _log(ax, "y")
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
    ax = _ax(ax)
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
