"""ipywidgets panels: controls wired to fp8lab's functions and plots. No maths here.

Public: one Panel per notebook figure (TimingPanel, BitsPanel, NumberLinePanel,
PerTensorPanel, CliffPanel, DelayedPanel, BlockPanel, BlockSweepPanel, GemmPanel,
AccumulationPanel, TrainingPanel, TrainingCliffPanel, DistributedPanel, ExportPanel, CostPanel),
PANELS, LIVE_PANELS (the prediction widget is fp8lab.answers.Prediction: its answers drive these).
A panel exposes `controls` (name -> widget), `update(**values)` (set controls, recompute,
redraw; returns the data it plotted, so tests can drive it without a browser) and
`widget` (what the notebook shows). Plots are PNGs in an ipywidgets.Image, rendered
without pyplot at 2x device pixels, so a background thread (notebook 06's live training)
can redraw them and high-DPI screens show them sharp.

Live panels (`Panel.live_sliders`) redraw while a slider is dragged (continuous_update); the
expensive ones (timing, training, distributed) redraw on release and time or train on a
button. The figures are drawn on fp8lab.render.LayeredCanvas (the axes' ticks and labels kept
while they do not change); panels with `keep_artists` move the last drawing's artists.
A change from the browser never redraws in the kernel's message handler: it marks the
panel stale and one drawing thread per panel redraws with the controls' newest values
until nothing is stale (`Panel.request_redraw`), so values that arrive during a redraw
replace each other and only the latest is drawn. The benchmark is `fp8lab.bench.bench_widgets`.
"""

from __future__ import annotations

import html
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar

import ipywidgets as W
import pandas as pd
import torch
from matplotlib.transforms import Bbox

from fp8lab import plots
from fp8lab.anatomy import anatomy, rounding
from fp8lab.data import DISTRIBUTIONS, activation_stream, sample
from fp8lab.formats import FORMATS, get_format
from fp8lab.gemm import AccumulatorModel, accumulation_errors, matmul, quantize_operands, resolve_backend
from fp8lab.metrics import (
    channel_sqnr,
    flushed_fraction,
    overflow_fraction,
    quantization_report,
    row_overflow,
    row_sqnr,
    sqnr,
)
from fp8lab.quantize import quantize
from fp8lab.recipes import RECIPES
from fp8lab.render import LayeredCanvas
from fp8lab.scaling import SCALE_RULES, AmaxHistory, PerRow, PerTensor, parse_granularity
from fp8lab.settings import size, smoke
from fp8lab.timing import timed

__all__ = [
    "LIVE_PANELS",
    "PANELS",
    "AccumulationPanel",
    "BitsPanel",
    "BlockPanel",
    "BlockSweepPanel",
    "CliffPanel",
    "CostPanel",
    "DelayedPanel",
    "DistributedPanel",
    "ExportPanel",
    "GemmPanel",
    "NumberLinePanel",
    "Panel",
    "PerTensorPanel",
    "TimingPanel",
    "TrainingCliffPanel",
    "TrainingPanel",
    "sweep_values",
]

OUTLIERS = (0.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7)
BLOCKS = ("1x16", "1x32", "1x64", "1x128", "32x32", "128x128", "per-row", "per-tensor")
ELEMENT_FORMATS = ("e4m3", "e5m2", "e2m1")
RULES = SCALE_RULES  # the scale rules a panel offers: all of them
# how a block's scale is stored and rounded: (rule, scale format, two-level). E8M0 holds only
# powers of two (rceil or floor); E4M3 scales sit under an fp32 tensor scale (NVFP4)
SCALES = {
    "fp32, exact": ("exact", None, False),
    "fp32, power of two (rceil)": ("rceil", None, False),
    "E8M0, rceil (MX as cuBLAS/TE)": ("rceil", "e8m0", False),
    "E8M0, floor (OCP MX)": ("floor", "e8m0", False),
    "E4M3 under an fp32 tensor scale (NVFP4)": ("exact", "e4m3", True),
}
SLIDERS = (W.SelectionSlider, W.SelectionRangeSlider, W.IntSlider, W.FloatSlider, W.FloatLogSlider, W.IntRangeSlider,
           W.FloatRangeSlider)
CSS_DPI = 72  # the panels' size on the page: a figure of w inches is w * 72 CSS pixels wide
# the recipes whose activation scaling the outlier cliff compares (delayed: tensorwise's, one step late)
CLIFF_RECIPES = ("tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4")


TORCH_THREADS = torch.get_num_threads()  # the process's default, as the kernel started


@contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """torch (and fp8lab's kernels, on torch's OpenMP) with `n` threads in this thread only, then
    as before; None: unchanged. A redraw's tensors are small (~1e5 elements): on 2 shared cores,
    with the browser drawing the last frame, a 2-thread region waits for a core that is busy
    (measured 2026-11-30: block 573 ms with 2 threads, 8 ms with 1; see the README)."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _metrics_html(rows: dict[str, str]) -> str:
    cells = "".join(f"<tr><td style='padding-right:12px'>{html.escape(k)}</td><td><b>{html.escape(v)}</b></td></tr>"
                    for k, v in rows.items())
    return f"<table style='font-size:13px'>{cells}</table>"


def _pct(v: float) -> str:
    return f"{100 * v:.3g}%"


class Panel:
    """Controls, a figure and a text area; `update(**values)` recomputes and redraws.

    live_sliders=True: sliders send their value while dragged (continuous_update) and the plot follows;
    live_sliders=False (panels whose redraw runs GEMMs, or whose controls set up a run that a button
    starts): sliders send their value on release."""

    title = ""
    live_sliders: ClassVar[bool] = True
    # keep_artists=True: draw() updates the artists of the last drawing (it must set everything it
    # shows); the axes are not cleared between redraws (creating axes, colorbars and ticks is most
    # of a redraw's drawing time)
    keep_artists: ClassVar[bool] = False
    redraw_threads: int | None = 1  # torch threads for a redraw (None: the process's)
    width, height, ncols = 6.0, 3.2, 1
    right = 0.6  # inches right of the last plot (a legend beside it needs more)
    bottom = 0.55  # inches below the plots (rotated tick labels need more)

    def __init__(self, **controls: W.Widget) -> None:
        self.controls: dict[str, W.Widget] = controls
        self.image = W.Image(format="png", layout=W.Layout(max_width="100%"))
        self.text = W.HTML()
        self.data: dict = {}
        self._busy = False
        self._figure = None  # (figure, axes), reused: creating axes costs more than clearing them
        self._lock = threading.RLock()  # a background thread (live training) may redraw too
        self._thread: threading.Thread | None = None
        # coalescing (request_redraw): `_stale` says a change arrived that no redraw has shown;
        # `_drawer` is the one thread that redraws while anything is stale
        self._slot = threading.Lock()
        self._stale = False
        self._drawer: threading.Thread | None = None
        self.redraws = 0  # redraws made for browser changes (request_redraw), for tests
        self.drawn_values: dict | None = None
        for ctl in controls.values():
            if hasattr(ctl, "value"):
                ctl.observe(self._on_change, names="value")
            if isinstance(ctl, SLIDERS):
                ctl.continuous_update = self.live_sliders
            ctl.style.description_width = "initial"
        boxes = [W.HBox(list(controls.values())[i : i + 3]) for i in range(0, len(controls), 3)]
        self.widget = W.VBox([W.HTML(f"<b>{html.escape(self.title)}</b>"), *boxes, self.image, self.text])

    # -- the public surface ----------------------------------------------------------------
    def values(self) -> dict:
        return {k: c.value for k, c in self.controls.items() if hasattr(c, "value")}

    def update(self, **values) -> dict:
        """Set these controls (names as in `controls`), recompute, redraw; return the data."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(
                f"{type(self).__name__} has no control {sorted(unknown)}; controls: {sorted(self.controls)}"
            )
        self._busy = True
        try:
            for k, v in values.items():
                self.controls[k].value = v
        finally:
            self._busy = False
        return self.refresh()

    def _axes(self):
        if self._figure is None:
            # drawn at 2x the theme's 72 dpi; the page shows it at the figure's size at 72 dpi
            fig, axes = plots.figure(self.ncols, 1, self.width, self.height, pyplot=False, right=self.right,
                                     bottom=self.bottom, dpi=CSS_DPI * plots.PIXEL_RATIO)
            own = axes if isinstance(axes, list) else [axes]
            LayeredCanvas(fig)  # the background (axes, ticks, labels) kept while a slider moves
            self._figure = (fig, axes, [ax.get_position() for ax in own])
            self.image.width = str(round(fig.get_figwidth() * CSS_DPI))
        fig, axes, boxes = self._figure
        if self.keep_artists:
            return fig, axes
        own = axes if isinstance(axes, list) else [axes]
        for ax in list(fig.axes):
            if not any(ax is a for a in own):
                fig.delaxes(ax)  # colorbars and twin axes of the last drawing
        for ax, box in zip(own, boxes, strict=True):
            ax.clear()
            # clear() leaves the old data limits to be ignored, but a span (axvspan: x in data, y in
            # axes units) updates x only and keeps the old y: the last drawing's range leaked into this one
            ax.dataLim.set_points(Bbox.null().get_points())
            ax.set_position(box)  # a colorbar had taken part of it
        return fig, axes

    def refresh(self) -> dict:
        with self._lock, _torch_threads(self.redraw_threads):
            return self._refresh()

    def _refresh(self) -> dict:
        values = self.values()
        self.drawn_values = values  # what the plot and text show (checked against the controls after a drag)
        try:
            self.data = self.compute(**values)
            fig, axes = self._axes()
            self.draw(self.data, axes)
            self.image.value = plots.to_png(fig, keep=True)
            self.text.value = self.describe(self.data)
        except ValueError as err:  # bad combinations are explained, never raised into the notebook
            self.data = {"error": str(err)}
            self.text.value = f"<span style='color:#d55e00'><b>Not possible:</b> {html.escape(str(err))}</span>"
        return self.data

    def _launch(self, work: Callable[[], None], blocking: bool):
        """Run `work` now (blocking), or in a background thread so that the kernel keeps
        answering widget messages (Stop, redraws) meanwhile; one run at a time."""
        if self._thread is not None and self._thread.is_alive():
            return None
        if blocking:
            work()
            return None

        def in_thread() -> None:
            torch.set_num_threads(TORCH_THREADS)  # the process's threads, whatever a redraw had set meanwhile
            work()

        self._thread = threading.Thread(target=in_thread, daemon=True)
        self._thread.start()
        return self._thread

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if not self.data:
            self.refresh()
        display(self.widget)

    # -- what subclasses fill in ------------------------------------------------------------
    def compute(self, **values) -> dict:
        raise NotImplementedError

    def draw(self, data: dict, axes) -> None:
        raise NotImplementedError

    def describe(self, data: dict) -> str:
        return ""

    def _on_change(self, change) -> None:
        if not self._busy:
            self.request_redraw()

    # -- coalescing: the kernel never queues stale redraws ---------------------------------
    def request_redraw(self) -> None:
        """Redraw with the controls' newest values, soon, without blocking the caller.

        The kernel handles widget messages one at a time: a redraw run inside the handler
        would make every value of a drag wait its turn and be drawn, stale, in order. Here the
        handler only marks the panel stale; one drawing thread redraws, and after each redraw
        draws again if anything changed meanwhile, reading the controls then. However many
        values arrive during a redraw, one more redraw follows, with the last of them."""
        with self._slot:
            self._stale = True
            if self._drawer is not None:
                return  # the drawing thread sees `_stale` when its redraw ends
            self._drawer = threading.Thread(target=self._draw_while_stale, name=f"{type(self).__name__} redraw",
                                            daemon=True)
            self._drawer.start()

    def _draw_while_stale(self) -> None:
        try:
            while True:
                with self._slot:
                    if not self._stale:
                        self._drawer = None
                        return
                    self._stale = False
                self.redraws += 1
                self.refresh()
        except BaseException as err:  # shown in the panel, and raised to the thread's hook (the kernel logs it)
            with self._slot:
                self._drawer = None
            self.text.value = f"<span style='color:#d55e00'><b>Redraw failed:</b> {html.escape(repr(err))}</span>"
            raise

    def wait_redrawn(self, timeout: float = 30.0) -> bool:
        """Wait until the redraws that request_redraw started have finished; False on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            with self._slot:
                drawer = self._drawer
            if drawer is None:
                return True
            drawer.join(max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline and drawer.is_alive():
                return False


def _select(options, value, description: str) -> W.Dropdown:
    return W.Dropdown(options=list(options), value=value, description=description)


def _slider(options, value, description: str) -> W.SelectionSlider:
    return W.SelectionSlider(options=list(options), value=value, description=description)


def _outlier_options():
    return [(("none" if v == 0 else f"{plots.magnitude(v)}x"), v) for v in OUTLIERS]


# ---- 00 setup check ---------------------------------------------------------------------------


class TimingPanel(Panel):
    """fp32 and bf16 matmul beside the FP8 GEMM of a recipe, real or emulated, on this machine.

    Timing is a measurement, not a redraw: the controls set up the next one and the Time button
    runs it (with every thread torch uses; the first runs when the panel first draws). Until then
    the plot keeps the last timing and names what changed."""

    title = "GEMM timing on this machine"
    live_sliders = False  # its controls set up the next timing; Time runs it
    bottom = 0.75

    def __init__(self) -> None:
        sizes = [64, 128, 256] if smoke() else [128, 256, 512]
        self.time_button = W.Button(description="Time", button_style="success", icon="clock-o")
        super().__init__(
            n=_slider(sizes, sizes[1], "matrix size n (n x n x n)"),
            recipe=_select(RECIPES, "tensorwise", "recipe"),
        )
        self.time_button.on_click(lambda _: self.run(blocking=False))
        self.widget.children = (*self.widget.children[:-2], W.HBox([self.time_button]), *self.widget.children[-2:])
        self.result: dict | None = None  # the last timing: times_ms, reason, n, recipe

    def run(self, blocking: bool = True):
        """Time the three GEMMs at the controls' values (median of 3 calls each), then redraw."""
        if self._thread is not None and self._thread.is_alive():
            return None
        v = self.values()

        def work() -> None:
            self.time_button.disabled = True
            try:
                self._time(**v)
            finally:
                self.time_button.disabled = False
                self.refresh()

        thread = self._launch(work, blocking)
        return self.result if blocking else thread

    def _time(self, n: int, recipe: str) -> None:
        with _torch_threads(TORCH_THREADS):  # this machine's GEMMs, with every thread torch uses
            self.result = self.measure(n, recipe)

    @staticmethod
    def measure(n: int, recipe: str) -> dict:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
        a_q, b_q = quantize_operands(a, b, recipe)
        ab, bb = a.bfloat16(), b.bfloat16()
        choice = resolve_backend(recipe)
        candidates = {
            "fp32 matmul": lambda: a @ b,
            "bf16 matmul": lambda: ab @ bb,
            f"FP8 {recipe} ({choice.backend})": lambda: matmul(a_q, b_q, recipe, verbose=False),
        }
        times = {name: sorted(timed(fn, 3))[1] * 1e3 for name, fn in candidates.items()}
        return {"times_ms": times, "reason": choice.reason, "n": n, "recipe": recipe}

    def compute(self, n: int, recipe: str) -> dict:
        if self.result is None:  # the first drawing times the default settings
            self._time(n, recipe)
        shown = {"n": self.result["n"], "recipe": self.result["recipe"]}
        pending = {k: v for k, v in {"n": n, "recipe": recipe}.items() if shown[k] != v}
        return {**self.result, "pending": pending}

    def draw(self, data, ax) -> None:
        plots.bars(data["times_ms"], ax, ylabel="milliseconds (median of 3)", title=f"{data['n']}^3 GEMM")
        if data["pending"]:
            note = "\n".join(["Changed since this timing (press Time):",
                              *(f"{k}: {v}" for k, v in data["pending"].items())])
            ax.text(0.03, 0.96, note, transform=ax.transAxes, fontsize=8, color=plots.CLIP, va="top",
                    bbox={"facecolor": "white", "alpha": 0.9, "edgecolor": plots.CLIP, "lw": 0.5})

    def describe(self, data) -> str:
        rows = {"FP8 backend": data["reason"]}
        if data["pending"]:
            rows["press Time to time"] = ", ".join(f"{k} = {v}" for k, v in data["pending"].items())
        return _metrics_html(rows)


