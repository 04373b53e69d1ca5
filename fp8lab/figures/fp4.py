"""Figures of notebook 09: the gradient side and the 4-bit training recipe, part by part.

Public: dy_range (a gradient's largest and smallest values over training, against a format's binades),
block_bars (one block's values before and after a transform, and what NVFP4 keeps of them), rounding_means
(round to nearest against the mean of stochastic roundings), error_vs_draws (one GEMM's error, one draw against
the mean of many), layer_bars (a value per layer, the layers kept in high precision marked), parts_bars (final losses of
the recipe's parts against the references). Declarative, as fp8lab.figures.plots: data in, the ax out; block_bars_data,
stochastic_label and layer_colors say what a plot draws, for a panel that moves it in place.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.ticker import MaxNLocator, PercentFormatter

from fp8lab.figures.axes import log_axis, steady_limits
from fp8lab.figures.plots import CLIP, FLUSH, PALETTE, WINDOW, ax_or_new

__all__ = ["block_bars", "block_bars_data", "dy_range", "error_vs_draws", "layer_bars", "layer_colors", "parts_bars",
           "rounding_means", "stochastic_label"]


def dy_range(ranges, layer: str, step: int | None = None, binades: dict[str, float] | None = None, ax=None):
    """log2 of a layer's largest |dy| and its smallest nonzero |dy| at every step (ranges: step, layer, amax,
    smallest), the span between them shaded; each format's span of binades drawn down from the largest value
    (one scale per tensor covers that much); the chosen step marked."""
    ax = ax_or_new(ax)
    part = ranges[ranges.layer == layer]
    hi, lo = np.log2(part["amax"].to_numpy()), np.log2(part["smallest"].to_numpy())
    steps = part["step"].to_numpy()
    ax.fill_between(steps, lo, hi, color=PALETTE[0], alpha=0.25, lw=0, label="|dy| spans")
    ax.plot(steps, hi, color=PALETTE[0], lw=1.5, label="largest |dy|")
    ax.plot(steps, lo, color=PALETTE[0], lw=1, ls="--", label="smallest nonzero |dy|")
    for i, (name, span) in enumerate((binades or {}).items()):
        ax.plot(steps, hi - span, color=(WINDOW, CLIP)[i % 2], lw=1, ls=":", label=f"{name}: {span:.0f} binades down")
    if step is not None:
        ax.axvline(step, color=FLUSH, lw=1, gid="mark")  # (gid "mark": a panel moves it in place)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("log2 |dy|")
    steady_limits(ax, "y", step=10)
    ax.set_title(f"{layer}: dy over training", fontsize=9)
    ax.legend(fontsize=6, loc="lower left")
    return ax


def block_bars_data(values: torch.Tensor, kept: torch.Tensor, ylim: float | None = None) -> dict:
    """What block_bars draws: element indices, the values (bars), the (x, y) of the kept values (dots) and of
    the values flushed to zero (crosses), the y limit `top` (the plot spans -top to top)."""
    v, k = values.detach().double().numpy(), kept.detach().double().numpy()
    idx = np.arange(len(v))
    zero = (k == 0) & (v != 0)
    top = ylim if ylim is not None else max(float(np.abs(v).max()), float(np.abs(k).max()), 1e-30) * 1.1
    return {"idx": idx, "values": v, "kept": (idx[~zero], k[~zero]), "flushed": (idx[zero], k[zero]), "top": top}


def block_bars(values: torch.Tensor, kept: torch.Tensor, ax=None, title: str = "", ylim: float | None = None):
    """One block's values (bars) and what a quantization keeps of them (dots), element by element; the
    values kept as zero marked in grey."""
    ax = ax_or_new(ax)
    d = block_bars_data(values, kept, ylim)
    bars = ax.bar(d["idx"], d["values"], color=PALETTE[0], alpha=0.45)
    kept = ax.scatter(*d["kept"], color=PALETTE[3], s=14, zorder=3)
    flushed = ax.scatter(*d["flushed"], color=FLUSH, marker="x", s=18, zorder=3)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_ylim(-d["top"], d["top"])
    n = len(d["values"])
    ax.set_xticks([0, n // 2, n - 1])
    ax.set_xlabel("element of the block")
    ax.set_ylabel("value")
    ax.set_title(title, fontsize=9)
    # the legend's entries named here (a redraw on kept axes keeps old bar containers, whose labels it would list)
    ax.legend([bars.patches[0], kept, flushed], ["value", "NVFP4 keeps", "flushed to 0"], fontsize=6,
              loc="lower right")
    return ax


def rounding_means(x: torch.Tensor, nearest: torch.Tensor, stochastic: torch.Tensor, draws: int, grid=None, ax=None):
    """The rounded value against x: round to nearest (a staircase: its error never averages out) and the mean of
    `draws` stochastic roundings (on the diagonal, within its noise); the format's values as ticks."""
    ax = ax_or_new(ax)
    xs = x.double().numpy()
    ax.plot(xs, xs, color=FLUSH, lw=0.8, ls=":", label="x itself")
    ax.plot(xs, nearest.double().numpy(), color=PALETTE[0], lw=1.5, label="round to nearest")
    ax.plot(xs, stochastic.double().numpy(), color=PALETTE[3], lw=1.0, label=stochastic_label(draws),
            gid="stochastic")
    if grid is not None:
        for g in grid:
            ax.axhline(float(g), color=WINDOW, lw=0.4, alpha=0.5)
    ax.set_xlabel("x (in the block's scale)")
    ax.set_ylabel("value after rounding")
    ax.set_title("rounding: its mean over draws", fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    return ax


def stochastic_label(draws: int) -> str:
    """rounding_means' name for the mean of `draws` stochastic roundings (its legend entry)."""
    return f"stochastic, mean of {draws} draw{'s' if draws > 1 else ''}"


def error_vs_draws(draws: list[int], stochastic: list[float], nearest: float, single: float | None = None, ax=None):
    """Relative error of one GEMM's output against the exact product: round to nearest (one line: the same every
    time), stochastic rounding averaged over n draws (falls like 1/sqrt(n) until only the scale's error is left)."""
    ax = ax_or_new(ax)
    ax.plot(draws, stochastic, color=PALETTE[3], marker="o", ms=3, lw=1.5, label="stochastic: mean of n draws")
    ax.axhline(nearest, color=PALETTE[0], lw=1.5, label="round to nearest")
    if single is not None:
        ax.scatter([draws[0]], [single], color=CLIP, zorder=3, s=20, label="one step, stochastic")
    ax.set_xscale("log")
    log_axis(ax, "y")
    ax.set_xlabel("draws averaged (steps)")
    ax.set_ylabel("relative error of dW")
    ax.set_title("the weight gradient: one step and many", fontsize=9)
    ax.legend(fontsize=6, loc="lower left")
    return ax


def layer_bars(df, column: str, ax=None, ylabel: str = "", title: str = "", percent: bool = False):
    """A bar per layer (df indexed by layer, with `column` and "kept in high precision"), the kept layers in
    vermillion; percent: the column is a share (0-1), shown in %."""
    ax = ax_or_new(ax)
    names = list(df.index)
    ax.bar(range(len(names)), df[column], color=layer_colors(df))
    ax.set_xticks(range(len(names)), [n.replace("blocks.", "b") for n in names], rotation=90 if len(names) > 4 else 0,
                  fontsize=7)
    if percent:
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))
    ax.set_xlabel("linear layer, in model order")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return ax


