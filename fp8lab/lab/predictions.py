"""Predict, then see: the widget that asks for a prediction before a panel reveals the answer.

Public: Prediction(name) (commit to an option, then Reveal shows the measured answer beside it),
PREDICTIONS (each prediction's notebook, question, options and how to measure the answer from
the panels' own data), PredictionSpec, MARGIN. Notebooks 02, 04, 05 and 06 ask one each, notebook 09 two.
An answer must not hang on a detail: each spec also measures its answer on other seeds of the same
data (at(seed) -> (option, margin)), and tests require the same option on every seed with the
measured value at least MARGIN (a factor) away from the nearest bin edge.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import ipywidgets as W

from fp8lab.training.measured import cliff, cliff_means

__all__ = ["MARGIN", "PREDICTIONS", "Prediction", "PredictionSpec", "magnitude", "share"]

# how far (a factor) a measured value must lie from the nearest bin edge, on every seed tests try
MARGIN = 1.2


@dataclass(frozen=True)
class PredictionSpec:
    """A prediction asked before a panel reveals it: measure() -> (the right option, why), from the data the
    panel shows; at(seed) -> (the option, its margin) on another draw of the same data: the factor between the
    measured value and the nearest bin edge (for a choice among options, between the winner's and the
    runner-up's noise)."""

    notebook: str
    question: str
    options: tuple[str, ...]
    measure: Callable[[], tuple[str, str]]
    at: Callable[[int], tuple[str, float]]


def _pct(v: float) -> str:
    return f"{100 * v:.3g}%"


def share(v: float, floor: float = 1e-4) -> str:
    """A share as the answer key prints it: 3 significant digits, or "under 0.01%" below `floor`.
    The digits of a share that small follow the training trajectory, which moves with the machine
    (threads, instruction sets); the claim it supports does not."""
    return f"under {_pct(floor)}" if v < floor else _pct(v)


def magnitude(v: float) -> str:
    """A magnitude as the lab writes it (fp8lab.figures.plots.magnitude): 1e5, 100, none."""
    from fp8lab.figures.plots import magnitude as label

    return label(v)


def _panel(name: str):
    from fp8lab.lab.panels import PANELS

    return PANELS[name]()


# ---- predictions --------------------------------------------------------------------------------------------------


def _binned(value: float, edges: Sequence[float], options: Sequence[str]) -> tuple[str, float]:
    """The option whose bin holds `value` (bins split at the ascending `edges`), and the factor between the
    value and the nearest edge (inf without edges; 0 on an edge)."""
    option = options[sum(value >= e for e in edges)]
    gaps = [max(value / e, e / value) if value > 0 else math.inf for e in edges]
    return option, min(gaps, default=math.inf)


FLUSH_AT, FLUSH_EDGES = 1e5, (0.01, 0.2, 0.8)
FLUSH_OPTIONS = ("under 1%", "1-20%", "20-80%", "over 80%")


def _flush(seed: int) -> dict:
    """The per-tensor panel's report at outliers 1e5 (E4M3), on the panel's tensor drawn with `seed`."""
    from fp8lab.data.synthetic import sample
    from fp8lab.numerics.metrics import quantization_report
    from fp8lab.numerics.quantize import quantize

    x, idx = sample("normal", _panel("per_tensor").shape, FLUSH_AT, seed=seed, return_outliers=True)
    return quantization_report(x, quantize(x, "e4m3"), idx)


def _p02_flush() -> tuple[str, str]:
    r = _panel("per_tensor").update(outliers=FLUSH_AT)["report"]
    option, _ = _binned(r["ordinary_underflow"], FLUSH_EDGES, FLUSH_OPTIONS)
    return option, (f"{_pct(r['ordinary_underflow'])} of the ordinary values flush to zero, while the whole-tensor "
                    f"SQNR reads {r['sqnr_db']:.1f} dB: the outliers' energy hides the damage.")


BLOCK_OPTIONS = ("per-tensor", "per-row", "128x128", "1x128", "1x32")


def _blocks(seed: int) -> dict[str, float]:
    """SQNR of the ordinary channels per block option at outliers 1e5, on notebook 04's tensor drawn with `seed`."""
    from fp8lab.lab.panels.blocks import block_table

    return block_table(BLOCK_OPTIONS, 1e5, seed)["ordinary_sqnr_db"].astype(float).to_dict()


def _winner(db: dict[str, float]) -> tuple[str, float]:
    first, second = sorted(db.values(), reverse=True)[:2]
    return max(db, key=db.get), 10 ** ((first - second) / 10)  # the runner-up's noise over the winner's


def _p04_block() -> tuple[str, str]:
    sq = _blocks(0)
    best, _ = _winner(sq)
    return best, "SQNR of the ordinary channels: " + ", ".join(f"{b} {v:.1f} dB" for b, v in sq.items()) + "."


GEMM_EDGES, GEMM_OPTIONS = (1.5, 3.0), ("about the same", "1.5-3x larger", "more than 3x larger")


def _gemm_ratio(seed: int) -> float:
    """tensorwise's GEMM error over blockwise's, outliers 1e5 in a, b's rows for them zero: the GEMM panel's
    operands drawn with seeds 1 + seed (a) and 2 + seed (b), as the panel draws seeds 1 and 2."""
    e = _panel("gemm").errors(k=1024, outliers=1e5, distribution="normal", weights="zero rows", seed=seed)
    return e["tensorwise"] / e["blockwise"]


def _p05_gemm() -> tuple[str, str]:
    e = _panel("gemm").update(outliers=1e5, weights="zero rows")["errors"]
    ratio = e["tensorwise"] / e["blockwise"]
    option, _ = _binned(ratio, GEMM_EDGES, GEMM_OPTIONS)
    return option, (f"tensorwise {_pct(e['tensorwise'])}, blockwise {_pct(e['blockwise'])}: {ratio:.2g}x. The "
                    "output is made of the ordinary channels only, and per tensor they flush.")


BREAK_LIMIT = 0.05


def _break_at(seed: int | None) -> tuple[str, float]:
    """The first sink value at which tensorwise ends more than 5% worse than without sinks, from the shipped
    runs (seed None: the mean of the seeds), and the factor between the changes on either side of it and 5%."""
    if seed is None:
        change = cliff_means()[2].xs("tensorwise", level="run")
    else:
        d = cliff()
        d = d[(d.seed == seed) & (d.run == "tensorwise")].set_index("sinks")["loss"]
        change = d / d[0.0] - 1
    sinks = [s for s in change.index if s > 0]  # ascending
    i = next((j for j, s in enumerate(sinks) if change[s] > BREAK_LIMIT), len(sinks))
    option = magnitude(sinks[i]) if i < len(sinks) else "never (up to 1e7)"
    gaps = [change[sinks[i]] / BREAK_LIMIT] if i < len(sinks) else []
    if i > 0:  # the sink value below it stays under 5%: by how much
        below = change[sinks[i - 1]]
        gaps.append(BREAK_LIMIT / below if below > 0 else math.inf)
    return option, min(gaps, default=math.inf)


def _p06_break() -> tuple[str, str]:
    change = cliff_means()[2]
    option, _ = _break_at(None)
    tw = change.xs("tensorwise", level="run")
    return option, ("tensorwise's final loss against its own no-sink run (3 seeds): " +
                    ", ".join(f"{magnitude(m)}: {100 * v:+.0f}%" for m, v in tw.items() if m > 0) + ".")


DY_AT, DY_EDGES = ("llm_like", "blocks.0.qkv"), (1e-4, 2e-3, 3e-2)
DY_OPTIONS = ("under 0.01%", "0.01-0.2%", "0.2-3%", "over 3%")


def _dy(seed: int):
    """The LLM-like model's attention projection gradient (blocks.0.qkv's dy) at the first step, seed `seed`: what
    GradientPanel shows there (fp8lab.training.gradients.record_dy; the first step needs no training)."""
    from fp8lab.training.gradients import dy_choice_table, record_dy

    model, layer = DY_AT
    dy = record_dy(model, steps=1, at=(0,), seed=seed).snapshots[0, layer]
    return dy, dy_choice_table(dy)


def _p09_dy() -> tuple[str, str]:
    import torch

    dy, t = _dy(0)
    option, _ = _binned(t.loc["E4M3 per-tensor", "flushed"], DY_EDGES, DY_OPTIONS)
    a = dy.abs()
    span = float(torch.log2(a.max() / a[a > 0].min()))
    return option, (f"E4M3 per tensor flushes {_pct(t.loc['E4M3 per-tensor', 'flushed'])} of it, E5M2 per tensor "
                    f"{share(t.loc['E5M2 per-tensor', 'flushed'])}, E4M3 in 1x128 tiles "
                    f"{share(t.loc['E4M3 1x128', 'flushed'], 1e-5)}: the gradient spans {span:.1f} binades, and its "
                    "tokens differ by most of them.")


FP4_EDGES, FP4_OPTIONS = (0.01, 0.05, 0.15), ("within 1%", "1-5%", "5-15%", "over 15%")
FP4_FULL = "nvfp4 2D+RHT+SR+HP"


def _fp4_gap(seed: int | None) -> float:
    """NVFP4 with every part of its training recipe: final loss against bf16's, the lesson MLP (shipped runs;
    seed None: each seed's change, averaged)."""
    from fp8lab.training.measured_fp4 import parts

    t = parts()
    t = t[t.model == "mlp"].pivot_table(index="seed", columns="run", values="final loss")
    change = t[FP4_FULL] / t["bf16"] - 1
    return float(change.mean() if seed is None else change[seed])


def _p09_fp4() -> tuple[str, str]:
    from fp8lab.training.measured_fp4 import means, parts

    gap = _fp4_gap(None)
    option, _ = _binned(gap, FP4_EDGES, FP4_OPTIONS)
    m = means(parts(), "mlp")
    high = m.loc[FP4_FULL, "heldout high precision"] / m.loc["bf16", "heldout high precision"] - 1
    return option, (f"{100 * gap:+.1f}% (mean of 3 seeds; NVFP4 without the parts "
                    f"{100 * (m.loc['nvfp4 1x16', 'final loss'] / m.loc['bf16', 'final loss'] - 1):+.1f}%). The same "
                    f"weights with a high-precision forward: {100 * high:+.1f}% on held-out data.")


PREDICTIONS: dict[str, PredictionSpec] = {
    "per_tensor_flush": PredictionSpec(
        "02_per_tensor_scaling",
        "Outlier channels 1e5 times the rest, E4M3, one scale per tensor: what share of the ordinary values flush to "
        "zero?", FLUSH_OPTIONS, _p02_flush,
        lambda seed: _binned(_flush(seed)["ordinary_underflow"], FLUSH_EDGES, FLUSH_OPTIONS)),
    "best_block": PredictionSpec(
        "04_per_block_scaling",
        "Outlier channels at 1e5: which of these keeps the ordinary channels' SQNR highest?",
        BLOCK_OPTIONS, _p04_block, lambda seed: _winner(_blocks(seed))),
    "sink_gemm": PredictionSpec(
        "05_fp8_gemm",
        "Outlier channels at 1e5 in a, and b's rows for them zero (as sinks meet weights that ignore them): "
        "tensorwise's GEMM error against blockwise's is ...", GEMM_OPTIONS, _p05_gemm,
        lambda seed: _binned(_gemm_ratio(seed), GEMM_EDGES, GEMM_OPTIONS)),
    "sink_break": PredictionSpec(
        "06_training_live",
        "From which sink value on does tensorwise end more than 5% worse than without sinks (150 steps)?",
        ("10", "100", "1e3", "1e4", "1e5", "1e6", "1e7", "never (up to 1e7)"), _p06_break, _break_at),
    "dy_flush": PredictionSpec(
        "09_below_eight_bits",
        "The LLM-like model's attention projection gradient (blocks.0.qkv's dy, first step) with one E4M3 scale per "
        "tensor: what share of its nonzero values flushes to zero?", DY_OPTIONS, _p09_dy,
        lambda seed: _binned(_dy(seed)[1].loc["E4M3 per-tensor", "flushed"], DY_EDGES, DY_OPTIONS)),
    "fp4_gap": PredictionSpec(
        "09_below_eight_bits",
        "The lesson MLP, 150 steps, NVFP4 with all four parts of its training recipe: how far above bf16's does its "
        "final loss end?", FP4_OPTIONS, _p09_fp4,
        lambda seed: _binned(_fp4_gap(seed), FP4_EDGES, FP4_OPTIONS)),
}


class Prediction:
    """Commit to a prediction first, then reveal what the lab measures (PREDICTIONS).

    Reveal stays disabled until an option is picked; once revealed the choice is locked and the
    measured answer, computed from the panels' own data, says whether the prediction was right.
    """

    def __init__(self, name: str) -> None:
        if name not in PREDICTIONS:
            raise ValueError(f"unknown prediction {name!r}; valid: {', '.join(PREDICTIONS)}")
        self.name = name
        self.spec = PREDICTIONS[name]
        self.choice = W.Dropdown(options=[("-- your prediction --", None), *[(o, o) for o in self.spec.options]],
                                 value=None, description="I predict", style={"description_width": "initial"},
                                 layout=W.Layout(width="max-content"))
        self.reveal_button = W.Button(description="Reveal", button_style="warning", icon="eye", disabled=True)
        self.verdict = W.HTML()
        self.choice.observe(lambda change: setattr(self.reveal_button, "disabled", change["new"] is None),
                            names="value")
        self.reveal_button.on_click(lambda _: self.reveal())
        self.widget = W.VBox([W.HTML(f"<b>Predict first.</b> {html.escape(self.spec.question)}"),
                              W.HBox([self.choice, self.reveal_button]), self.verdict])
        self.answer: str | None = None

    def reveal(self) -> bool:
        """Measure, show the answer beside the prediction, lock the choice; True if it was right."""
        if self.choice.value is None:
            raise ValueError(f"pick a prediction first: one of {', '.join(self.spec.options)}")
        self.answer, why = self.spec.measure()
        right = self.choice.value == self.answer
        self.choice.disabled = self.reveal_button.disabled = True
        color = "#009e73" if right else "#d55e00"
        self.verdict.value = (f"<div style='color:{color}'><b>{'Right' if right else 'Not quite'}:</b> you predicted "
                              f"<i>{html.escape(self.choice.value)}</i>; measured: <b>{html.escape(self.answer)}</b>."
                              f"</div><div>{html.escape(why)}</div>")
        return right

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