# ---- 01 formats -----------------------------------------------------------------------------------


class BitsPanel(Panel):
    """Click the bits of a code and see its value; type a value and see its code. As
    float.exposed does: the bits grouped and coloured by field, the neighbouring values, the
    gap (ulp) and relative step at the value, and what rounding did to a typed value."""

    title = "bits -> value (click a bit) and value -> bits (type a number)"
    height = 1.8
    FIELD_STYLE: ClassVar[dict[str, str]] = {"sign": "danger", "exponent": "info", "mantissa": "success"}

    def __init__(self, fmt: str = "e4m3") -> None:
        self.bits = [W.ToggleButton(value=False, description="0", layout=W.Layout(width="34px")) for _ in range(8)]
        super().__init__(
            fmt=_select(("e4m3", "e5m2", "e2m1", "e8m0"), fmt, "format"),
            code=W.BoundedIntText(value=0x38, min=0, max=255, description="code (0-255)"),
            value=W.FloatText(value=1.0, description="type a value"),
        )
        for i, b in enumerate(self.bits):
            b.observe(lambda change, i=i: self._on_bit(i, change), names="value")
        self.bit_row = W.HBox([])
        self._grouped_for: str | None = None
        self.widget.children = (self.widget.children[0], self.widget.children[1], self.bit_row,
                                *self.widget.children[2:])
        self._sync = False

    def _group_bits(self, fmt_name: str) -> None:
        """Lay the toggles out in labelled groups, one colour per field (sign, exponent, mantissa)."""
        if self._grouped_for == fmt_name:
            return
        f = get_format(fmt_name)
        groups, i = [], 0
        for field_name, n in (("sign", int(f.signed)), ("exponent", f.exponent_bits), ("mantissa", f.mantissa_bits)):
            if n == 0:
                continue
            for b in self.bits[i:i + n]:
                b.button_style = self.FIELD_STYLE[field_name]
                b.tooltip = field_name
            label = W.HTML(f"<span style='font-size:11px'>{field_name} ({n})</span>")
            groups.append(W.VBox([label, W.HBox(self.bits[i:i + n])], layout=W.Layout(margin="0 10px 0 0")))
            i += n
        self.bit_row.children = tuple(groups)
        self._grouped_for = fmt_name

    def _on_bit(self, i: int, change) -> None:
        if self._sync:
            return
        fmt = get_format(self.controls["fmt"].value)
        code = sum(1 << (fmt.bits - 1 - j) for j, b in enumerate(self.bits[: fmt.bits]) if b.value)
        self.update(code=code)

    def update(self, **values) -> dict:
        if "value" in values and "code" not in values:  # a typed value selects its rounded code
            fmt = get_format(values.get("fmt", self.controls["fmt"].value))
            try:
                values["code"] = fmt.encode(values["value"])
            except ValueError:  # e.g. a NaN typed into a format without NaN
                pass
        return super().update(**values)

    def _on_change(self, change) -> None:
        if self._busy:
            return
        if change["owner"] is self.controls["value"]:
            self.update(value=change["new"])
        else:
            self.refresh()

    def compute(self, fmt: str, code: int, value: float) -> dict:
        f = get_format(fmt)
        code = code % (2**f.bits)
        a = anatomy(f, code)
        fields = a.fields
        v = a.value
        m, e, bias = f.mantissa_bits, fields["exponent"], f.bias
        if math.isnan(v) or math.isinf(v):
            formula = "special code"
        elif e == 0 and f.has_subnormals:
            formula = f"(-1)^{fields['sign']} x 2^(1-{bias}) x {fields['mantissa']}/{2**m}   (subnormal)"
        else:
            formula = f"(-1)^{fields['sign']} x 2^({e}-{bias}) x (1 + {fields['mantissa']}/{2**m})"
        return {"fmt": f.name, "code": code, "bits": format(code, f"0{f.bits}b"), "fields": fields, "value": v,
                "formula": formula, "typed": value, "anatomy": a, "rounding": rounding(f, value)}

    def refresh(self) -> dict:
        data = super().refresh()
        if "bits" in data:  # show the code on the toggles (and only the format's bits)
            self._sync = True
            try:
                self._group_bits(data["fmt"])
                for j, b in enumerate(self.bits):
                    if j < len(data["bits"]):
                        b.value = data["bits"][j] == "1"
                        b.description = data["bits"][j]
            finally:
                self._sync = False
            if self.controls["code"].value != data["code"]:
                self._busy = True
                self.controls["code"].value = data["code"]
                self._busy = False
        return data

    def draw(self, data, ax) -> None:
        f = get_format(data["fmt"])
        v = data["value"]
        lo = math.floor(math.log2(f.min_subnormal)) - 1
        hi = math.ceil(math.log2(f.max_value)) + 1
        plots.number_line([f], ax, lo=lo, hi=hi, mark=abs(v) if math.isfinite(v) and v != 0 else None)

    def describe(self, data) -> str:
        f = get_format(data["fmt"])
        a, r = data["anatomy"], data["rounding"]
        b = data["bits"]
        s = 1 if f.signed else 0
        colored = (f"<span style='color:#d55e00'>{b[:s]}</span> " if s else "") + \
            f"<span style='color:#0072b2'>{b[s:s + f.exponent_bits]}</span> " + \
            f"<span style='color:#009e73'>{b[s + f.exponent_bits:]}</span>"

        def num(v):
            return "none (the end of the format)" if v is None else f"{v:.6g}"

        rows = {"value": f"{data['value']:.6g}", "formula": data["formula"],
                "code": f"{data['code']} (0x{data['code']:02X})",
                "neighbours (below, above)": f"{num(a.below)}, {num(a.above)}"}
        if a.gap is not None:
            rows["gap to the next value (ulp)"] = f"{a.gap:.6g}"
        if a.relative_step is not None:
            kind = "subnormal: fewer significant bits" if a.subnormal else f"2^-{f.mantissa_bits} at a binade's start"
            rows["relative step (gap / |value|)"] = f"{100 * a.relative_step:.3g}%  ({kind})"
        rows[f"typed {r.typed:g} ->"] = (
            f"{r.rounded:.6g}: {r.status}" + ("" if r.status in ("exact", "NaN") else
                                              f", error {r.error:+.3g} ({100 * r.relative_error:.3g}%)"))
        return _metrics_html(rows) + \
            f"<div style='font-family:monospace;font-size:18px'>{colored}</div>"


class NumberLinePanel(Panel):
    """Where each format's values sit: dense near 1, sparse at the ends, and how far they reach."""

    title = "number lines: E4M3 vs E5M2 vs bf16 (and FP4, fp16)"
    height = 2.6
    keep_artists = True  # the same ticks and bands each time, moved

    def __init__(self) -> None:
        super().__init__(
            formats=W.SelectMultiple(options=["e4m3", "e5m2", "e2m1", "bf16", "fp16"], value=["e4m3", "e5m2", "bf16"],
                                     description="formats", rows=5),
            window=W.IntRangeSlider(value=(-17, 17), min=-30, max=30, description="log2 range"),
        )

    def compute(self, formats, window) -> dict:
        if not formats:
            raise ValueError("pick at least one format")
        rows = {f: {"max": FORMATS[f].max_value, "min subnormal": FORMATS[f].min_subnormal,
                    "binades": FORMATS[f].dynamic_range_binades,
                    "values in range": int(((FORMATS[f].values() > 0) & (FORMATS[f].values() >= 2.0 ** window[0])
                                            & (FORMATS[f].values() <= 2.0 ** window[1])).sum())}
                for f in formats}
        return {"formats": list(formats), "window": window, "rows": rows}

    def draw(self, data, ax) -> None:
        plots.number_line(data["formats"], ax, lo=data["window"][0], hi=data["window"][1])

    def describe(self, data) -> str:
        return _metrics_html({f: f"max {r['max']:g}, smallest {r['min subnormal']:g}, {r['binades']:.1f} binades"
                              for f, r in data["rows"].items()})


