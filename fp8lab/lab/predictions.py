"""Predict, then see: the widget that asks for a prediction before a panel reveals the answer.

Public: Prediction(name) (commit to an option, then Reveal shows the measured answer beside it),
PREDICTIONS (each prediction's notebook, question, options and how to measure the answer from
the panels' own data), PredictionSpec. Notebooks 02, 04, 05 and 06 ask one each.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass

import ipywidgets as W

from fp8lab.training.measured import cliff_means, first_break

__all__ = ["PREDICTIONS", "Prediction", "PredictionSpec", "magnitude", "share"]


@dataclass(frozen=True)
class PredictionSpec:
    """A prediction asked before a panel reveals it: measure() -> (the right option, why)."""

    notebook: str
    question: str
    options: tuple[str, ...]
    measure: Callable[[], tuple[str, str]]


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


def _p02_flush() -> tuple[str, str]:
    r = _panel("per_tensor").update(outliers=1e5)["report"]
    share = r["ordinary_underflow"]
    option = "under 1%" if share < 0.01 else "1-10%" if share < 0.1 else "10-50%" if share < 0.5 else "over 50%"
    return option, (f"{_pct(share)} of the ordinary values flush to zero, while the whole-tensor SQNR reads "
                    f"{r['sqnr_db']:.1f} dB: the outliers' energy hides the damage.")


def _p04_block() -> tuple[str, str]:
    p = _panel("block")
    options = ("per-tensor", "per-row", "128x128", "1x128", "1x32")
    sq = {b: p.update(block=b, outliers=1e5)["report"]["ordinary_sqnr_db"] for b in options}
    best = max(sq, key=sq.get)
    return best, "SQNR of the ordinary channels: " + ", ".join(f"{b} {v:.1f} dB" for b, v in sq.items()) + "."


def _p05_gemm() -> tuple[str, str]:
    e = _panel("gemm").update(outliers=1e5, weights="zero rows")["errors"]
    ratio = e["tensorwise"] / e["blockwise"]
    option = "about the same" if ratio < 1.5 else "1.5-3x larger" if ratio < 3 else "more than 3x larger"
    return option, (f"tensorwise {_pct(e['tensorwise'])}, blockwise {_pct(e['blockwise'])}: {ratio:.2g}x. The "
                    "output is made of the ordinary channels only, and per tensor they flush.")


def _p06_break() -> tuple[str, str]:
    change = cliff_means()[2]
    at = first_break(change, "tensorwise")
    option = "never (up to 1e7)" if at is None else magnitude(at)
    tw = change.xs("tensorwise", level="run")
    return option, ("tensorwise's final loss against its own no-sink run (3 seeds): " +
                    ", ".join(f"{magnitude(m)}: {100 * v:+.0f}%" for m, v in tw.items() if m > 0) + ".")


PREDICTIONS: dict[str, PredictionSpec] = {
    "per_tensor_flush": PredictionSpec(
        "02_per_tensor_scaling",
        "Outlier channels 1e5 times the rest, E4M3, one scale per tensor: what share of the ordinary values flush to "
        "zero?", ("under 1%", "1-10%", "10-50%", "over 50%"), _p02_flush),
    "best_block": PredictionSpec(
        "04_per_block_scaling",
        "Outlier channels at 1e5: which of these keeps the ordinary channels' SQNR highest?",
        ("per-tensor", "per-row", "128x128", "1x128", "1x32"), _p04_block),
    "sink_gemm": PredictionSpec(
        "05_fp8_gemm",
        "Outlier channels at 1e5 in a, and b's rows for them zero (as sinks meet weights that ignore them): "
        "tensorwise's GEMM error against blockwise's is ...", ("about the same", "1.5-3x larger",
                                                              "more than 3x larger"), _p05_gemm),
    "sink_break": PredictionSpec(
        "06_training_live",
        "From which sink value on does tensorwise end more than 5% worse than without sinks (150 steps)?",
        ("10", "100", "1e3", "1e4", "1e5", "1e6", "1e7", "never (up to 1e7)"), _p06_break),
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


