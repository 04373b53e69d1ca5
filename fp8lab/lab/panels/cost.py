"""Notebooks 05 and 08's panel: what each recipe costs beside what it buys (CostPanel).

Public: CostPanel. Wiring only: the numbers come from fp8lab's functions.
"""


from __future__ import annotations

import html

from fp8lab.figures import plots
from fp8lab.lab import redraw
from fp8lab.lab.panels.base import (
    Panel,
    dropdown,
    memo,
    selection_slider,
)
from fp8lab.settings import size
from fp8lab.training import cost
from fp8lab.training.cost import PARALLEL, PUBLISHED_NOTE

__all__ = ["CostPanel"]


class CostPanel(Panel):
    """What each recipe costs (fp8lab.cost): scale storage, scale multiplies in the GEMM, the amax,
    this machine's measured times, and published GPU speed-ups with their sources."""

    title = "the cost side: is per-tensor cheaper, and where?"
    _drawn: list | None  # the two left plots' bars: what a drag moves
    width, height, ncols = 4.0, 3.0, 3
    bottom = 1.0  # the recipes' names under the bars, turned upright (tests/test_widgets.py checks legibility)
    keep_axes = True

    def __init__(self) -> None:
        super().__init__(
            k=selection_slider([256, 1024, 4096, 16384], 4096, "K (contraction length)"),
            parallel=dropdown(PARALLEL, PARALLEL[0], "parallelism"),
        )
        self.tokens = 4096  # M: rows of x in the GEMM x[M, K] @ w[K, K]^T
        self.size = size(512, 128)
        self._measured = None  # timed once per panel: the controls change nothing that is timed
        self._tables: dict[tuple[int, str], dict] = {}  # compute's tables per (k, parallel): a drag back reuses them

    def compute(self, k, parallel) -> dict:
        if self._measured is None:
            self._measured = cost.measure(size=self.size, rounds=3)

        def make() -> dict:
            table = cost.cost_table(k=k, m=self.tokens, parallel=parallel)
            comparison = cost.per_tensor_vs_block(table, self._measured)
            return {"table": table, "measured": self._measured, "comparison": comparison,
                    "answer": cost.answer(comparison)}

        return {**memo(self._tables, (k, parallel), make), "k": k, "parallel": parallel}

    @staticmethod
    def _values(data) -> tuple[dict, dict, str]:
        """The two left plots' values (bars by recipe) and the middle plot's title: what changes with K."""
        table = data["table"]
        return ((table["element bits"] + table["scale bits/element (x)"]).to_dict(),
                table["scale multiplies per output"].astype(float).to_dict(), f"scale multiplies, K={data['k']}")

    def _steady(self, ax) -> None:
        # up to 1 per 16 elements of the longest K (NVFP4): the axis holds every K's bars
        plots.steady_limits(ax, "y", lo=0.5, hi=max(self.controls["k"].options) / 16)

    def draw(self, data, axes) -> None:
        measured = data["measured"]
        bits, multiplies, title = self._values(data)
        plots.bars(bits, axes[0], ylabel="bits per element of x", title="bits moved (element + scales)")
        plots.bars(multiplies, axes[1], log=True, ylabel="multiplies per output element", title=title)
        self._steady(axes[1])
        plots.bars(measured["quantize ms"].drop("fp32 (no FP8)").to_dict(), axes[2], ylabel="ms (median of 3)",
                   title=f"quantize {self.size}x{self.size} here")
        self._drawn = [(list(bits), list(axes[0].patches)), (list(multiplies), list(axes[1].patches))]

    def draw_in_place(self, data) -> bool:
        """Another K: the same recipes' bars take their new heights, the left plot's limits from its data again, the
        middle one's steady limits and its title set again, as plots.bars and steady_limits draw them."""
        if self._drawn is None:
            return False
        values = self._values(data)
        if any(list(v) != names for v, (names, _) in zip(values[:2], self._drawn, strict=True)):
            return False
        axes = self._figure[1]
        for v, (_, bars) in zip(values[:2], self._drawn, strict=True):
            redraw.move_bars(bars, list(v.values()))
        redraw.rescale(axes[0])
        axes[1].relim()
        self._steady(axes[1])
        axes[1].set_title(values[2])
        return True

    def describe(self, data) -> str:
        table = data["table"]
        rows = "".join(
            f"<tr><td><b>{html.escape(r)}</b></td><td>{html.escape(t['amax'])}</td>"
            f"<td>{html.escape(t['published GPU speed-up'])}</td></tr>" for r, t in table.iterrows())
        sources = sorted({s for v in table["sources"] for s in v.split("; ") if s})

        where = html.escape(data["parallel"])
        return (f"<table style='font-size:12px'><tr><th>recipe</th><th>how the amax is found ({where})</th>"
                f"<th>published GPU speed-up (over BF16)</th></tr>{rows}</table>"
                f"<p style='font-size:11px'>sources: {html.escape(' | '.join(sources))}. "
                f"{html.escape(PUBLISHED_NOTE)}</p><p><b>Is per-tensor cheaper?</b> {html.escape(data['answer'])}</p>")