# ---- 02 per-tensor scaling -------------------------------------------------------------------------


class PerTensorPanel(Panel):
    """One scale for the whole tensor: the histogram of |x| against the format's window, and
    what it costs the ordinary values (every channel but the outlier channels)."""

    title = "per-tensor scaling: what lands in the window, what clips, what flushes"
    keep_artists = True  # the same shading and bars each time, moved

    def __init__(self) -> None:
        super().__init__(
            distribution=_select(DISTRIBUTIONS, "normal", "distribution"),
            outliers=_slider(_outlier_options(), 0.0, "outlier channels"),
            fmt=_select(ELEMENT_FORMATS, "e4m3", "format"),
            rule=_select(RULES, "exact", "scale rule"),
            margin=W.IntSlider(value=0, min=0, max=6, description="margin (powers of 2)"),
            normalize=W.Checkbox(value=False, description="normalize each channel first"),
        )
        self.shape = (size(128, 64), size(1024, 256))

    def compute(self, distribution, outliers, fmt, rule, margin, normalize) -> dict:
        x, idx = sample(distribution, self.shape, outliers, normalize=normalize, return_outliers=True)
        q = quantize(x, fmt, PerTensor(), rule, margin)
        return {"x": x, "q": q, "outlier_channels": idx, "report": quantization_report(x, q, idx), "margin": margin}

    def draw(self, data, ax) -> None:
        # an x axis that holds every setting's values and window: the learner sees them move, not the axis
        plots.histogram_log2(data["x"], data["q"], ax=ax, xlim=(-30, 40))

    def describe(self, data) -> str:
        r = data["report"]
        n = len(data["outlier_channels"])
        ordinary = f"ordinary values ({'all channels' if n == 0 else f'all but the {n} outlier channels'})"
        head = (f"<p style='font-size:14px'><b>{ordinary}: SQNR {r['ordinary_sqnr_db']:.1f} dB "
                f"(each channel counts alike), {_pct(r['ordinary_underflow'])} flushed to 0</b></p>")
        q = data["q"]
        fmt = q.fmt
        rule = {"exact": f"amax / {fmt.max_value:g}", "rceil": f"2^ceil(log2(amax / {fmt.max_value:g}))",
                "floor": f"2^(floor(log2 amax) - {math.floor(math.log2(fmt.max_value))})"}[q.scale_rule]
        margin = f" x 2^{data['margin']}" if data["margin"] else ""  # what compute used, not the control
        return head + _metrics_html({"amax": f"{r['amax']:.4g}",
                                     f"scale = {rule}{margin}": f"{float(q.scale):.4g}",
                                     "SQNR, whole tensor (energy-weighted: the largest values decide it)":
                                     f"{r['sqnr_db']:.1f} dB",
                                     "overflow (clipped)": _pct(r["overflow"]),
                                     "underflow, whole tensor (flushed to 0)": _pct(r["underflow"]),
                                     "subnormal": _pct(r["subnormal"])})


class CliffPanel(Panel):
    """Outlier magnitude from none to 1e7 against each recipe's activation scaling: the cliff
    where ordinary values start to flush, per recipe."""

    title = "the outlier cliff: each recipe's activation scaling against outlier magnitude"
    width, height = 6.4, 3.4
    keep_artists = True  # the same lines each time, moved

    def __init__(self) -> None:
        super().__init__(
            measure=_select([("SQNR of ordinary channels", "ordinary_sqnr_db"),
                             ("share of ordinary values flushed", "ordinary_underflow")],
                            "ordinary_sqnr_db", "measure"),
            distribution=_select(DISTRIBUTIONS[:4], "normal", "distribution"),
            recipes=W.SelectMultiple(options=list(CLIFF_RECIPES), value=list(CLIFF_RECIPES), description="recipes",
                                     rows=5),
        )
        self.shape = (size(64, 32), size(1024, 256))
        self._cache: dict[str, pd.DataFrame] = {}
        for distribution in self.controls["distribution"].options:  # the controls only pick from these
            self.table(distribution)

    def table(self, distribution: str) -> pd.DataFrame:
        """Every recipe at every outlier magnitude (1: none): SQNR of the ordinary channels and the
        share of ordinary values flushed to zero (none of these recipes' rules clips)."""
        if distribution not in self._cache:
            rows = []
            for magnitude in (1.0, *OUTLIERS[1:]):
                x, idx = sample(distribution, self.shape, magnitude, return_outliers=True)
                for name in CLIFF_RECIPES:
                    deq = RECIPES[name].input.quantize(x).dequantize()  # fprop's activation operand, along K
                    rows.append({"recipe": name, "outliers": magnitude, "ordinary_sqnr_db": channel_sqnr(x, deq, idx),
                                 "ordinary_underflow": flushed_fraction(x, deq, idx)})
            self._cache[distribution] = pd.DataFrame(rows)
        return self._cache[distribution]

    def compute(self, measure, distribution, recipes) -> dict:
        if not recipes:
            raise ValueError(f"pick at least one recipe; valid: {', '.join(CLIFF_RECIPES)}")
        df = self.table(distribution)
        df = df[df.recipe.isin(recipes)]
        # the cliff: the first magnitude where a recipe's ordinary SQNR is 3 dB below its own clean value
        cliffs = {}
        for name, part in df.groupby("recipe", sort=False):
            clean = float(part["ordinary_sqnr_db"].iloc[0])
            worse = part[part["ordinary_sqnr_db"] < clean - 3]
            cliffs[name] = float(worse["outliers"].iloc[0]) if len(worse) else None
        return {"df": df, "measure": measure, "cliffs": cliffs}

    def draw(self, data, ax) -> None:
        plots.outlier_cliff(data["df"], data["measure"], ax=ax)

    def describe(self, data) -> str:
        df = data["df"]
        rows = {}
        for name, at in data["cliffs"].items():
            part = df[df.recipe == name].set_index("outliers")
            rows[name] = (f"3 dB below its clean SQNR from {plots.magnitude(at)}x on" if at is not None else
                          "within 3 dB of clean up to 1e7x") + \
                f"; at 1e6x: {part.loc[1e6, 'ordinary_sqnr_db']:.1f} dB, {_pct(part.loc[1e6, 'ordinary_underflow'])} " \
                "flushed"
        return _metrics_html(rows)


# ---- 03 delayed scaling -------------------------------------------------------------------------------


