"""Predict, then see: the widget that asks for a prediction before a panel reveals the answer.

Public: Prediction(name) (commit to an option, then Reveal shows the measured answer beside it),
PREDICTIONS (each prediction's notebook, question, options and how to measure the answer from
the panels' own data), PredictionSpec, MARGIN, token_spans (which tokens each recipe's scales cover:
notebook 07), fresh_panel (a panel at its defaults, as the answers read it). Notebooks 01 to 07 ask
one each (06 two), notebook 09 three.
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
import torch

from fp8lab.data.synthetic import sample
from fp8lab.figures.plots import magnitude
from fp8lab.lab.panels import PANELS
from fp8lab.lab.panels.base import percent
from fp8lab.lab.panels.blocks import block_table
from fp8lab.numerics.formats import E4M3, E5M2
from fp8lab.numerics.metrics import quantization_report
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.recipes import GEMMS, RECIPES, get_recipe
from fp8lab.training import measured_fp4
from fp8lab.training.fp4_effects import sum_rounding
from fp8lab.training.gradients import dy_choice_table, record_dy
from fp8lab.training.layers import tokens_per_scale
from fp8lab.training.measured import cliff, cliff_means
from fp8lab.training.operands import placement_flush

__all__ = ["MARGIN", "PREDICTIONS", "Prediction", "PredictionSpec", "fresh_panel", "magnitude", "share", "token_spans"]

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


def share(v: float, floor: float = 1e-4) -> str:
    """A share as the answer key prints it: 3 significant digits, or "under 0.01%" below `floor`.
    The digits of a share that small follow the training trajectory, which moves with the machine
    (threads, instruction sets); the claim it supports does not."""
    return f"under {percent(floor)}" if v < floor else percent(v)


def fresh_panel(name: str):
    """A new panel of fp8lab.lab.panels.PANELS at its defaults: the data a prediction's answer is measured on."""
    return PANELS[name]()


# ---- predictions --------------------------------------------------------------------------------------------------


def _binned(value: float, edges: Sequence[float], options: Sequence[str]) -> tuple[str, float]:
    """The option whose bin holds `value` (bins split at the ascending `edges`), and the factor between the
    value and the nearest edge (inf without edges; 0 on an edge)."""
    option = options[sum(value >= e for e in edges)]
    gaps = [max(value / e, e / value) if value > 0 else math.inf for e in edges]
    return option, min(gaps, default=math.inf)


BINADE_EDGES, BINADE_OPTIONS = (12, 25, 100), ("about 8", "about 18", "about 32", "about 256")


def _p01_binades() -> tuple[str, str]:
    n = {f.name: math.log2(f.max_value / f.min_subnormal) for f in (E4M3, E5M2)}
    option, _ = _binned(n["e4m3"], BINADE_EDGES, BINADE_OPTIONS)
    return option, (f"log2(448 / 2^-9) = {n['e4m3']:.1f}: E4M3's 256 codes spread over about 18 binades, 8 values "
                    f"to each, and fewer among the subnormals (E5M2: {n['e5m2']:.1f} binades, 4 values to each).")


def _binades(_: int) -> tuple[str, float]:
    return _binned(math.log2(E4M3.max_value / E4M3.min_subnormal), BINADE_EDGES, BINADE_OPTIONS)


FLUSH_AT, FLUSH_EDGES = 1e5, (0.01, 0.2, 0.8)
FLUSH_OPTIONS = ("under 1%", "1-20%", "20-80%", "over 80%")


def _flush(seed: int) -> dict:
    """The per-tensor panel's report at outliers 1e5 (E4M3), on the panel's tensor drawn with `seed`."""
    x, idx = sample("normal", fresh_panel("per_tensor").shape, FLUSH_AT, seed=seed, return_outliers=True)
    return quantization_report(x, quantize(x, "e4m3"), idx)


def _p02_flush() -> tuple[str, str]:
    r = fresh_panel("per_tensor").update(outliers=FLUSH_AT)["report"]
    option, _ = _binned(r["ordinary_underflow"], FLUSH_EDGES, FLUSH_OPTIONS)
    return option, (f"{percent(r['ordinary_underflow'])} of the ordinary values flush to zero, while the whole-tensor "
                    f"SQNR reads {r['sqnr_db']:.1f} dB: the outliers' energy hides the damage.")


LINGER_EDGES, LINGER_OPTIONS = (0.5, 2.5, 10), ("none", "1 or 2", "3 to 10", "more than 10")


