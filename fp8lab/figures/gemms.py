"""Figures of a linear layer's GEMMs: one activation as two GEMMs quantize it, and what the mismatch costs.

Public: flushed_map (the share of x[M, K]'s values one GEMM's quantization flushed to zero, in x's layout;
flushed_grid: its cells),
mismatch_flush and mismatch_losses (notebook 06: fc2's input flushed per recipe and GEMM; final losses beside
a constant predictor), copies_bars (notebook 06: the share of a weight's codes its fprop and dgrad copies hold
differently, per recipe). Declarative, as fp8lab.figures.plots: data in, the ax out.
"""

from __future__ import annotations

import numpy as np
import torch

from fp8lab.figures.plots import CLIP, FLUSH, PALETTE, ax_or_new, block_grid, heatmap

__all__ = ["copies_bars", "flushed_grid", "flushed_map", "mismatch_flush", "mismatch_losses"]


def flushed_map(x: torch.Tensor, values: torch.Tensor | None, ax=None, title: str = "", colorbar=None,
                outlier_channels=None):
    """Where x[M, K]'s nonzero values became zero in `values` (its dequantized operand, in x's layout; None:
    the GEMM runs in high precision, nothing flushes), pooled to at most 64 x 64 cells: dark cells lost most.
    Outlier channels are marked along the top."""
    ax = ax_or_new(ax)
    m, k = x.shape
    heatmap(ax, flushed_grid(x, values), "magma_r", "share flushed to 0", vmin=0, vmax=1, shape=(m, k),
             colorbar=colorbar)
    if outlier_channels is not None and len(outlier_channels):
        cols = np.asarray(outlier_channels, dtype=float) + 0.5
        ax.scatter(cols, np.full(len(cols), -0.02 * m), marker="v", s=30, color=CLIP, clip_on=False,
                   label="outlier channels")
    ax.set_xlabel("channel (K)")
    ax.set_ylabel("token (M)")
    ax.set_title(title, fontsize=9)
    return ax


def flushed_grid(x: torch.Tensor, values: torch.Tensor | None) -> np.ndarray:
    """The cells flushed_map colours: the share of x's nonzero values that are zero in `values` (None: none),
    pooled to at most 64 x 64 (fp8lab.figures.plots.block_grid)."""
    x = x.detach().float()
    flushed = torch.zeros_like(x) if values is None else ((x != 0) & (values == 0)).float()
    return block_grid(flushed)


def mismatch_flush(df, ax=None):
    """Share of fc2's input flushed to zero, per recipe (groups) and GEMM (bars: fprop, wgrad), each bar
    labelled with its share; a GEMM kept in high precision is marked "no FP8" instead of a bar. df: index
    (recipe, gemm), columns underflow and format ("high precision" where nothing is quantized)."""
    ax = ax_or_new(ax)
    recipes = list(dict.fromkeys(df.index.get_level_values(0)))
    width = 0.38
    for j, (gemm, color) in enumerate((("fprop", PALETTE[0]), ("wgrad", PALETTE[1]))):
        xs, shares, label = [], [], None  # this GEMM's bars, drawn in one call (labelled where the first has one)
        for i, recipe in enumerate(recipes):
            row = df.loc[(recipe, gemm)]
            xpos = i + (j - 0.5) * width
            if row["format"] == "high precision":
                ax.text(xpos, 0.02, "no FP8", ha="center", va="bottom", rotation=90, fontsize=8, color=color)
                continue
            label = gemm if i == 0 else label
            xs.append(xpos)
            shares.append(float(row["underflow"]))
            ax.text(xpos, shares[-1] + 0.02, f"{100 * shares[-1]:.3g}%", ha="center", va="bottom", fontsize=7)
        if xs:
            ax.bar(xs, shares, width, color=color, label=label)
    ax.set_xticks(range(len(recipes)), [r.replace("_with_", "\n+") for r in recipes], fontsize=8)
    ax.set_xlim(-0.6, len(recipes) - 0.4)
    ax.set_ylim(0, 1.3)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_ylabel("share of fc2's input flushed to 0")
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    ax.set_title("fc2's input, as each GEMM quantizes it", fontsize=9)
    return ax


def mismatch_losses(df, ax=None):
    """Final loss per recipe: the mean over seeds (bar) and each seed (dots), with the loss of predicting the
    mean target (dashed). df: columns seed, run, loss, constant."""
    ax = ax_or_new(ax)
    runs = list(dict.fromkeys(df["run"]))
    parts = [df[df.run == run] for run in runs]
    if parts:  # one call each for the bars and the dots
        ax.bar(range(len(runs)), [float(part["loss"].mean()) for part in parts], 0.6,
               color=[PALETTE[(i + 2) % 10] for i in range(len(runs))])
        ax.scatter(np.concatenate([np.full(len(part), i) for i, part in enumerate(parts)]),
                   np.concatenate([part["loss"].to_numpy() for part in parts]), color="black", s=12, zorder=3)
    ax.axhline(float(df.groupby("seed")["constant"].first().mean()), color=FLUSH, ls="--", lw=1.2,
               label="predicting the mean")
    ax.set_xticks(range(len(runs)), [r.replace("_with_", "\n+") for r in runs], fontsize=8)
    ax.set_ylabel("final loss (150 steps)")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("final loss, sinks at 1e6 (dots: seeds)", fontsize=9)
    return ax


def copies_bars(shares: dict[str, float], ax=None, highlight: str | None = None):
    """The share of a weight's elements whose fprop and dgrad copies differ, one horizontal bar per recipe (the
    highlighted one in vermillion), each labelled with its share."""
    ax = ax_or_new(ax)
    names = list(shares)
    for i, name in enumerate(names):
        v = shares[name]
        ax.barh(i, v, color=CLIP if name == highlight else PALETTE[0])
        ax.text(min(v, 0.75) + 0.02, i, f"{100 * v:.3g}%", va="center", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0], ["0%", "25%", "50%", "75%", "100%"])
    ax.set_xlabel("share of the elements whose copies differ")
    ax.set_title("fprop's copy against dgrad's", fontsize=9)
    return ax