class DelayedPanel(Panel):
    """Delayed scaling over a stream of activations with a spike: the history's lag."""

    title = "delayed vs current scaling over training steps"
    ncols, width = 2, 4.0
    keep_artists = True  # the same lines each time, moved

    def __init__(self) -> None:
        super().__init__(
            history=_slider([1, 2, 4, 8, 16, 32, 64], 16, "history length"),
            algo=_select(AmaxHistory.ALGOS, "max", "amax algo"),
            spike=_slider([(plots.magnitude(v), v) for v in (1, 2, 5, 20, 100, 1000, 1e4, 1e5)], 20, "spike (x)"),
            drift=_slider([0.0, 0.02, 0.05, 0.1], 0.0, "drift per step"),
            fmt=_select(("e4m3", "e5m2"), "e4m3", "format"),
            margin=W.IntSlider(value=0, min=0, max=4, description="margin"),
        )
        self.steps = 80  # longer than the longest history after the spike, so every length shows

    def compute(self, history, algo, spike, drift, fmt, margin) -> dict:
        # every step as one row: per-row scaling of the stack is per-tensor scaling of each step
        steps = torch.stack(activation_stream(self.steps, (16, 128), spike_step=self.steps // 4, spike=spike,
                                              drift=drift)).reshape(self.steps, -1)  # (steps, 32 * 128)
        current = quantize(steps, fmt, PerRow(), "exact", margin)  # each step's own amax
        amax = current.amax.flatten()
        used = torch.tensor(AmaxHistory(history, algo).replay(amax.tolist()))
        delayed = quantize(steps, fmt, PerRow(), "exact", margin, amax=used[:, None])
        rows = {"step": range(self.steps), "amax": amax.tolist(), "scale amax (delayed)": used.tolist(),
                "overflow (delayed)": row_overflow(steps, delayed).tolist(),
                "sqnr delayed": row_sqnr(steps, delayed).tolist(), "sqnr current": row_sqnr(steps, current).tolist()}
        return {"df": pd.DataFrame(rows)}

    def draw(self, data, axes) -> None:
        df = data["df"]
        plots.amax_over_steps(df[["step", "amax", "scale amax (delayed)", "overflow (delayed)"]], axes[0])
        steps = df["step"].to_numpy()
        plots.kept_lines(axes[1], {"current": (steps, df["sqnr current"].to_numpy(), {"color": plots.PALETTE[0]}),
                                   "delayed": (steps, df["sqnr delayed"].to_numpy(), {"color": plots.PALETTE[1]})})
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("SQNR (dB)")
        axes[1].set_title("SQNR: current (blue), delayed (orange)")
        # axes that hold every setting's data (amax 3 to 2.4e6, SQNR 0 to 32 dB): the learner sees
        # the spike grow, not the axis move
        plots.steady_limits(axes[0], "y", lo=1, hi=1e7)
        plots.steady_limits(axes[1], "y", step=10, lo=0, hi=40)

    def describe(self, data) -> str:
        df = data["df"]
        spike = self.steps // 4
        bad = df[df["overflow (delayed)"] > 0]
        low = df[df["sqnr delayed"] < df["sqnr current"] - 3]
        after = low[low.step > spike]
        return _metrics_html({"steps that clipped": f"{len(bad)} ({len(bad[bad.step != spike])} besides the spike step "
                                                    f"{spike})",
                              "share of values clipped, all steps": _pct(float(df["overflow (delayed)"].mean())),
                              "steps > 3 dB worse than current scaling": f"{len(low)} ({len(after)} after the spike)",
                              "worst SQNR (delayed)": f"{df['sqnr delayed'].min():.1f} dB"})


# ---- 04 per-block scaling ---------------------------------------------------------------------------------


class BlockPanel(Panel):
    """One block size at a time: where the scales are and where the error is."""

    title = "per-block scaling: scales and error per block"
    ncols, width, height = 2, 4.0, 3.2
    keep_artists = True  # two heatmaps and their colorbars, updated in place

    def __init__(self) -> None:
        super().__init__(
            block=_slider(BLOCKS, "1x128", "block"),
            fmt=_select(ELEMENT_FORMATS, "e4m3", "format"),
            scales=_select(SCALES, "fp32, exact", "scales (format, rule)"),
            distribution=_select(DISTRIBUTIONS, "normal", "distribution"),
            outliers=_slider(_outlier_options(), 1e5, "outlier channels"),
        )
        self.shape = (size(128, 64), size(1024, 256))

    def compute(self, block, fmt, scales, distribution, outliers) -> dict:
        x, idx = sample(distribution, self.shape, outliers, return_outliers=True)
        rule, sf, two_level = SCALES[scales]
        q = quantize(x, fmt, parse_granularity(block), rule, scale_fmt=sf, two_level=two_level)
        return {"x": x, "q": q, "report": quantization_report(x, q, idx)}

    def draw(self, data, axes) -> None:
        plots.scale_heatmap(data["q"], axes[0])
        plots.block_error_heatmap(data["x"], data["q"], axes[1])

    def describe(self, data) -> str:
        r = data["report"]
        return _metrics_html({"SQNR of ordinary channels (each alike)": f"{r['ordinary_sqnr_db']:.1f} dB",
                              "ordinary values flushed to 0": _pct(r["ordinary_underflow"]),
                              "SQNR, whole tensor": f"{r['sqnr_db']:.1f} dB",
                              "overflow (clipped)": _pct(r["overflow"]),
                              "scale overhead": f"{r['scale_bits_per_element']:.3g} bits / element",
                              "scales": str(tuple(data["q"].scale.shape))})


class BlockSweepPanel(Panel):
    """SQNR against block size for each scale strategy, with the scales' memory cost."""

    title = "SQNR and clipping vs block size, with the scales' memory under each block"
    ncols, width, height, bottom = 2, 5.0, 4.0, 1.35
    keep_artists = True  # the same lines each time, moved

    def __init__(self) -> None:
        super().__init__(
            fmt=_select(ELEMENT_FORMATS, "e4m3", "format"),
            distribution=_select(DISTRIBUTIONS, "normal", "distribution"),
            outliers=_slider(_outlier_options(), 1e5, "outlier channels"),
            measure=_select(("ordinary channels", "all values"), "ordinary channels", "SQNR of"),
            threshold=W.IntSlider(value=20, min=5, max=45, description="target SQNR (dB)"),
        )
        self.shape = (size(16, 16), size(1024, 256))
        self._cache: dict[tuple, pd.DataFrame] = {}

    def sweep(self, fmt: str, distribution: str, outliers: float, measure: str) -> pd.DataFrame:
        """Every strategy at every block size: SQNR, clipped share, scale bits (cached: the target
        SQNR only redraws)."""
        # "ordinary channels": the SQNR of every channel but the outliers. Over all values the
        # outliers' energy dominates and hides what happens to everything else.
        key = (fmt, distribution, outliers, measure)
        if key in self._cache:
            return self._cache[key]
        x, idx = sample(distribution, self.shape, outliers, return_outliers=True)
        strategies = {"fp32 scales, exact": ("exact", None), "E8M0 scales, rceil": ("rceil", "e8m0"),
                      "E8M0 scales, floor (OCP)": ("floor", "e8m0")}
        rows = []
        for name, (rule, sf) in strategies.items():
            for block in BLOCKS:
                q = quantize(x, fmt, parse_granularity(block), rule, scale_fmt=sf)
                deq = q.dequantize()
                db = channel_sqnr(x, deq, idx) if measure == "ordinary channels" else sqnr(x, deq)
                rows.append({"strategy": name, "block": block, "sqnr_db": db, "overflow": overflow_fraction(x, q),
                             "scale_bits_per_element": q.scale_bits_per_element})
        if len(self._cache) > 32:
            self._cache.clear()
        self._cache[key] = pd.DataFrame(rows)
        return self._cache[key]

    def compute(self, fmt, distribution, outliers, measure, threshold) -> dict:
        df = self.sweep(fmt, distribution, outliers, measure)
        ok = df[(df.strategy == "fp32 scales, exact") & (df.sqnr_db >= threshold)]
        best = ok.sort_values("scale_bits_per_element").iloc[0]["block"] if len(ok) else None
        return {"df": df, "threshold": threshold, "cheapest": best}

    def draw(self, data, axes) -> None:
        plots.metric_vs_block(data["df"], ax=axes[0], threshold=data["threshold"])
        plots.steady_limits(axes[0], "y", step=20)
        plots.overflow_vs_block(data["df"], ax=axes[1])

    def describe(self, data) -> str:
        df = data["df"].set_index(["strategy", "block"])
        mx = {s: df.loc[(s, "1x32")] for s in ("E8M0 scales, rceil", "E8M0 scales, floor (OCP)")}
        return _metrics_html({
            f"cheapest block with fp32 scales >= {data['threshold']} dB": str(data["cheapest"] or "none reaches it"),
            "MX 1x32, rceil vs floor": " vs ".join(f"{r['sqnr_db']:.1f} dB, {_pct(r['overflow'])} clipped"
                                                   for r in mx.values())})


