"""The lab's figures and axes: the theme, a figure, its PNG, and axes that stay legible and put.

Public: use_theme, figure, to_png, log_axis (few ticks, plain labels), steady_limits (limits that do
not move while a slider moves the data a little), magnitude (1e5, 100, none), PIXEL_RATIO.
fp8lab.figures.plots draws on these axes.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from fp8lab.figures.png import encode_png
from fp8lab.figures.render import GlyphCacheCanvas

__all__ = ["PIXEL_RATIO", "figure", "log_axis", "magnitude", "steady_limits", "to_png", "use_theme"]

PIXEL_RATIO = 2  # PNGs carry 2x the pixels of their size on the page: sharp on high-DPI screens


def use_theme() -> None:
    """The lab's look: seaborn 'whitegrid', the colour-blind palette, compact fonts."""
    sns.set_theme(style="whitegrid", palette="colorblind", context="notebook", font_scale=0.9)
    # axes.titley fixed: matplotlib otherwise measures every tick label on each draw to
    # place titles clear of top ticks (none here), ~40% of a widget's redraw
    plt.rcParams.update({"figure.dpi": 72, "savefig.dpi": 72, "figure.autolayout": False,
                         "axes.titlesize": 11, "axes.titleweight": "bold", "axes.titley": 1.0})
    try:  # inline notebook figures at 2x pixels too ("retina": shown at half their pixel size)
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("retina")
    except ImportError:  # matplotlib without IPython: nothing inline to configure
        pass


def figure(ncols: int = 1, nrows: int = 1, width: float = 6.0, height: float = 3.2, pyplot: bool = True,
           right: float = 0.6, bottom: float = 0.55, dpi: float | None = None, left: float = 0.85):
    """A new figure and its axes (a list when there are several).

    pyplot=True: through matplotlib.pyplot, so a notebook shows it inline. pyplot=False: a
    bare Figure (no global state; safe from a background thread), as the widgets use, with
    fixed margins (`right` / `bottom` / `left`: inches kept free right of the last axes, e.g. for a
    legend, below the axes, e.g. for rotated tick labels, and left of the first, for its tick labels
    and y label) and `dpi` (default: the theme's 72).
    """
    size = (width * ncols, height * nrows)
    if pyplot:
        fig, axes = plt.subplots(nrows, ncols, figsize=size, squeeze=False, layout="constrained")
    else:
        # fixed margins: the constrained-layout solver would double the time of a redraw
        fig = Figure(figsize=size, dpi=dpi)
        axes = fig.subplots(nrows, ncols, squeeze=False)
        low = min(bottom / size[1], 0.45)
        fig.subplots_adjust(left=left / size[0], right=1 - right / size[0], bottom=low,
                            top=max(1 - 0.35 / size[1], low + 0.2), wspace=0.45, hspace=0.5)
    flat = list(axes.flat)
    return fig, (flat[0] if len(flat) == 1 else flat)


def to_png(fig, keep: bool = False, pixel_ratio: float = 1) -> bytes:
    """Render a figure to PNG bytes at pixel_ratio x its dpi. The panels draw at 2x (PIXEL_RATIO:
    their figures are made at 144 dpi and shown at 72, sharp on high-DPI screens), with Agg
    keeping rendered glyphs (fp8lab.figures.render: the same bytes, half the render time). Encoded as
    RGB, not RGBA (the figure is opaque), by fp8lab.figures.png.encode_png. A panel's figure keeps its
    fp8lab.figures.render.LayeredCanvas (the background kept while it does not change). Unless keep=True
    (a panel that redraws into the same figure), close the figure and clear it: its reference
    cycles go now, not in a slow GC pass."""
    # a pyplot figure keeps its own Agg canvas; a bare one (the panels') gets the glyph cache
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else GlyphCacheCanvas(fig)
    dpi = fig.dpi
    if pixel_ratio != 1:
        fig.set_dpi(dpi * pixel_ratio)
    try:
        canvas.draw()
        rgba = np.asarray(canvas.buffer_rgba())  # (height, width, 4)
    finally:
        if pixel_ratio != 1:
            fig.set_dpi(dpi)
    png = encode_png(rgba)
    if not keep:
        plt.close(fig)
        fig.clear()
    return png


