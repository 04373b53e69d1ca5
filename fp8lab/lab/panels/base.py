"""The Panel base class: controls, a figure and a text; redraws coalesced on one drawing thread.

Public: Panel, the control choices the panels share (OUTLIERS, BLOCKS, ELEMENT_FORMATS, RULES, SCALES), and the
controls and formatting they build with (dropdown, selection_slider, outlier_options, metrics_html, percent, memo: a
compute's results kept per controls' values). A panel's plots are PNGs in an ipywidgets.Image, rendered without
pyplot at 2x device pixels, so a background thread (notebook 06's live training) can redraw them and high-DPI
screens show them sharp. Live panels (`Panel.live_sliders`) redraw while a slider is dragged; the expensive ones
redraw on release and time or train on a button. A change from the browser never redraws in the kernel's message
handler: it marks the panel stale, and one drawing thread redraws with the controls' newest values until nothing is
stale (`Panel.request_redraw`), so values that arrive during a redraw replace each other and only the latest is
drawn. Front ends that drop output sent from other threads get the "sync" drawing mode instead (draw_mode()).
"""

from __future__ import annotations

import functools
import html
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar, TypeVar

import ipywidgets as W
import torch
from matplotlib.transforms import Bbox

from fp8lab.figures import plots
from fp8lab.figures.render import LayeredCanvas
from fp8lab.lab import redraw
from fp8lab.numerics.recipes import SCALE_PRESETS, ScalePreset
from fp8lab.numerics.scaling import SCALE_RULES
from fp8lab.settings import draw_requested

__all__ = [
    "BLOCKS",
    "CLIFF_RECIPES",
    "CSS_DPI",
    "ELEMENT_FORMATS",
    "OUTLIERS",
    "RULES",
    "SCALES",
    "SLIDERS",
    "TORCH_THREADS",
    "Panel",
    "draw_mode",
    "dropdown",
    "memo",
    "metrics_html",
    "outlier_options",
    "percent",
    "selection_slider",
    "torch_threads",
]

OUTLIERS = (0.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7)
BLOCKS = ("1x16", "1x32", "1x64", "1x128", "32x32", "128x128", "per-row", "per-tensor")
ELEMENT_FORMATS = ("e4m3", "e5m2", "e2m1")
RULES = SCALE_RULES  # the scale rules a panel offers: all of them
# how a block's scale is stored and rounded, by the label a panel shows: numerics' named presets. E8M0 holds only
# powers of two (rceil or floor); E4M3 scales sit under an fp32 tensor scale (NVFP4)
SCALES: dict[str, ScalePreset] = {p.label: p for p in SCALE_PRESETS.values()}
SLIDERS = (W.SelectionSlider, W.SelectionRangeSlider, W.IntSlider, W.FloatSlider, W.FloatLogSlider, W.IntRangeSlider,
           W.FloatRangeSlider)
CSS_DPI = 72  # the panels' size on the page: a figure of w inches is w * 72 CSS pixels wide
# the recipes whose activation scaling the outlier cliff compares (delayed: tensorwise's, one step late)
CLIFF_RECIPES = ("tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4")


K, V = TypeVar("K"), TypeVar("V")
TORCH_THREADS = torch.get_num_threads()  # the process's default, as the kernel started


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch (and fp8lab's kernels, on torch's OpenMP) with `n` threads in this thread only, then
    as before; None: unchanged. A redraw's tensors are small (~1e5 elements): on 2 shared cores,
    with the browser drawing the last frame, a 2-thread region waits for a core that is busy, and
    a redraw of tens of milliseconds takes hundreds."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def on_the_cpu() -> Iterator[None]:
    """torch's default device the CPU in this thread for the block where a notebook set another
    (torch.set_default_device holds for the thread that called it: "meta" to size a model, say), so that a panel's
    tensors are the lab's CPU tensors; nothing changes, at no cost, where it is the CPU. (Its default dtype is
    process-wide, so the lab names float32 where it makes a tensor instead: fp8lab.data.synthetic.FLOAT32_CPU.)"""
    if torch.get_default_device().type == "cpu":
        yield
        return
    with torch.device("cpu"):
        yield


