"""Figures of notebook 09's parts shown at work: each backward part of the NVFP4 recipe doing its job.

Public: sum_error (a GEMM sum's error against its length, round to nearest against stochastic, per value and in
the sum), weight_path (a weight moved by small updates, step by step), contrast_bars (relative errors without and
with a transform, grouped), depth_curves (dgrad's drift from the chain rule through depth, 1-D against 2-D
weights), pair_bars (two runs per group, side by side). Declarative, as fp8lab.figures.plots: data in, the ax out.
"""

from __future__ import annotations

import numpy as np
from matplotlib.ticker import PercentFormatter

from fp8lab.figures.axes import log_axis
from fp8lab.figures.plots import CLIP, FLUSH, PALETTE, ax_or_new

__all__ = ["contrast_bars", "depth_curves", "pair_bars", "sum_error", "weight_path"]

NEAREST, STOCHASTIC = PALETTE[0], PALETTE[3]  # the two roundings' colours, in every figure here


def sum_error(ks, nearest, stochastic, per_value: dict[str, float], mark: int | None = None, ax=None,
              title: str = ""):
    """Relative error of sums of k values against k (log-log): round to nearest and one stochastic draw (solid), each
    rounding's error per value (dotted, the same colour); the chosen k marked."""
    ax = ax_or_new(ax)
    ax.plot(ks, nearest, color=NEAREST, marker="o", ms=3, lw=1.5, label="round to nearest: the sum")
    ax.plot(ks, stochastic, color=STOCHASTIC, marker="o", ms=3, lw=1.5, label="stochastic (one draw): the sum")
    ax.axhline(per_value["nearest"], color=NEAREST, lw=1, ls=":", label="round to nearest: per value")
    ax.axhline(per_value["stochastic"], color=STOCHASTIC, lw=1, ls=":", label="stochastic: per value")
    if mark is not None:
        ax.axvline(mark, color=FLUSH, lw=0.8, gid="mark")  # (gid "mark": a panel moves it in place)
    ax.set_xscale("log", base=2)
    log_axis(ax, "y")
    ax.set_xlabel("values summed (k, the GEMM's contraction)")
    ax.set_ylabel("relative error")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="lower left")
    return ax


def weight_path(exact, nearest, stochastic, ax=None, title: str = ""):
    """A weight's value after each step: the exact updates (dotted), round to nearest and stochastic rounding (three
    lines, in that order)."""
    ax = ax_or_new(ax)
    steps = np.arange(len(exact))
    ax.plot(steps, np.asarray(exact), color=FLUSH, lw=1, ls=":", label="exact updates")
    ax.plot(steps, np.asarray(nearest), color=NEAREST, lw=1.5, label="gradient rounded to nearest")
    ax.plot(steps, np.asarray(stochastic), color=STOCHASTIC, lw=1.2, label="gradient rounded stochastically")
    ax.set_xlabel("step")
    ax.set_ylabel("weight (start 0, learning rate 1)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="lower left")
    return ax


def contrast_bars(table, ax=None, title: str = ""):
    """table indexed by (format, rounding) with "without" and "with": a pair of bars per row, the transform's bar
    hatched."""
    ax = ax_or_new(ax)
    labels = [f"{f}\n{'to nearest' if r == 'nearest' else 'stochastic'}" for f, r in table.index]
    x = np.arange(len(labels))
    ax.bar(x - 0.2, table["without"], 0.4, color=PALETTE[0], label="as it is")
    ax.bar(x + 0.2, table["with"], 0.4, color=CLIP, hatch="//", label="random Hadamard (d = 16) first")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("relative error of dy (wgrad's layout)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    return ax


def depth_curves(depths, one_d, two_d, mark: int | None = None, ax=None, title: str = ""):
    """dgrad's drift from the chain rule against depth: 1-D weight copies and 2-D blocks."""
    ax = ax_or_new(ax)
    ax.plot(depths, one_d, color=CLIP, marker="o", ms=3, lw=1.5, label="1 x c weight blocks (two copies)")
    ax.plot(depths, two_d, color=PALETTE[2], marker="s", ms=3, lw=1.5, label="c x c weight blocks (one copy)")
    if mark is not None:
        ax.axvline(mark, color=FLUSH, lw=0.8, gid="mark")
    ax.set_xscale("log", base=2)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))
    ax.set_xlabel("layers the gradient has come back through")
    ax.set_ylabel("dgrad's dx against the chain rule's")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    return ax


def pair_bars(groups, first, second, names: tuple[str, str], ax=None, ylabel: str = "", title: str = ""):
    """Two bars per group (first, second: a value per group, relative changes), the second hatched; 0 drawn."""
    ax = ax_or_new(ax)
    x = np.arange(len(groups))
    ax.bar(x - 0.2, first, 0.4, color=PALETTE[0], label=names[0])
    ax.bar(x + 0.2, second, 0.4, color=PALETTE[2], hatch="//", label=names[1])
    ax.axhline(0, color=FLUSH, lw=1, ls="--")
    ax.set_xticks(x, groups, fontsize=7)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="center right")
    return ax