def _lagging(seed: int, spike: float = 20) -> int:
    """Steps after the spike whose SQNR is more than 3 dB below current scaling's: notebook 03's panel at history
    16, algo max, no drift, the stream drawn with `seed`."""
    p = fresh_panel("delayed")
    p.seed = seed
    df = p.update(history=16, algo="max", spike=spike, drift=0.0, margin=0)["df"]
    return int(((df["sqnr delayed"] < df["sqnr current"] - 3) & (df.step > p.steps // 4)).sum())


def _p03_linger() -> tuple[str, str]:
    small, large = _lagging(0), _lagging(0, 1e4)
    option, _ = _binned(small, LINGER_EDGES, LINGER_OPTIONS)
    return option, (f"{small} steps: the spike's amax stays the max of the history for 16 steps, but 20x is 4.3 "
                    "binades, and the ordinary values keep their 3 mantissa bits that far down E4M3's window. A 1e4x "
                    f"spike (13.3 binades) pushes them into subnormals and zero: {large} steps more than 3 dB worse.")


BLOCK_GAIN_EDGES, BLOCK_GAIN_OPTIONS = (1.0, 6.0, 20.0), ("under 1 dB", "1-6 dB", "6-20 dB", "over 20 dB")


def _block_gain(seed: int, outliers: float = 0.0) -> dict[str, float]:
    """SQNR (dB) of the ordinary channels per granularity on notebook 04's tensor drawn with `seed`."""
    return block_table(("per-tensor", "1x128", "1x32"), outliers, seed)["ordinary_sqnr_db"].astype(float).to_dict()


def _gain_at(seed: int) -> tuple[str, float]:
    db = _block_gain(seed)
    return _binned(db["1x32"] - db["per-tensor"], BLOCK_GAIN_EDGES, BLOCK_GAIN_OPTIONS)


def _p04_block() -> tuple[str, str]:
    clean, spiky = _block_gain(0), _block_gain(0, 1e5)
    option, _ = _binned(clean["1x32"] - clean["per-tensor"], BLOCK_GAIN_EDGES, BLOCK_GAIN_OPTIONS)
    return option, (f"1x32 {clean['1x32']:.1f} dB, per-tensor {clean['per-tensor']:.1f} dB: without outliers every "
                    "value keeps E4M3's 3 mantissa bits under either scale (floating point is relative), so 32 times "
                    "as many scales buy nothing. With outlier channels at 1e5 the ordinary channels read: per-tensor "
                    f"{spiky['per-tensor']:.1f} dB, 1x128 {spiky['1x128']:.1f} dB, 1x32 {spiky['1x32']:.1f} dB: the "
                    "blocks pay where an outlier would set the ordinary values' scale.")


GEMM_EDGES, GEMM_OPTIONS = (1.5, 3.0), ("about the same", "1.5-3x larger", "more than 3x larger")


def _gemm_ratio(seed: int) -> float:
    """tensorwise's GEMM error over blockwise's, outliers 1e5 in a, b's rows for them zero: the GEMM panel's
    operands drawn with seeds 1 + seed (a) and 2 + seed (b), as the panel draws seeds 1 and 2."""
    e = fresh_panel("gemm").errors(k=1024, outliers=1e5, distribution="normal", weights="zero rows", seed=seed)
    return e["tensorwise"] / e["blockwise"]


def _p05_gemm() -> tuple[str, str]:
    e = fresh_panel("gemm").update(outliers=1e5, weights="zero rows")["errors"]
    ratio = e["tensorwise"] / e["blockwise"]
    option, _ = _binned(ratio, GEMM_EDGES, GEMM_OPTIONS)
    return option, (f"tensorwise {percent(e['tensorwise'])}, blockwise {percent(e['blockwise'])}: {ratio:.2g}x. The "
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


PLACE_EDGES, PLACE_OPTIONS = (0.01, 0.05, 0.15), ("under 1%", "1-5%", "5-15%", "over 15%")


def _placed(seed: int) -> dict[str, float]:
    """Rowwise's fprop share of fc2's ordinary inputs flushed with the sinks at 1e5x the median, per placement."""
    df = placement_flush(1e5, ("channels", "tokens"), ("rowwise",), seed=seed)
    return df[df.gemm == "fprop"].set_index("placement")["flushed"].to_dict()


def _p06_placement() -> tuple[str, str]:
    f = _placed(0)
    option, _ = _binned(f["tokens"], PLACE_EDGES, PLACE_OPTIONS)
    return option, (f"{percent(f['tokens'])} with the sinks in 2 tokens, against {percent(f['channels'])} with them in "
                    "every token. One scale per token: only the 2 tokens that hold the sinks lose their small values.")


RANKS_OPTIONS = ("none", "tensorwise, delayed, nvfp4", "tensorwise, delayed, nvfp4, rowwise", "all six")


def token_spans() -> dict[str, dict[str, int | None]]:
    """Per recipe, the tokens one scale of each activation or gradient operand covers (None: all of them;
    NVFP4's fp32 tensor scale covers all of them too), per GEMM."""
    out = {}
    for name in RECIPES:
        r = get_recipe(name)
        spans = {}
        for gemm, roles in GEMMS.items():
            for role in roles:
                s = r.scaling(role, gemm)
                if s is not None and role != "weight":
                    spans[f"{gemm} {role}"] = None if s.two_level else tokens_per_scale(role, gemm, s.granularity)
        out[name] = spans
    return out


def _step0() -> list[str]:
    """The recipes whose forward input scale covers every token: their step-0 loss differs across ranks."""
    return [r for r, s in token_spans().items() if s["fprop input"] is None]


def _p07_ranks() -> tuple[str, str]:
    differ = _step0()
    option = next((o for o in RANKS_OPTIONS if sorted(o.split(", ")) == sorted(differ)), "none")
    return option, (f"{', '.join(differ)}: {len(differ)} of 6 recipes. Step 0's loss comes from the forward GEMMs "
                    "alone, and only a forward scale over every token sees the other rank's tokens; rowwise's forward "
                    "scales cover one token each (it differs from step 1 on, through its weight-gradient GEMM), "
                    "blockwise's and mxfp8's blocks never span two ranks.")


DY_AT, DY_EDGES = ("llm_like", "blocks.0.qkv"), (1e-4, 2e-3, 3e-2)
DY_OPTIONS = ("under 0.01%", "0.01-0.2%", "0.2-3%", "over 3%")


def _dy(seed: int):
    """The LLM-like model's attention projection gradient (blocks.0.qkv's dy) at the first step, seed `seed`: what
    GradientPanel shows there (fp8lab.training.gradients.record_dy; the first step needs no training)."""
    model, layer = DY_AT
    dy = record_dy(model, steps=1, at=(0,), seed=seed).snapshots[0, layer]
    return dy, dy_choice_table(dy)


def _p09_dy() -> tuple[str, str]:
    dy, t = _dy(0)
    option, _ = _binned(t.loc["E4M3 per-tensor", "flushed"], DY_EDGES, DY_OPTIONS)
    a = dy.abs()
    span = float(torch.log2(a.max() / a[a > 0].min()))
    return option, (f"E4M3 per tensor flushes about {percent(t.loc['E4M3 per-tensor', 'flushed'])} of it, "
                    "E5M2 per tensor "
                    f"{share(t.loc['E5M2 per-tensor', 'flushed'], 1e-3)}, E4M3 in 1x128 tiles "
                    f"{share(t.loc['E4M3 1x128', 'flushed'], 1e-5)}: the gradient spans about {span:.1f} binades, "
                    "and its tokens differ by most of them.")


FP4_EDGES, FP4_OPTIONS = (0.01, 0.05, 0.15), ("within 1%", "1-5%", "5-15%", "over 15%")
FP4_FULL = "nvfp4 2D+RHT+SR+HP"


def _fp4_gap(seed: int | None) -> float:
    """NVFP4 with every part of its training recipe: final loss against bf16's, the lesson MLP (shipped runs;
    seed None: each seed's change, averaged)."""
    t = measured_fp4.parts()
    t = t[t.model == "mlp"].pivot_table(index="seed", columns="run", values="final loss")
    change = t[FP4_FULL] / t["bf16"] - 1
    return float(change.mean() if seed is None else change[seed])


def _p09_fp4() -> tuple[str, str]:
    gap = _fp4_gap(None)
    option, _ = _binned(gap, FP4_EDGES, FP4_OPTIONS)
    m = measured_fp4.means(measured_fp4.parts(), "mlp")
    high = m.loc[FP4_FULL, "heldout high precision"] / m.loc["bf16", "heldout high precision"] - 1
    return option, (f"{100 * gap:+.1f}% (mean of 3 seeds; NVFP4 without the parts "
                    f"{100 * (m.loc['nvfp4 1x16', 'final loss'] / m.loc['bf16', 'final loss'] - 1):+.1f}%). The same "
                    f"weights with a high-precision forward: {100 * high:+.1f}% on held-out data.")


SUM_EDGES, SUM_OPTIONS = (0.5, 2.0), ("stochastic, by over 2x", "about the same (within 2x)",
                                       "round to nearest, by over 2x")


def _sum_ratio(seed: int) -> tuple[float, float, float]:
    """The LLM-like model's head dy at the first step (seed `seed`), NVFP4 along the tokens: (round to nearest's
    error of the per-class sums over 1024 tokens / one stochastic draw's, the share positive, nearest's error)."""
    dy = record_dy("llm_like", steps=1, at=(0,), seed=seed).snapshots[0, "head"]
    s = sum_rounding(dy.t().contiguous(), [dy.shape[0]])
    return s["sum"]["nearest"][0] / s["sum"]["stochastic"][0], s["positive"], s["sum"]["nearest"][0]


def _p09_sum() -> tuple[str, str]:
    ratio, positive, nearest = _sum_ratio(0)
    option, _ = _binned(ratio, SUM_EDGES, SUM_OPTIONS)
    return option, (f"{percent(positive)} of the head's dy is positive; the per-class sums are off by "
                    f"{percent(nearest)} "
                    f"rounding to nearest, {ratio:.1f} times one stochastic draw's error: per value round to "
                    "nearest is closer, but its errors share a sign and add up.")


PREDICTIONS: dict[str, PredictionSpec] = {
    "format_binades": PredictionSpec(
        "01_fp8_formats",
        "From its smallest positive value to its largest, how many binades (factors of 2) does E4M3 span?",
        BINADE_OPTIONS, _p01_binades, _binades),
    "per_tensor_flush": PredictionSpec(
        "02_per_tensor_scaling",
        "Outlier channels 1e5 times the rest, E4M3, one scale per tensor: what share of the ordinary values flush to "
        "zero?", FLUSH_OPTIONS, _p02_flush,
        lambda seed: _binned(_flush(seed)["ordinary_underflow"], FLUSH_EDGES, FLUSH_OPTIONS)),
    "spike_linger": PredictionSpec(
        "03_delayed_scaling",
        "History 16, algo max: after a one-step spike 20 times the usual amax, for how many steps is the SQNR more "
        "than 3 dB worse than current scaling's?", LINGER_OPTIONS, _p03_linger,
        lambda seed: _binned(_lagging(seed), LINGER_EDGES, LINGER_OPTIONS)),
    "block_gain": PredictionSpec(
        "04_per_block_scaling",
        "Normal data without outliers, E4M3: how many dB of SQNR does one scale per 1x32 block gain over one scale "
        "per tensor?", BLOCK_GAIN_OPTIONS, _p04_block, _gain_at),
    "sink_gemm": PredictionSpec(
        "05_fp8_gemm",
        "Outlier channels at 1e5 in a, and b's rows for them zero (as sinks meet weights that ignore them): "
        "tensorwise's GEMM error against blockwise's is ...", GEMM_OPTIONS, _p05_gemm,
        lambda seed: _binned(_gemm_ratio(seed), GEMM_EDGES, GEMM_OPTIONS)),
    "sink_break": PredictionSpec(
        "06_training_live",
        "From which sink value on does tensorwise end more than 5% worse than without sinks (150 steps)?",
        ("10", "100", "1e3", "1e4", "1e5", "1e6", "1e7", "never (up to 1e7)"), _p06_break, _break_at),
    "placement_flush": PredictionSpec(
        "06_training_live",
        "The sinks at 100,000x the median sit in 4 channels of the first 2 tokens only, as massive activations do. "
        "What share of fc2's ordinary inputs does rowwise's forward GEMM (one scale per token) flush to zero?",
        PLACE_OPTIONS, _p06_placement, lambda seed: _binned(_placed(seed)["tokens"], PLACE_EDGES, PLACE_OPTIONS)),
    "step0_ranks": PredictionSpec(
        "07_beyond_one_machine",
        "Two processes, each with half of the batch, no amax all-reduce: which recipes' loss at step 0 differs from "
        "one process's?", RANKS_OPTIONS, _p07_ranks,
        lambda seed: (next(o for o in RANKS_OPTIONS if sorted(o.split(", ")) == sorted(_step0())), math.inf)),


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
    "sum_bias": PredictionSpec(
        "09_below_eight_bits",
        "The LLM-like model's head gradient (most of its dy positive) in NVFP4, summed over 1024 tokens per class: "
        "which rounding leaves the sums further from the exact ones, round to nearest or one stochastic draw?",
        SUM_OPTIONS, _p09_sum, lambda seed: _binned(_sum_ratio(seed)[0], SUM_EDGES, SUM_OPTIONS)),
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