# ---- 05 GEMM -------------------------------------------------------------------------------------------------


class GemmPanel(Panel):
    """The error of an FP8 GEMM per recipe, against the exact product of the unquantized inputs."""

    title = "FP8 GEMM error per recipe (relative to the exact product)"
    keep_artists = True  # the same bars each time, new heights
    WEIGHTS: ClassVar[dict[str, str]] = {"random": "random", "zero rows for the outlier channels (sinks)": "zero rows"}

    def __init__(self) -> None:
        super().__init__(
            k=_slider([64, 256, 1024, 4096], 1024, "K"),
            outliers=_slider(_outlier_options(), 0.0, "outlier channels in a"),
            distribution=_select(DISTRIBUTIONS, "normal", "distribution"),
            weights=_select(list(self.WEIGHTS.items()), "random", "b's rows for those channels"),
        )
        self.m = size(128, 32)
        self._backends: dict[str, str] | None = None

    def compute(self, k, outliers, distribution, weights) -> dict:
        a, idx = sample(distribution, (self.m, k), outliers, seed=1, return_outliers=True)
        b = sample("normal", (k, 64), 0.0, seed=2)
        zeroed = idx if weights == "zero rows" else idx[:0]
        b[zeroed] = 0.0  # as LLM sinks meet weights that ignore them: the product never sees them
        true = a.double() @ b.double()
        errs = {}
        for name in RECIPES:
            out = matmul(a, b, name, verbose=False).double()
            errs[name] = (torch.linalg.norm(out - true) / torch.linalg.norm(true)).item()
        if self._backends is None:  # decided once per machine: no need to ask again on every redraw
            self._backends = {n: resolve_backend(n).reason for n in RECIPES}
        return {"errors": errs, "backend": self._backends, "zeroed": zeroed.tolist(),
                "outlier_channels": idx.tolist(), "weights": weights}

    def draw(self, data, ax) -> None:
        errs = data["errors"]
        plots.bars(errs, ax, ylabel="relative error (log)", log=True, highlight=max(errs, key=errs.get),
                   title="error of each recipe's GEMM")
        plots.steady_limits(ax, "y")  # whole decades

    def describe(self, data) -> str:
        e = data["errors"]
        head = (f"<p style='font-size:14px'><b>tensorwise {100 * e['tensorwise']:.2f}% vs blockwise "
                f"{100 * e['blockwise']:.2f}%: {e['tensorwise'] / e['blockwise']:.2g}x</b></p>")
        if data["weights"] == "zero rows":
            rows = (f"zero at {data['zeroed']} (a's outlier channels): the product never sees them" if data["zeroed"]
                    else "zero for a's outlier channels - none here: raise the outliers")
        elif data["outlier_channels"]:
            rows = "random: a's outlier channels' products dominate the output"
        else:
            rows = "random"
        return head + _metrics_html({"b's rows": rows,
                                     **{n: f"{100 * v:.2f}%  ({data['backend'][n]})" for n, v in e.items()}})


class AccumulationPanel(Panel):
    """Limited-precision accumulation (Hopper's ~14 bits) and DeepSeek-V3's promotion fix."""

    title = "accumulation precision: error vs K"
    keep_artists = True  # the same lines each time, moved

    def __init__(self) -> None:
        super().__init__(
            bits=W.IntSlider(value=14, min=8, max=24, description="accumulator bits"),
            promote=_slider([("never", 0), ("32", 32), ("64", 64), ("128", 128), ("256", 256), ("512", 512)], 128,
                            "promote to fp32 every"),
            distribution=_select(("uniform", "normal"), "uniform", "inputs"),
        )
        self.ks = [128, 256, 512, 1024] if smoke() else [128, 256, 512, 1024, 2048, 4096]
        self._curves: dict[tuple, list[float]] = {}  # (model or None for fp32, distribution) -> error per K

    def _curve(self, model: AccumulatorModel | None, distribution: str) -> list[float]:
        """One curve (error per K), computed once per model and inputs: a drag back over a value
        (or a promotion change, which leaves the unpromoted curve as it was) reuses it."""
        key = (model, distribution)
        if key not in self._curves:
            if len(self._curves) > 256:
                self._curves.clear()
            self._curves[key] = [max(e, 1e-9) for e in accumulation_errors(self.ks, model, distribution)]
        return self._curves[key]

    def compute(self, bits, promote, distribution) -> dict:
        # the settings go in the title, not the legend: the legend stays as the sliders move
        settings = {"fp32 accumulation": None, "no promotion": AccumulatorModel(bits - 1, 32, None)}
        if promote:
            settings["promoted to fp32"] = AccumulatorModel(bits - 1, 32, promote)
        rows = [{"accumulation": label, "K": k, "relative error": e}
                for label, model in settings.items()
                for k, e in zip(self.ks, self._curve(model, distribution), strict=True)]
        return {"df": pd.DataFrame(rows), "distribution": distribution, "bits": bits, "promote": promote}

    def draw(self, data, ax) -> None:
        every = f", promoted every {data['promote']}" if data["promote"] else ", never promoted"
        plots.gemm_error_vs_k(data["df"], ax, title=f"{data['bits']}-bit accumulator{every}")
        plots.steady_limits(ax, "y", lo=1e-9, hi=1)  # every setting's errors (1e-9: fp32's floor)

    def describe(self, data) -> str:
        df = data["df"]
        last = df[df.K == df.K.max()].set_index("accumulation")["relative error"]
        inputs = ("uniform [0, 1): every product has the same sign, so the truncated bits add up (the worst case)"
                  if data["distribution"] == "uniform" else
                  "normal: products of both signs, so the truncated bits partly cancel")
        named = {"no promotion": f"{data['bits']}-bit, no promotion",
                 "promoted to fp32": f"{data['bits']}-bit, promoted every {data['promote']}"}
        return _metrics_html({**{f"{named.get(k, k)} at K={df.K.max()}": f"{100 * v:.3g}%" for k, v in last.items()},
                              "inputs": inputs})


# ---- 06 live training -------------------------------------------------------------------------------------