def layer_colors(df) -> list:
    """layer_bars' colour of each layer's bar: vermillion where df["kept in high precision"], else blue."""
    return [CLIP if k else PALETTE[0] for k in df["kept in high precision"]]


def parts_bars(values: dict[str, float], spread: dict[str, float] | None = None, highlight: str | None = None,
               reference: float | None = None, ax=None, ylabel: str = "final loss vs bf16", title: str = ""):
    """A bar per run: its loss relative to a reference (values: run -> relative change, 0.05 = 5% above), the
    seeds' spread as an error bar, the highlighted run in vermillion."""
    ax = ax_or_new(ax)
    names = list(values)
    colors = [CLIP if n == highlight else PALETTE[i % 10] for i, n in enumerate(names)]
    err = [spread.get(n, 0.0) for n in names] if spread else None
    ax.bar(range(len(names)), [values[n] for n in names], yerr=err, color=colors, capsize=3)
    ax.set_xticks(range(len(names)), [n.replace(" ", "\n", 1) for n in names], fontsize=7)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))
    if reference is not None:
        ax.axhline(reference, color=FLUSH, lw=1, ls="--")
    top = max([v for v in values.values() if math.isfinite(v)] + [0.01])
    ax.set_ylim(min(0.0, min(values.values())) * 1.2, top * 1.25)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return ax
