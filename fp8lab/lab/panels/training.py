"""Notebook 06's panels: recipes trained live side by side (TrainingPanel), the sink cliff (TrainingCliffPanel).

Public: TrainingCliffPanel, TrainingPanel. Wiring only: the numbers come from fp8lab's functions.
"""


from __future__ import annotations

import html
import math
import threading

import ipywidgets as W
import pandas as pd

from fp8lab.figures import plots
from fp8lab.lab.panels.base import (
    Panel,
    dropdown,
    metrics_html,
    outlier_options,
    selection_slider,
)
from fp8lab.numerics.recipes import RECIPES
from fp8lab.settings import size
from fp8lab.training.measured import PUBLISHED_ON, PUBLISHED_RATIO, TOKEN_SEEDS, cliff_rows, measured_on, published_runs
from fp8lab.training.published import lesson_median, marker_sinks, sinks_for
from fp8lab.training.train import HISTORIES, LESSON, delayed_recipes, train

__all__ = ["TrainingCliffPanel", "TrainingPanel"]

# where the sinks sit (fp8lab.training.models.PLACEMENTS), as a control names them
PLACEMENT_OPTIONS = (("every token's 4 channels", "channels"), ("the first 2 tokens' 4 channels", "tokens"),
                     ("both", "both"))