class TrainingPanel(Panel):
    """Recipes trained side by side, live: Start runs in a background thread, Stop ends it.

    The delayed recipe takes the amax history length and margin set here; "input drop"
    shrinks fc1's input 1e5-fold at LESSON.gain_drop_step (the mlp). Controls that only a new
    run can apply (recipes, model, sinks, steps, history, margin, input drop) are listed over
    the plot, against the run it shows, until Start trains with them."""

    title = "live training: recipes side by side"
    live_sliders = False  # its controls set up the next run; Start trains
    ncols, width, height, right = 2, 4.6, 3.3, 1.5
    RUN_CONTROLS = ("recipes", "model", "sinks", "steps", "history", "margin", "input_drop")

    def __init__(self, model: str = "mlp") -> None:
        from fp8lab.train import HISTORIES, LESSON

        self.start = W.Button(description="Start", button_style="success", icon="play")
        self.stop = W.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.progress = W.IntProgress(value=0, min=0, max=1, description="steps")
        super().__init__(
            recipes=W.SelectMultiple(options=["fp32", "bf16", *RECIPES], value=["fp32", "tensorwise", "blockwise",
                                                                                "mxfp8"],
                                     description="recipes", rows=8),
            model=_select(("mlp", "transformer"), model, "model"),
            sinks=_slider(_outlier_options(), 0.0, "sink channels (outlier knob)"),
            steps=W.IntSlider(value=size(LESSON.steps, 20), min=10, max=400, step=10, description="steps"),
            history=_slider([*HISTORIES, 1024], 16, "delayed: amax history"),
            margin=W.IntSlider(value=0, min=0, max=4, description="delayed: margin"),
            input_drop=W.Checkbox(value=False, description=f"input drops 1e5x at step {LESSON.gain_drop_step} (mlp)"),
            metric=_select(("underflow", "overflow", "amax"), "underflow", "monitor"),
            layer_input=_select(("input", "weight", "grad_output"), "input", "monitored tensor"),
        )
        self.start.on_click(lambda _: self.run(blocking=False))
        self.stop.on_click(lambda _: self._stop_event.set())
        self.widget.children = (self.widget.children[0], *self.widget.children[1:4],
                                W.HBox([self.start, self.stop, self.progress]), *self.widget.children[4:])
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
        from fp8lab.train import delayed_recipes

        v = v or self.values()
        return [delayed_recipes([v["history"]], margin=v["margin"])[0] if r == "delayed" else r for r in v["recipes"]]

    def compute(self, recipes, model, sinks, steps, history, margin, input_drop, metric, layer_input) -> dict:
        if not recipes:
            raise ValueError(f"pick at least one recipe; valid: fp32, bf16, {', '.join(RECIPES)}")
        if input_drop and model != "mlp":
            raise ValueError("the input drop acts on the mlp's first layer: pick model 'mlp'")
        values = {"recipes": tuple(recipes), "model": model, "sinks": sinks, "steps": steps, "history": history,
                  "margin": margin, "input_drop": input_drop}
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
        for m in self.messages:
            rows[m] = ""
        return _metrics_html(rows) if rows else "Press Start to train."

    def run(self, blocking: bool = True):
        """Train with the current controls; blocking=False runs in a background thread so that
        the kernel keeps answering widget messages (Stop, the plots) while it trains."""
        if self._thread is not None and self._thread.is_alive():
            return None
        from fp8lab.train import LESSON, train

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
    """Final loss against sink magnitude per recipe, from fp8lab.measured (3 seeds, measured by
    `python -m fp8lab.measured --write`), with one point recomputed live on request."""

    title = "the sink cliff: final loss vs sink magnitude (3 seeds, shipped), one point live"
    width, height = 7.0, 3.6

    def __init__(self) -> None:
        from fp8lab.measured import cliff

        self.table = cliff()
        runs = list(dict.fromkeys(self.table["run"])) or ["fp32", *RECIPES]
        sinks = sorted(set(self.table["sinks"])) or [0.0, 1e6]
        self.recompute_button = W.Button(description="Recompute this point", button_style="info", icon="refresh")
        super().__init__(
            recipes=W.SelectMultiple(options=runs, value=runs, description="recipes", rows=7),
            measure=_select([("change vs its own no-sink run", "relative"), ("final loss", "loss")], "relative",
                            "plot"),
            sinks=_slider([(plots.magnitude(v), v) for v in sinks], 1e6 if 1e6 in sinks else sinks[-1],
                          "point to recompute"),
        )
        self.recompute_button.on_click(lambda _: self.recompute(blocking=False))
        self.widget.children = (*self.widget.children[:-2], W.HBox([self.recompute_button]),
                                *self.widget.children[-2:])
        self.live = pd.DataFrame(columns=["run", "sinks", "loss"])

    def compute(self, recipes, measure, sinks) -> dict:
        if not recipes:
            raise ValueError("pick at least one recipe")
        if self.table.empty:
            raise ValueError("fp8lab.measured holds no results yet: run `python -m fp8lab.measured --write`")
        mean = self.table.groupby(["run", "sinks"], sort=False)["loss"].mean().reset_index()
        seed0 = self.table[self.table.seed == 0].set_index(["run", "sinks"])["loss"]
        df = mean[mean.run.isin(recipes)]
        live = self.live[self.live.run.isin(recipes)]
        at = df[df.sinks == sinks].set_index("run")["loss"]
        clean = df[df.sinks == 0].set_index("run")["loss"]
        point = {r: {"mean of 3 seeds": at[r], "seed 0": seed0.get((r, sinks), math.nan),
                     "change vs no sinks": at[r] / clean[r] - 1} for r in at.index}
        for row in live[live.sinks == sinks].itertuples():
            if row.run in point:
                point[row.run]["recomputed now (seed 0)"] = row.loss
        return {"df": df, "live": live, "relative": measure == "relative", "sinks": sinks, "point": point}

    def draw(self, data, ax) -> None:
        plots.sink_cliff(data["df"], ax, relative=data["relative"], mark=data["sinks"], live=data["live"])

    def describe(self, data) -> str:
        from fp8lab.measured import MEASURED_ON

        rows = {}
        for run, p in data["point"].items():
            txt = f"{p['mean of 3 seeds']:.4f} ({100 * p['change vs no sinks']:+.0f}%); seed 0: {p['seed 0']:.4f}"
            if "recomputed now (seed 0)" in p:
                txt += f"; recomputed now: {p['recomputed now (seed 0)']:.4f}"
            rows[run] = txt
        where = plots.magnitude(data["sinks"])
        return (f"<p><b>final loss at sinks {where}</b> (mean of 3 seeds, and its change against the run's own "
                f"no-sink loss)</p>" + _metrics_html(rows) +
                f"<p style='font-size:11px'>measured on {html.escape(MEASURED_ON)}</p>")

    def recompute(self, blocking: bool = True):
        """Train seed 0 at the chosen sink magnitude (150 steps, the chosen recipes) and draw
        the final losses over the shipped curve."""
        if self._thread is not None and self._thread.is_alive():
            return None
        from fp8lab.train import LESSON, train

        v = self.values()

        def work():
            self.recompute_button.disabled = True
            try:
                res = train(tuple(v["recipes"]), steps=LESSON.steps, sink_magnitude=v["sinks"], progress=False,
                            monitor_every=None)
                rows = [{"run": r, "sinks": v["sinks"], "loss": loss} for r, loss in res.final_loss().items()]
                old = self.live[~((self.live.sinks == v["sinks"]) & self.live.run.isin(v["recipes"]))]
                self.live = pd.concat([old, pd.DataFrame(rows)], ignore_index=True) if len(old) else pd.DataFrame(rows)
            finally:
                self.recompute_button.disabled = False
                self.refresh()

        thread = self._launch(work, blocking)
        return self.live if blocking else thread


# ---- 07 export ------------------------------------------------------------------------------------------------


class ExportPanel(Panel):
    """The recipe picked in the lab, written for torchao, TransformerEngine or torchtitan."""

    title = "take your recipe to a real training job"
    height = 0.6

    def __init__(self) -> None:
        from fp8lab.export import TARGETS

        super().__init__(recipe=_select([*RECIPES, "rowwise_with_gw_hp"], "mxfp8", "recipe"),
                         target=_select(TARGETS, "torchao", "target"))

    def compute(self, recipe, target) -> dict:
        from fp8lab.export import export

        e = export(recipe, target)
        return {"recipe": e.recipe, "target": e.target, "available": e.available, "text": e.text,
                "differences": e.differences, "source": e.source}

    def draw(self, data, ax) -> None:
        ax.set_axis_off()
        ax.text(0.0, 0.5, f"{data['recipe']} -> {data['target']}: "
                          f"{'available' if data['available'] else 'not available'}", fontsize=11,
                color=plots.PALETTE[2] if data["available"] else plots.CLIP, va="center")

    def describe(self, data) -> str:
        diff = f"<p><b>Differs from fp8lab:</b> {html.escape(data['differences'])}</p>" if data["differences"] else ""
        return (f"<pre style='font-size:12px'>{html.escape(data['text'])}</pre>{diff}"
                f"<p style='font-size:11px'>source: {html.escape(data['source'])}</p>")


