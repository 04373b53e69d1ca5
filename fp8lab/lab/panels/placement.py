"""Notebook 06's panel on where the sinks sit: which scales they break, in the forward and the weight-gradient
GEMM (PlacementPanel).

Public: PlacementPanel. Wiring only: the numbers come from fp8lab.training.operands.placement_flush (fc2's input in
the lesson MLP with the sinks in every token, in a few tokens, or both, quantized as each GEMM reads it).
"""

from __future__ import annotations

import pandas as pd
from matplotlib.ticker import MaxNLocator, PercentFormatter

from fp8lab.figures import gemms
from fp8lab.figures.plots import magnitude
from fp8lab.lab.panels.base import Panel, dropdown, metrics_html, percent, selection_slider
from fp8lab.training.models import PLACEMENTS
from fp8lab.training.operands import placement_flush
from fp8lab.training.published import sinks_for

__all__ = ["PlacementPanel"]

RATIOS = (20.0, 100.0, 1e3, 1e4, 1e5, 1e6)  # the sinks' value over the median ordinary input of fc2
WHERE = {"channels": "4 channels of every token (LLM.int8()'s outlier features)",
         "tokens": "4 channels of the first 2 tokens (massive activations, Sun et al.)",
         "both": "4 channels of every token, and 4 more of the first 2 tokens"}


class PlacementPanel(Panel):
    """fc2's input with the sinks at one placement and ratio: the share of its ordinary values each recipe's
    fprop (along K: a token's channels) and wgrad (along M: a channel's tokens) GEMM flushes, overall (left) and
    in the one token or channel that loses most (right)."""

    title = "where the sinks sit decides which scales they break"
    ncols, width, height = 2, 4.2, 3.2
    keep_axes = True  # the axes and their tick objects kept between placements and ratios
    live_sliders = False  # a new ratio quantizes fc2's input anew: it redraws when the slider is released

    def __init__(self) -> None:
        super().__init__(
            placement=dropdown([(WHERE[p].split(" (")[0], p) for p in PLACEMENTS], "channels", "sinks in"),
            ratio=selection_slider([(f"{magnitude(r)}x", r) for r in RATIOS], 1e5, "sinks / median"),
        )
        self._cache: dict[tuple[str, float], pd.DataFrame] = {}

    def table(self, placement: str, ratio: float) -> pd.DataFrame:
        """fp8lab.training.operands.placement_flush at one placement and ratio (measured once per pair)."""

        if (placement, ratio) not in self._cache:
            self._cache[placement, ratio] = placement_flush(ratio, (placement,))
        return self._cache[placement, ratio]

    def compute(self, placement, ratio) -> dict:
        return {"df": self.table(placement, ratio), "placement": placement, "ratio": ratio, "sinks": sinks_for(ratio)}

    def draw(self, data, axes) -> None:
        df = data["df"].assign(format="e4m3")
        for ax, column, label in ((axes[0], "flushed", "share of the ordinary values flushed"),
                                  (axes[1], "worst", "in the token (fprop) or channel (wgrad)\nthat loses most")):
            part = df.set_index(["recipe", "gemm"]).rename(columns={column: "underflow"})
            gemms.mismatch_flush(part, ax)
            ax.set_ylim(0, max(0.05, 1.8 * float(part["underflow"].max()) + 0.03))  # room for the labels, legend
            ax.yaxis.set_major_locator(MaxNLocator(4))
            ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))
            ax.set_ylabel(label, fontsize=8)
        axes[0].set_title(f"sinks in {data['placement']}, {magnitude(data['ratio'])}x the median", fontsize=9)
        axes[1].set_title("where the damage is", fontsize=9)

    def describe(self, data) -> str:
        df = data["df"]
        rows = {"sinks": f"{data['sinks']:g} ({magnitude(data['ratio'])}x the median ordinary input) in "
                         f"{WHERE[data['placement']]}"}
        for recipe, part in df.groupby("recipe", sort=False):
            by = part.set_index("gemm")
            rows[recipe] = "; ".join(f"{g} ({by.loc[g, 'scale']}): {percent(by.loc[g, 'flushed'])} flushed, "
                                     f"{percent(by.loc[g, 'worst'])} of the worst "
                                     f"{'token' if g == 'fprop' else 'channel'}"
                                     for g in ("fprop", "wgrad"))
        return metrics_html(rows)