def log_axis(ax, axis: str = "y", base: float = 10) -> None:
    """A log axis with a few major ticks and no minor ones (minor log ticks are slow to draw).

    Call after plotting: where the data span less than about two decades, the ticks include
    2x and 5x (or every integer multiple of) each power, so that a narrow range keeps labels."""
    getattr(ax, f"set_{axis}scale")("log", base=base)
    target = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = sorted(ax.get_ylim() if axis == "y" else ax.get_xlim())
    subs: tuple[float, ...] = (1.0,)
    if base == 10 and 0 < lo < hi:  # the fewest ticks (each costs a redraw time) that still label 2 values
        for candidate in ((1.0,), (1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0, 7.0), tuple(range(1, 10))):
            first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
            inside = [c * 10.0**d for d in range(first, last + 1) for c in candidate if lo <= c * 10.0**d <= hi]
            subs = tuple(float(c) for c in candidate)
            if len(inside) >= 2:
                break
    target.set_major_locator(LogLocator(base=base, subs=subs, numticks=7))
    target.set_minor_locator(NullLocator())
    # plain-text labels ("0.001", "4096"): the default mathtext ones ("10^-3") cost more to
    # lay out than the whole rest of a redraw
    target.set_major_formatter(FuncFormatter(lambda v, _: _tick(v)))


def steady_limits(ax, axis: str = "y", step: float | None = None, lo: float | None = None, hi: float | None = None):
    """Limits that stay put while a slider moves the data a little: the data's range (2% wider),
    rounded out to whole `step`s (a linear axis) or whole decades (a log axis), and widened to
    include [lo, hi] where given; a log axis gets log_axis's ticks for them. A panel whose axes
    stay put keeps its drawn background (ticks, labels, grid: fp8lab.figures.render.LayeredCanvas), and
    the learner sees the data move, not the axes."""
    a, b = (ax.dataLim.intervaly if axis == "y" else ax.dataLim.intervalx)
    a, b = float(min(a, b)), float(max(a, b))
    log = (ax.get_yscale() if axis == "y" else ax.get_xscale()) == "log"
    if log:
        smallest = float(ax.dataLim.minposy if axis == "y" else ax.dataLim.minposx)  # bars start at 0
        a = a if a > 0 else smallest
        a, b = max(a, 1e-300), max(b, a)
        a, b = 10.0 ** math.floor(math.log10(a) - 0.01), 10.0 ** math.ceil(math.log10(b) + 0.01)
    elif step:
        pad = 0.02 * (b - a)
        a, b = step * math.floor((a - pad) / step), step * math.ceil((b + pad) / step)
        if a == b:
            b = a + step
    if lo is not None:
        a = min(a, lo)
    if hi is not None:
        b = max(b, hi)
    (ax.set_ylim if axis == "y" else ax.set_xlim)(a, b)
    if log:
        log_axis(ax, axis)  # its ticks for these limits (log_axis picks them from the limits)
    return ax


def magnitude(v: float) -> str:
    """A magnitude as the lab writes it: 0 -> "none", powers of ten as 1e5, others as %g."""
    if v == 0:
        return "none"
    k = math.log10(abs(v))
    return f"1e{round(k)}" if k == round(k) and abs(k) >= 3 else f"{v:g}"


def _tick(v: float) -> str:
    """A plain tick label: integers as integers (4096, 10000), the rest in 3 digits (0.002, 1e+07)."""
    if v == int(v) and 1 <= abs(v) < 1e6:
        return str(int(v))
    return f"{v:.3g}".replace("e+0", "e").replace("e-0", "e-").replace("e+", "e")
