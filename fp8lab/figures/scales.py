"""Figures of where scales land: NVFP4's block scales against E4M3's floor, a weight's two quantized copies, and
published outlier ratios marked on a cliff.

Public: nvfp4_block_scales (the E4M3 block scales NVFP4's blocks need, against E4M3's range: notebook 04),
shares_vs_magnitude (shares against outlier magnitude, the current one marked), weight_copies (where a weight's
fprop and dgrad copies hold different codes: notebook 06). Declarative, as fp8lab.figures.plots: data in, ax out.
(The published outlier ratios on the cliffs are fp8lab.figures.plots.published_markers.)
"""

from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.ticker import PercentFormatter

from fp8lab.figures.axes import log_axis
from fp8lab.figures.plots import CLIP, FLUSH, PALETTE, WINDOW, ax_or_new, block_grid, heatmap

__all__ = ["NVFP4_BINS", "nvfp4_block_scales", "scale_histogram", "shares_vs_magnitude", "weight_copies"]


NVFP4_BINS = np.arange(-34, 12.5, 0.5)  # log2 of a block scale: the histogram's bin edges (xlim is their range)


def scale_histogram(ideal: torch.Tensor, clean: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Counts per NVFP4_BINS bin of log2(ideal) for the blocks without an outlier (clean) and those with one."""
    logs = torch.log2(ideal.clamp(min=2.0 ** float(NVFP4_BINS[0]))).flatten().numpy()
    mask = clean.flatten().numpy()
    return np.histogram(logs[mask], NVFP4_BINS)[0], np.histogram(logs[~mask], NVFP4_BINS)[0]


def nvfp4_block_scales(counts: tuple[np.ndarray, np.ndarray], ax=None, ymax: float | None = None,
                       floor: float = 2.0**-6, smallest: float = 2.0**-9, largest: float = 448.0):
    """A histogram of log2 of the E4M3 block scales NVFP4's 1x16 blocks need (block amax / 6 / tensor scale,
    before they are rounded to E4M3), counts per NVFP4_BINS bin (scale_histogram: the blocks without an outlier,
    the blocks with one), against E4M3's range: its smallest normal (`floor`), its smallest subnormal and its
    largest value. torchao's inference NVFP4Tensor clamps a scale needed below the smallest normal up to it (its
    block's small values flush); the training engines store it as an E4M3 subnormal, and as 0 below half the
    smallest subnormal (the block flushes whole).
    ymax: a fixed top for the count axis (the panel's largest count over every setting: the axes stay put)."""
    ax = ax_or_new(ax)
    for values, color, label in ((counts[0], PALETTE[0], "blocks without an outlier"),
                                 (counts[1], CLIP, "blocks holding an outlier channel")):
        ax.stairs(values, NVFP4_BINS, fill=True, color=color, alpha=0.75, label=label)
    ax.axvspan(math.log2(smallest), math.log2(floor), color=WINDOW, alpha=0.10, lw=0)
    ax.axvspan(math.log2(floor), math.log2(largest), color=WINDOW, alpha=0.22, lw=0)
    ax.axvline(math.log2(floor), color=WINDOW, lw=1.5)
    ax.text(math.log2(floor) + 0.3, 0.97, "E4M3's smallest normal:\ntorchao's inference\nfloor (2^-6)",
            transform=ax.get_xaxis_transform(), fontsize=7, va="top", color="black")
    ax.text(math.log2(smallest) - 0.3, 0.97, "smallest\nsubnormal:\ntraining\nengines'\nlast scale",
            transform=ax.get_xaxis_transform(), fontsize=7,
            va="top", ha="right", color="black")
    ax.set_xlim(float(NVFP4_BINS[0]), float(NVFP4_BINS[-1]))
    ax.set_ylim(0, ymax or max(1, int(max(counts[0].max(), counts[1].max()) * 1.05)))
    ax.set_xlabel("log2 of the block scale each block needs (before E4M3)")
    ax.set_ylabel("blocks")
    ax.legend(fontsize=7, loc="center left")
    ax.set_title("NVFP4's E4M3 block scales, under the tensor scale", fontsize=9)
    return ax


def shares_vs_magnitude(df, columns: dict[str, str], ax=None, mark: float | None = None, title: str = ""):
    """Shares (0..1) against outlier magnitude (log x; 'none' drawn at 1), one line per column of df (columns:
    column -> label), the magnitude `mark` marked. df: a column "outliers" and the share columns."""
    ax = ax_or_new(ax)
    x = df["outliers"].where(df["outliers"] > 0, 1.0).to_numpy()
    for i, (column, label) in enumerate(columns.items()):
        ax.plot(x, df[column].to_numpy(), marker="o", ms=4, color=PALETTE[i % 10], label=label)
    if mark is not None:
        ax.axvline(mark if mark > 0 else 1.0, color=FLUSH, ls=":", lw=1, gid="mark")
    ax.set_xscale("log")
    log_axis(ax, "x")
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("outlier channels (x the others; 1: none)")
    ax.set_ylabel("share")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title, fontsize=9)
    return ax


def weight_copies(differ: torch.Tensor, ax=None, title: str = "", colorbar=None):
    """Where a weight w[N, K]'s two quantized copies (fprop's, dgrad's) hold different values, pooled to at most
    64 x 64 cells: the share of each cell's elements whose copies differ."""
    ax = ax_or_new(ax)
    n, k = differ.shape
    heatmap(ax, block_grid(differ.float()), "magma_r", "share that differs", vmin=0, vmax=1, shape=(n, k),
             colorbar=colorbar)
    ax.set_xlabel("input channel (K)")
    ax.set_ylabel("output channel (N)")
    ax.set_title(title, fontsize=9)
    return ax