MEMO_LIMIT = 128  # results a panel's cache holds before it starts again (a drag back over them only draws)


def memo(cache: dict[K, V], key: K, make: Callable[[], V], limit: int = MEMO_LIMIT) -> V:
    """cache[key], made by make() the first time; a cache of `limit` entries is emptied before it takes another.
    Callers that hand the value out copy it (dict(...)) where a reader could change it."""
    if key not in cache:
        if len(cache) >= limit:
            cache.clear()
        cache[key] = make()
    return cache[key]


def metrics_html(rows: dict[str, str]) -> str:
    """A panel's metrics as a small HTML table: one row per (label, value), the value in bold."""
    cells = "".join(f"<tr><td style='padding-right:12px'>{html.escape(k)}</td><td><b>{html.escape(v)}</b></td></tr>"
                    for k, v in rows.items())
    return f"<table style='font-size:13px'>{cells}</table>"


def percent(v: float) -> str:
    """A share (0-1) as the panels print it: 3 significant digits and a % sign (0.0123 -> "1.23%")."""
    return f"{100 * v:.3g}%"


class Panel:
    """Controls, a figure and a text area; `update(**values)` recomputes and redraws.

    live_sliders=True: sliders send their value while dragged (continuous_update) and the plot follows;
    live_sliders=False (panels whose redraw runs GEMMs, or whose controls set up a run that a button
    starts): sliders send their value on release."""

    title = ""
    live_sliders: ClassVar[bool] = True
    # keep_axes=True: the axes, their tick objects and colorbars stay between redraws and only the
    # data is drawn again (fp8lab.lab.redraw.clear_data): creating axes, colorbars and ticks is most
    # of a redraw's drawing time. False: the axes are cleared whole (panels drawn on a button press)
    keep_axes: ClassVar[bool] = False
    redraw_threads: int | None = 1  # torch threads for a redraw (None: the process's)
    width, height, ncols = 6.0, 3.2, 1
    right = 0.6  # inches right of the last plot (a legend beside it needs more)
    bottom = 0.55  # inches below the plots (rotated tick labels need more)
    left = 0.85  # inches left of the first plot (its tick labels and y label)

    def __init__(self, **controls: W.Widget) -> None:
        self.controls: dict[str, W.Widget] = controls
        self.image = W.Image(format="png", layout=W.Layout(max_width="100%"))
        self.text = W.HTML()
        self.data: dict = {}
        # the last redraw's CPU seconds (this thread's): compute, draw (the artists, in place or whole), render (Agg's
        # drawing, the PNG and the text); bench widgets reports them
        self.cpu_parts: dict[str, float] = {}
        # what the last whole drawing drew that draw_in_place moves (its artists, what they show); None until a
        # whole drawing ends: draw sets it last, and _refresh clears it before the axes are cleared for another,
        # so a drawing that fails midway leaves nothing to move
        self._drawn = None
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
        self.sync = draw_mode() == "sync"  # redraw and run in the kernel's own thread
        for ctl in controls.values():
            if hasattr(ctl, "value"):
                ctl.observe(self._on_change, names="value")
            if isinstance(ctl, SLIDERS):  # in sync mode a drag must not queue a redraw per value
                ctl.continuous_update = self.live_sliders and not self.sync
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
                                     bottom=self.bottom, left=self.left, dpi=CSS_DPI * plots.PIXEL_RATIO)
            own = axes if isinstance(axes, list) else [axes]
            LayeredCanvas(fig)  # the background (axes, ticks, labels) kept while a slider moves
            self._figure = (fig, axes, [ax.get_position() for ax in own])
            self.image.width = str(round(fig.get_figwidth() * CSS_DPI))
        fig, axes, boxes = self._figure
        own = axes if isinstance(axes, list) else [axes]
        if self.keep_axes:
            for ax in own:
                redraw.clear_data(ax)
            return fig, axes
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
        with self._lock, torch_threads(self.redraw_threads), on_the_cpu():
            return self._refresh()

    def _refresh(self) -> dict:
        values = self.values()
        self.drawn_values = values  # what the plot and text show (checked against the controls after a drag)
        self.cpu_parts = {}
        try:
            began = time.thread_time()
            self.data = self.compute(**values)
            computed = time.thread_time()
            if self._figure is not None and self.draw_in_place(self.data):
                fig = self._figure[0]
            else:
                self._drawn = None
                fig, axes = self._axes()
                self.draw(self.data, axes)
            drawn = time.thread_time()
            self.image.value = plots.to_png(fig, keep=True)
            self.text.value = self.describe(self.data)
            self.cpu_parts = {"compute": computed - began, "draw": drawn - computed,
                              "render": time.thread_time() - drawn}
        except ValueError as err:  # bad combinations are explained, never raised into the notebook
            self.data = {"error": str(err)}
            self.text.value = f"<span style='color:#d55e00'><b>Not possible:</b> {html.escape(str(err))}</span>"
        return self.data

    def _launch(self, work: Callable[[], None], blocking: bool):
        """Run `work` now (blocking, and always in sync mode), or in a background thread so that
        the kernel keeps answering widget messages (Stop, redraws) meanwhile; one run at a time.
        In sync mode the kernel's interrupt (the notebook's stop button) ends a run."""
        if self._thread is not None and self._thread.is_alive():
            return None
        if blocking or self.sync:
            try:
                with on_the_cpu():
                    work()
            except KeyboardInterrupt:
                self.text.value += "<p><b>Stopped</b> (the kernel was interrupted).</p>"
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

    def draw_in_place(self, data: dict) -> bool:
        """Update the last drawing for `data` without drawing it again, where only a detail moved (a
        marked value); True if done. By default never: the panel is drawn afresh."""
        return False

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
        values arrive during a redraw, one more redraw follows, with the last of them.
        In sync mode the handler redraws itself (its sliders send one value per release)."""
        if self.sync:
            self.redraws += 1
            self.refresh()
            return
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
                again = self._stale  # a change that arrived during the failed redraw is still to be drawn
            self.text.value = f"<span style='color:#d55e00'><b>Redraw failed:</b> {html.escape(repr(err))}</span>"
            if again:
                self.request_redraw()
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


def dropdown(options, value, description: str) -> W.Dropdown:
    """A Dropdown of `options` (values, or (label, value) pairs) set to `value`."""
    return W.Dropdown(options=list(options), value=value, description=description)


def selection_slider(options, value, description: str) -> W.SelectionSlider:
    """A SelectionSlider over `options` (values, or (label, value) pairs) set to `value`."""
    return W.SelectionSlider(options=list(options), value=value, description=description)


def outlier_options():
    """OUTLIERS as (label, value) pairs: "none", then "10x", "100x", ... for a slider or a dropdown."""
    return [(("none" if v == 0 else f"{plots.magnitude(v)}x"), v) for v in OUTLIERS]


@functools.cache
def draw_mode() -> str:
    """How panels redraw, decided once per process.

    "thread": a change marks the panel stale and a drawing thread redraws (live sliders send values
    while dragged); training and timing run in a background thread, with a Stop button.
    "sync": the kernel's own thread redraws (sliders send their value on release) and runs training
    in the foreground, which the kernel's interrupt stops: for front ends that drop or delay what
    other threads send. FP8LAB_DRAW chooses; "auto" (the default) is "sync" on Colab, else "thread"."""
    asked = draw_requested()
    if asked != "auto":
        return asked
    return "sync" if "google.colab" in sys.modules else "thread"