class TrainingPanel(Panel):
    """Recipes trained side by side, live: Start runs in a background thread, Stop ends it.

    The delayed recipe takes the amax history length and margin set here; "input drop"
    shrinks fc1's input 1e5-fold at LESSON.gain_drop_step (the mlp). Controls that only a new
    run can apply (recipes, model, sinks, steps, history, margin, input drop) are listed over
    the plot, against the run it shows, until Start trains with them."""
    title = "live training: recipes side by side"
    live_sliders = False  # its controls set up the next run; Start trains
    ncols, width, height, right = 2, 4.6, 3.3, 1.5
    RUN_CONTROLS = ("recipes", "model", "sinks", "placement", "steps", "history", "margin", "input_drop")

    def __init__(self, model: str = "mlp") -> None:
        self.start = W.Button(description="Start", button_style="success", icon="play")
        self.stop = W.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.progress = W.IntProgress(value=0, min=0, max=1, description="steps")
        super().__init__(
            recipes=W.SelectMultiple(options=["fp32", "bf16", *RECIPES], value=["fp32", "tensorwise", "blockwise",
                                                                                "mxfp8"],
                                     description="recipes", rows=8),
            model=dropdown(("mlp", "transformer"), model, "model"),
            sinks=selection_slider(outlier_options(), 0.0, "sinks (outlier knob)"),
            placement=dropdown(PLACEMENT_OPTIONS, "channels", "sinks in"),
            steps=W.IntSlider(value=size(LESSON.steps, 20), min=10, max=400, step=10, description="steps"),
            history=selection_slider([*HISTORIES, 1024], 16, "delayed: amax history"),
            margin=W.IntSlider(value=0, min=0, max=4, description="delayed: margin"),
            input_drop=W.Checkbox(value=False, description=f"input drops 1e5x at step {LESSON.gain_drop_step} (mlp)"),
            metric=dropdown(("underflow", "overflow", "amax"), "underflow", "monitor"),
            layer_input=dropdown(("input", "weight", "grad_output"), "input", "monitored tensor"),
        )
        self.start.on_click(lambda _: self.run(blocking=False))
        self.stop.on_click(lambda _: self._stop_event.set())
        if self.sync:  # training runs in the kernel's thread: the notebook's interrupt button stops it
            self.stop.tooltip = "in this front end, stop a run with the notebook's interrupt (stop) button"
        self.widget.children = (self.widget.children[0], *self.widget.children[1:5],
                                W.HBox([self.start, self.stop, self.progress]), *self.widget.children[5:])
        self._stop_event = threading.Event()
        self.result = None
        self.settings: dict | None = None  # the run controls the result was trained with
        self.messages: list[str] = []

    @staticmethod
    def _label(value, name: str) -> str:
        if name == "recipes":
            return ", ".join(value)
        if name == "sinks":
            return plots.magnitude(value)
        if name == "input_drop":
            return "on" if value else "off"
        return str(value)

    def recipes_to_run(self, v: dict | None = None) -> list:
        """The runs Start trains: the chosen recipes, the delayed one with this history and margin."""
        v = v or self.values()
        return [delayed_recipes([v["history"]], margin=v["margin"])[0] if r == "delayed" else r for r in v["recipes"]]

    def compute(self, recipes, model, sinks, placement, steps, history, margin, input_drop, metric,
                layer_input) -> dict:
        if not recipes:
            raise ValueError(f"pick at least one recipe; valid: fp32, bf16, {', '.join(RECIPES)}")
        if input_drop and model != "mlp":
            raise ValueError("the input drop acts on the mlp's first layer: pick model 'mlp'")
        values = {"recipes": tuple(recipes), "model": model, "sinks": sinks, "placement": placement, "steps": steps,
                  "history": history, "margin": margin, "input_drop": input_drop}
        empty = pd.DataFrame(columns=["step", "run", "loss"])
        hist = self.result.history if self.result is not None else empty
        mon = self.result.monitor if self.result is not None else None
        # the runs the recipes control selects (the delayed run is labelled with its history)
        runs = [r for r in hist["run"].unique() if r.split()[0] in recipes] if len(hist) else []
        hist = hist[hist["run"].isin(runs)] if len(hist) else hist
        if mon is not None and len(mon):
            mon = mon[mon["run"].isin(runs)]
        # run settings the plot does not show: all of them before the first run, then what changed
        pending = {k: self._label(v, k) for k, v in values.items()
                   if self.settings is None or v != self.settings.get(k)}
        return {"history": hist, "monitor": mon, "metric": metric, "role": layer_input, "pending": pending,
                "first": self.settings is None}

    def draw(self, data, axes) -> None:
        colors = plots.run_colors(data["history"]["run"])  # one colour per run in both plots
        plots.loss_curves(data["history"], axes[0], colors=colors, legend=False)
        plots.monitor_lines(data["monitor"], data["metric"], axes[1], role=data["role"],
                            gemm="dgrad" if data["role"] == "grad_output" else "fprop", colors=colors, legend=False)
        mon = data["monitor"]
        plots.runs_legend(axes[1], colors, list(dict.fromkeys(mon["layer"])) if mon is not None and len(mon) else ())
        if data["pending"]:  # settings the plot does not show yet, named, until Start applies them
            head = "Press Start to train with:" if data["first"] else "Changed since this run (press Start):"
            note = "\n".join([head, *(f"{k.replace('_', ' ')}: {v}" for k, v in data["pending"].items())])
            axes[0].text(0.03, 0.96, note, transform=axes[0].transAxes, fontsize=8, color=plots.CLIP, va="top",
                         bbox={"facecolor": "white", "alpha": 0.9, "edgecolor": plots.CLIP, "lw": 0.5})

    def describe(self, data) -> str:
        rows = {}
        if self.result is not None and len(self.result.history):
            for run, v in self.result.final_loss().items():
                rows[f"final loss {run}"] = f"{v:.4g}" if math.isfinite(v) else "stopped (NaN/inf)"
            rows["seconds"] = f"{self.result.seconds:.1f}"
        if self.result is not None:  # which GEMMs ran real or emulated, and why
            rows.update(dict.fromkeys(self.result.backend_lines(), ""))
        for m in self.messages:
            rows[m] = ""
        return metrics_html(rows) if rows else "Press Start to train."

    def run(self, blocking: bool = True):
        """Train with the current controls; blocking=False runs in a background thread so that
        the kernel keeps answering widget messages (Stop, the plots) while it trains."""
        if self._thread is not None and self._thread.is_alive():
            return None

        v = self.values()
        if not v["recipes"] or (v["input_drop"] and v["model"] != "mlp"):
            self.refresh()  # the panel explains what is missing
            return None
        runs = self.recipes_to_run(v)
        self._stop_event.clear()
        self.messages = []
        self.progress.max, self.progress.value = v["steps"], 0
        self.start.disabled, self.stop.disabled = True, False

        def callback(result, step):
            self.result = result
            self.progress.value = step + 1
            self.refresh()

        def work():
            try:
                self.settings = {k: (tuple(v[k]) if k == "recipes" else v[k]) for k in self.RUN_CONTROLS}
                self.result = train(runs, model=v["model"], steps=v["steps"], sink_magnitude=v["sinks"],
                                    placement=v["placement"],
                                    gain_schedule=LESSON.gain_schedule if v["input_drop"] else None,
                                    callback=callback, every=max(v["steps"] // 20, 2), monitor_every=2,
                                    progress=False, should_stop=self._stop_event.is_set)
                self.messages = self.result.messages
            except Exception as err:  # shown in the panel; the kernel survives
                self.messages = [f"training failed: {type(err).__name__}: {err}"]
            finally:
                self.start.disabled, self.stop.disabled = False, True
                self.progress.value = self.progress.max if self.result is None else int(
                    self.result.history["step"].max() + 1 if len(self.result.history) else 0)
                self.refresh()

        thread = self._launch(work, blocking)
        return self.result if blocking else thread


class TrainingCliffPanel(Panel):
    """Final loss against sink magnitude per recipe, from fp8lab.training.measured (measured by `python -m fp8lab
    measured --write`), with the sinks in every token's channels (3 seeds) or in the first 2 tokens' channels
    (TOKEN_SEEDS seeds), each with the published ratios measured at that placement; one point recomputed live."""
    title = "the sink cliff: final loss vs sink magnitude (shipped runs), one point live"
    width, height = 7.0, 3.6
    keep_axes = True  # a drag moves the marked point: the axes and their ticks stay

    def __init__(self) -> None:
        self.tables = {placement: cliff_rows(placement) for _, placement in PLACEMENT_OPTIONS}  # the shipped runs
        self.table = self.tables["channels"]
        self._mark = None  # the marked point's line (draw); _drawn: what else its drawing shows
        # the shipped tables do not change: their means over seeds and seed 0's runs, once per placement
        self.means, self.seed0s = {}, {}
        for placement, table in self.tables.items():
            shipped = table if len(table) else pd.DataFrame(columns=["run", "sinks", "seed", "loss"])
            self.means[placement] = shipped.groupby(["run", "sinks"], sort=False)["loss"].mean().reset_index()
            self.seed0s[placement] = shipped[shipped.seed == 0].set_index(["run", "sinks"])["loss"]
        self.publisheds = {p: self._published(p) for p in self.tables}
        runs = list(dict.fromkeys(self.table["run"])) or ["fp32", *RECIPES]
        sinks = sorted({s for table in self.tables.values() for s in table["sinks"]}) or [0.0, 1e6]
        self.recompute_button = W.Button(description="Recompute this point", button_style="info", icon="refresh")
        super().__init__(
            placement=dropdown(PLACEMENT_OPTIONS, "channels", "sinks in"),
            recipes=W.SelectMultiple(options=runs, value=runs, description="recipes", rows=7),
            measure=dropdown([("change vs its own no-sink run", "relative"), ("final loss", "loss")], "relative",
                            "plot"),
            sinks=selection_slider([(plots.magnitude(v), v) for v in sinks], 1e6 if 1e6 in sinks else sinks[-1],
                          "point to recompute"),
        )
        self.recompute_button.on_click(lambda _: self.recompute(blocking=False))
        self.widget.children = (*self.widget.children[:-2], W.HBox([self.recompute_button]),
                                *self.widget.children[-2:])
        self.live = pd.DataFrame(columns=["placement", "run", "sinks", "loss"])

    def _published(self, placement: str) -> pd.DataFrame:
        """The diamonds: each run's mean over seeds at the massive-activation ratio's sinks (sinks_for(1e5)) against
        its own no-sink mean; with the sinks in every token from published_runs(), in 2 tokens from the cliff."""
        pub = published_runs() if placement == "channels" else self.tables[placement]
        at = sinks_for(PUBLISHED_RATIO)
        pub = pub[pub.sinks.isin((0.0, at))]
        if not len(pub):
            return pd.DataFrame(columns=["run", "sinks", "loss", "change"])
        mean = pub.groupby(["run", "sinks"], sort=False)["loss"].mean().reset_index()
        clean = mean[mean.sinks == 0].set_index("run")["loss"]
        mean = mean[mean.sinks > 0]
        mean["change"] = mean["loss"] / mean["run"].map(clean).to_numpy() - 1
        return mean.reset_index(drop=True)

    def compute(self, placement, recipes, measure, sinks) -> dict:
        if not recipes:
            raise ValueError("pick at least one recipe")
        if self.tables[placement].empty:
            raise ValueError(f"fp8lab.training.measured holds no runs with the sinks in {placement}: run "
                             "`python -m fp8lab measured --write --part "
                             f"{'cliff' if placement == 'channels' else placement}`")
        mean, seed0 = self.means[placement], self.seed0s[placement]
        seeds = 3 if placement == "channels" else TOKEN_SEEDS
        df = mean[mean.run.isin(recipes)]
        live = self.live[self.live.run.isin(recipes) & (self.live.placement == placement)]
        at = df[df.sinks == sinks].set_index("run")["loss"]
        clean = df[df.sinks == 0].set_index("run")["loss"]
        point = {r: {"mean": at[r], "seed 0": seed0.get((r, sinks), math.nan),
                     "change vs no sinks": at[r] / clean[r] - 1} for r in at.index}
        for row in live[live.sinks == sinks].itertuples():
            point.setdefault(row.run, {})["recomputed now (seed 0)"] = row.loss
        pub = self.publisheds[placement]
        pub = pub[pub.run.isin(recipes)]
        return {"df": df, "live": live[["run", "sinks", "loss"]], "relative": measure == "relative", "sinks": sinks,
                "point": point, "markers": marker_sinks(placement), "published": pub, "placement": placement,
                "seeds": seeds}

    def draw(self, data, ax) -> None:
        plots.sink_cliff(data["df"], ax, relative=data["relative"], mark=data["sinks"], live=data["live"],
                         markers=data["markers"], extra=data["published"])
        self._mark = next((line for line in ax.lines if line.get_gid() == "mark"), None)
        self._drawn = self._drawing(data)

    @staticmethod
    def _drawing(data) -> tuple:
        """What the drawing shows besides the marked value: the recipes' rows, the measure, the live points, the
        placement."""
        return (tuple(data["df"]["run"].unique()), data["relative"], len(data["live"]), data["placement"])

    def draw_in_place(self, data) -> bool:
        """A drag of the point to recompute moves only its dotted line: moved, the rest kept."""
        if self._mark is None or self._drawn != self._drawing(data):
            return False
        x = data["sinks"] if data["sinks"] > 0 else 1.0
        self._mark.set_xdata([x, x])
        return True

    def describe(self, data) -> str:
        rows = {}
        for run, p in data["point"].items():
            txt = (f"{p['mean']:.4f} ({100 * p['change vs no sinks']:+.0f}%); seed 0: {p['seed 0']:.4f}"
                   if "mean" in p else "not shipped at this value")
            if "recomputed now (seed 0)" in p:
                txt += f"; recomputed now: {p['recomputed now (seed 0)']:.4f}"
            rows[run] = txt
        where = plots.magnitude(data["sinks"])
        placed = {v: k for k, v in PLACEMENT_OPTIONS}[data["placement"]]
        text = (f"<p><b>final loss at sinks {where}, in {placed}</b> (mean of {data['seeds']} seeds, and its change "
                f"against the run's own no-sink loss)</p>" + metrics_html(rows) +
                f"<p style='font-size:11px'>measured on {html.escape(measured_on(data['placement']))}</p>")
        pub = data["published"]
        if len(pub):
            s = float(pub["sinks"].iloc[0])
            head = {"tokens": "at the massive-activation ratio, where massive activations sit",
                    "channels": "at the massive-activation ratio, placed in every token (where massive activations do "
                                "not sit)",
                    "both": "at the massive-activation ratio, in every token's channels and the first tokens' "
                            "others"}[data["placement"]]
            on = PUBLISHED_ON if data["placement"] == "channels" else measured_on(data["placement"])
            text += (f"<p><b>{head}</b> (sinks {s:g}: 100,000 x the median ordinary input of fc2, "
                     f"{lesson_median():.3g}; diamonds): " +
                     ", ".join(f"{r.run} {100 * r.change:+.1f}%" for r in pub.itertuples()) +
                     f" (mean of {data['seeds']} seeds)</p><p style='font-size:11px'>measured on {html.escape(on)}</p>")
        return text

    def recompute(self, blocking: bool = True):
        """Train seed 0 at the chosen sink magnitude and placement (150 steps, the chosen recipes) and draw
        the final losses over the shipped curve."""
        if self._thread is not None and self._thread.is_alive():
            return None

        v = self.values()

        def work():
            self.recompute_button.disabled = True
            try:
                res = train(tuple(v["recipes"]), steps=LESSON.steps, sink_magnitude=v["sinks"],
                            placement=v["placement"], progress=False, monitor_every=None)
                rows = [{"placement": v["placement"], "run": r, "sinks": v["sinks"], "loss": loss}
                        for r, loss in res.final_loss().items()]
                old = self.live[~((self.live.sinks == v["sinks"]) & self.live.run.isin(v["recipes"])
                                  & (self.live.placement == v["placement"]))]
                self.live = pd.concat([old, pd.DataFrame(rows)], ignore_index=True) if len(old) else pd.DataFrame(rows)
            finally:
                self.recompute_button.disabled = False
                self.refresh()

        thread = self._launch(work, blocking)
        return self.live if blocking else thread