class DistributedPanel(Panel):
    """One recipe trained in this process and on 2 processes (FSDP2 under torchrun), side by side."""

    title = "one process vs two (FSDP2): the same loss curve?"
    live_sliders = False  # its controls set up the next run; Run trains
    ncols, width = 2, 4.6

    def __init__(self) -> None:
        self.run_button = W.Button(description="Run", button_style="success", icon="play")
        self.log = W.Textarea(value="", layout=W.Layout(width="100%", height="120px"), disabled=True)
        super().__init__(
            recipe=_select([*RECIPES, "fp32"], "tensorwise", "recipe"),
            engine=_select(("fp8lab", "torchao"), "fp8lab", "engine"),
            amax_all_reduce=W.Checkbox(value=False, description="all-reduce amax over ranks"),
            steps=W.IntSlider(value=size(12, 4), min=2, max=40, description="steps"),
        )
        self.run_button.on_click(lambda _: self.run(blocking=False))
        self.widget.children = (*self.widget.children[:-2], W.HBox([self.run_button]), self.log,
                                *self.widget.children[-2:])
        self.result = None
        self.settings: dict | None = None  # the controls the result was run with

    def compute(self, recipe, engine, amax_all_reduce, steps) -> dict:
        df = self.result if self.result is not None else pd.DataFrame(columns=["step", "single", "distributed",
                                                                                  "abs_diff"])
        values = {"recipe": recipe, "engine": engine, "amax all-reduce": "on" if amax_all_reduce else "off",
                  "steps": str(steps)}
        # every control acts on the next run: name the ones the plot does not show yet
        pending = {k: v for k, v in values.items() if self.settings is None or self.settings.get(k) != v}
        return {"df": df, "pending": pending, "first": self.settings is None, "values": values}

    def draw(self, data, axes) -> None:
        df = data["df"]
        long = df.melt(id_vars="step", value_vars=["single", "distributed"], var_name="run", value_name="loss")
        plots.loss_curves(long, axes[0], smooth=1, title="loss: 1 process vs 2")
        if len(df):
            axes[1].plot(df["step"], df["abs_diff"].clip(lower=1e-9), marker="o", color=plots.PALETTE[3])
            axes[1].set_yscale("log")
            plots.log_axis(axes[1], "y")
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("|difference| (log)")
        axes[1].set_title("where the two runs part")
        if data["pending"]:
            head = "Press Run to train with:" if data["first"] else "Changed since this run (press Run):"
            note = "\n".join([head, *(f"{k}: {v}" for k, v in data["pending"].items())])
            axes[0].text(0.03, 0.96, note, transform=axes[0].transAxes, fontsize=8, color=plots.CLIP, va="top",
                         bbox={"facecolor": "white", "alpha": 0.9, "edgecolor": plots.CLIP, "lw": 0.5})

    def run(self, blocking: bool = True):
        """Train in this process and on 2 ranks; the workers' output streams into the log."""
        if self._thread is not None and self._thread.is_alive():
            return None
        from fp8lab.distributed import DistributedRunError, compare

        v = self.values()
        lines: list[str] = []

        def stream(line: str) -> None:
            lines.append(line.rstrip())
            self.log.value = "\n".join(lines[-200:])

        def work():
            self.run_button.disabled = True
            try:
                self.result = compare(v["recipe"], nproc=2, steps=v["steps"], engine=v["engine"],
                                      amax_all_reduce=v["amax_all_reduce"], stream=stream)
                self.settings = self.compute(**v)["values"]
            except (DistributedRunError, ValueError) as err:
                stream(f"FAILED: {err}")
            finally:
                self.run_button.disabled = False
                self.refresh()

        thread = self._launch(work, blocking)
        return self.result if blocking else thread


PANELS: dict[str, Callable[[], Panel]] = {
    "timing": TimingPanel, "bits": BitsPanel, "number_line": NumberLinePanel, "per_tensor": PerTensorPanel,
    "cliff": CliffPanel, "delayed": DelayedPanel, "block": BlockPanel, "block_sweep": BlockSweepPanel,
    "gemm": GemmPanel, "accumulation": AccumulationPanel, "training": TrainingPanel,
    "training_cliff": TrainingCliffPanel, "distributed": DistributedPanel, "export": ExportPanel,
}


def sweep_values(panel: Panel) -> dict[str, list]:
    """Every value of every control (a few per numeric range), for tests and the benchmark."""
    out = {}
    for name, ctl in panel.controls.items():
        if isinstance(ctl, W.SelectMultiple):
            opts = list(ctl.options)
            out[name] = [tuple(opts[:1]), tuple(opts[:3]), tuple(ctl.value)]
        elif isinstance(ctl, W.IntRangeSlider):
            out[name] = [(ctl.min, ctl.max), (-10, 10), tuple(ctl.value)]
        elif hasattr(ctl, "options"):
            opts = [o[1] if isinstance(o, tuple) else o for o in ctl.options]
            out[name] = opts
        elif isinstance(ctl, W.Checkbox):
            out[name] = [not ctl.value, ctl.value]
        elif isinstance(ctl, W.IntSlider | W.BoundedIntText):
            lo, hi = ctl.min, ctl.max
            out[name] = sorted({lo, (lo + hi) // 2, hi, ctl.value})
        elif isinstance(ctl, W.FloatText):
            out[name] = [0.3, 1000.0, -2.5, ctl.value]
    return out


# ---- 05 / 08 the cost side ------------------------------------------------------------------------------------


class CostPanel(Panel):
    """What each recipe costs (fp8lab.cost): scale storage, scale multiplies in the GEMM, the amax,
    this machine's measured times, and published GPU speed-ups with their sources."""

    title = "the cost side: is per-tensor cheaper, and where?"
    width, height, ncols = 4.0, 3.0, 3
    bottom = 1.0  # the recipes' names under the bars, turned upright (tests/test_widgets.py checks legibility)
    keep_artists = True  # the same bars each time, new heights

    def __init__(self) -> None:
        super().__init__(
            k=_slider([256, 1024, 4096, 16384], 4096, "K (contraction length)"),
            ranks=_select([1, 8, 64], 1, "data-parallel ranks"),
        )
        self.tokens = 4096  # M: rows of x in the GEMM x[M, K] @ w[K, K]^T
        self.size = size(512, 128)
        self._measured = None  # timed once per panel: the controls change nothing that is timed

    def compute(self, k, ranks) -> dict:
        from fp8lab import cost

        if self._measured is None:
            self._measured = cost.measure(size=self.size, rounds=3)
        table = cost.cost_table(k=k, m=self.tokens, ranks=ranks)
        comparison = cost.per_tensor_vs_block(table, self._measured)
        return {"table": table, "measured": self._measured, "comparison": comparison,
                "answer": cost.answer(comparison), "k": k, "ranks": ranks}

    def draw(self, data, axes) -> None:
        table, measured = data["table"], data["measured"]
        bits = (table["element bits"] + table["scale bits/element (x)"]).to_dict()
        plots.bars(bits, axes[0], ylabel="bits per element of x", title="bits moved (element + scales)")
        plots.bars(table["scale multiplies per output"].astype(float).to_dict(), axes[1], log=True,
                   ylabel="multiplies per output element", title=f"scale multiplies, K={data['k']}")
        # up to 1 per 16 elements of the longest K (NVFP4): the axis holds every K's bars
        plots.steady_limits(axes[1], "y", lo=0.5, hi=max(self.controls["k"].options) / 16)
        plots.bars(measured["quantize ms"].drop("fp32 (no FP8)").to_dict(), axes[2], ylabel="ms (median of 3)",
                   title=f"quantize {self.size}x{self.size} here")

    def describe(self, data) -> str:
        table = data["table"]
        rows = "".join(
            f"<tr><td><b>{html.escape(r)}</b></td><td>{html.escape(t['amax'])}</td>"
            f"<td>{html.escape(t['published GPU speed-up'])}</td></tr>" for r, t in table.iterrows())
        sources = sorted({s for v in table["sources"] for s in v.split("; ") if s})
        from fp8lab.cost import PUBLISHED_NOTE

        return (f"<table style='font-size:12px'><tr><th>recipe</th><th>how the amax is found</th>"
                f"<th>published GPU speed-up (over BF16)</th></tr>{rows}</table>"
                f"<p style='font-size:11px'>sources: {html.escape(' | '.join(sources))}. "
                f"{html.escape(PUBLISHED_NOTE)}</p><p><b>Is per-tensor cheaper?</b> {html.escape(data['answer'])}</p>")


PANELS["cost"] = CostPanel
# the panels whose sliders redraw while dragged
LIVE_PANELS: tuple[str, ...] = tuple(name for name, make in PANELS.items() if make.live_sliders)
