"""Notebook 09's panel on the gradient side: dy over training, and what each FP8 choice for it keeps (GradientPanel).

Public: GradientPanel, dy_loss_table (the shipped runs of the four choices for dy). Wiring only: dy comes from
fp8lab.training.gradients (each linear layer's output gradient in a high-precision run of the lesson MLP and of
notebook 08's LLM-like model), the statistics from its dy_choice_table, the plots from fp8lab.figures.
"""

from __future__ import annotations

from fp8lab.figures import fp4 as figs
from fp8lab.figures import plots
from fp8lab.lab import redraw
from fp8lab.lab.panels.base import Panel, _metrics_html, _pct, _select, _slider

__all__ = ["GradientPanel", "dy_loss_table"]

MODEL_NAMES = {"mlp": "lesson MLP", "llm_like": "LLM-like"}


class GradientPanel(Panel):
    """dy of one linear layer at one point of training: as the chosen FP8 choice sees it (each value over its
    block's scale, against the format's window), the scales a 1x128 tiling gives it (tokens differ), and its range
    over the whole run; beside it, every choice's flushed share and SQNR."""

    title = "the gradient side: dy over training, and what E4M3 / E5M2, per tensor / 1x128 keep of it"
    ncols, width, height = 3, 4.0, 3.3
    keep_axes = True  # the heatmap's colorbar kept

    def __init__(self) -> None:
        from fp8lab.settings import smoke
        from fp8lab.training.gradients import DY_CHOICES, WHEN, lesson_records

        self.records = lesson_records(0, smoke())
        layers = [(f"{MODEL_NAMES[m]}: {layer}", (m, layer)) for m, rec in self.records.items() for layer in rec.layers]
        self._tables: dict = {}
        super().__init__(
            layer=_select(layers, ("llm_like", "blocks.0.qkv") if "llm_like" in self.records else layers[0][1],
                          "layer"),
            when=_slider(WHEN, WHEN[-1], "when"),
            choice=_select([c[0] for c in DY_CHOICES], "E4M3 per-tensor", "dy in"),
        )

    def compute(self, layer, when, choice) -> dict:
        import torch

        from fp8lab.numerics.quantize import quantize
        from fp8lab.training.gradients import DY_CHOICES, WHEN, dy_choice_table

        model, name = layer
        rec = self.records[model]
        step = rec.at[WHEN.index(when)]
        dy = rec.snapshots[step, name]
        if (model, name, step) not in self._tables:
            self._tables[model, name, step] = dy_choice_table(dy)
        table = self._tables[model, name, step]
        _, fmt, granularity = next(c for c in DY_CHOICES if c[0] == choice)
        q = quantize(dy, fmt, granularity)
        seen = dy / q.expanded_scale()  # each value as the format sees it: over its block's scale
        tiles = quantize(dy, "e4m3", "1x128")  # the scales 1x128 tiles give dy: one per token per 128 channels
        a = dy.abs()
        span = float(torch.log2(a.max() / a[a > 0].min())) if bool((a > 0).any()) else 0.0
        return {"model": model, "layer": name, "step": step, "steps": rec.steps, "choice": choice, "q": q,
                "seen": seen, "tiles": tiles, "table": table, "ranges": rec.ranges, "span": span,
                "shape": tuple(dy.shape)}

    def draw(self, data, axes) -> None:
        from fp8lab.numerics.formats import E4M3, E5M2

        plots.histogram_log2(data["seen"], fmt=data["q"].fmt, scale=1.0, ax=axes[0], xlim=(-40, 15),
                             title=f"dy over its scale: {data['choice']}")
        plots.scale_heatmap(data["tiles"], axes[1], colorbar=redraw.kept_colorbar(axes[1]))
        axes[1].set_title("1x128 tiles' scales: tokens differ", fontsize=9)
        axes[1].set_xlabel("block of 128 output channels (N)")
        axes[1].set_ylabel("token (M)")
        figs.dy_range(data["ranges"], data["layer"], data["step"], {"E4M3": E4M3.dynamic_range_binades,
                                                                     "E5M2": E5M2.dynamic_range_binades}, axes[2])

    def describe(self, data) -> str:
        t = data["table"]
        rows = {c: (f"{_pct(r['flushed'])} of dy's nonzero values flushed to 0, SQNR {r['sqnr_db']:.1f} dB, "
                    f"{r['binades_used']:.0f} binades used") for c, r in t.iterrows()}
        where = f"{MODEL_NAMES[data['model']]} {data['layer']}, step {data['step']} of {data['steps']}"
        return (f"<p><b>{where}</b>: dy[{data['shape'][0]}, {data['shape'][1]}] spans {data['span']:.1f} binades "
                f"(largest over smallest nonzero); E4M3 covers 17.8, E5M2 31.8.</p>" + _metrics_html(rows))


def dy_loss_table():
    """The shipped gradient runs (fp8lab.training.measured_fp4.dy_runs: fp32 and the four choices for dy, forward as
    blockwise's), mean of the seeds, each loss also as its change against fp32's: a DataFrame per (model, run)."""
    from fp8lab.training.measured_fp4 import dy_runs, means

    m = means(dy_runs())
    out = m.copy()
    for col in m.columns:
        fp32 = m[col].xs("fp32", level="run")
        out[f"{col} vs fp32"] = [f"{100 * (v / fp32[model] - 1):+.2f}%" for (model, _), v in m[col].items()]
    out = out.rename(index={"mlp": "lesson MLP", "llm_like": "LLM-like"}, level="model")
    return out[[c for pair in zip(m.columns, [f"{c} vs fp32" for c in m.columns], strict=True) for c in pair]]
