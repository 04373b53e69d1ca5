"""Redrawing a panel's figure in place: the axes stay, the data is drawn again on them.

Public: clear_data(ax), kept_colorbar(ax), move_bars(bars, heights), move_points(collection, x, y),
move_lines(lines, ys), rescale(ax).
A panel that redraws while a slider moves keeps its
axes (their ticks, tick labels and grid are most of a drawing's cost, and fp8lab.figures.render's
LayeredCanvas keeps their pixels while they do not change) and asks the plot functions, which
know nothing of this, to draw on them again. clear_data takes off what a drawing put on an axes
and puts back what a new axes starts with, so that the drawing that follows gives the pixels it
gives on a new axes (tests/test_widgets.py compares them, plot by plot and panel by panel). Where a
drawing's artists stay and only their data change (bars' heights, a scatter's points), move_bars and
move_points set the data on the artists drawn, as the plot function would have made them.
"""

from __future__ import annotations

import weakref

import matplotlib
import numpy as np
from matplotlib.transforms import Bbox

__all__ = ["clear_data", "kept_colorbar", "move_bars", "move_lines", "move_points", "rescale"]

_colorbars: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # ax -> the Colorbar beside it


def clear_data(ax) -> None:
    """Remove every artist a drawing added to `ax` (lines, collections, patches, images, texts,
    the legend, the containers of bars) and reset what a drawing may have set (scales with their
    default locators and formatters, limits and autoscaling, the theme's grid, axis labels), keeping
    the axes and its tick objects. Titles, tick label sizes and rotation stay as the last drawing left them: the
    plot functions set them on every drawing. A colorbar beside an image stays, for
    kept_colorbar(ax)."""
    for image in ax.images:
        if getattr(image, "colorbar", None) is not None:
            _colorbars[ax] = image.colorbar
    for artist in [*ax.lines, *ax.collections, *ax.patches, *ax.images, *ax.texts, *ax.tables, *ax.artists]:
        artist.remove()
    if ax.legend_ is not None:
        ax.legend_.remove()
    ax.containers.clear()  # (bar containers: their bars are gone above; a legend would still list them)
    ax.set_xscale("linear")  # also the linear scale's locators and formatters, as a new axes has
    ax.set_yscale("linear")
    ax.set_xlabel("")
    ax.set_ylabel("")
    ax.set_aspect("auto")
    rc = matplotlib.rcParams  # the grid a new axes gets from the theme (a heatmap turns it off)
    ax.grid(rc["axes.grid"], which=rc["axes.grid.which"], axis=rc["axes.grid.axis"])
    ax.dataLim.set_points(Bbox.null().get_points())
    ax.set_xlim(0, 1)  # a new axes' limits (not inverted), until the next drawing's data set them
    ax.set_ylim(0, 1)
    ax.set_autoscale_on(True)


def kept_colorbar(ax):
    """The colorbar an earlier drawing put beside `ax` (None if none): the next heatmap draws into it
    (fp8lab.figures.plots' heatmaps take it as `colorbar=`) instead of taking space for a new one."""
    return _colorbars.get(ax)


def move_bars(bars, heights) -> None:
    """Give the vertical bars `bars` (Rectangles from ax.bar, bottoms at 0) these heights, one each."""
    if len(bars) != len(heights):
        raise ValueError(f"{len(bars)} bars, {len(heights)} heights")
    for bar, height in zip(bars, heights, strict=True):
        bar.set_height(height)


def move_points(collection, x, y) -> None:
    """Put the points of `collection` (from ax.scatter, one size and colour for all) at (x, y), as many as given."""
    collection.set_offsets(np.ma.column_stack([np.asarray(x, float), np.asarray(y, float)]))


def move_lines(lines, ys) -> None:
    """Give the lines `lines` (Line2D from ax.plot, their x kept) these y values, one sequence per line, as long as
    its x. A caller whose limits follow the data calls ax.relim() after, as a new drawing's data set them."""
    if len(lines) != len(ys):
        raise ValueError(f"{len(lines)} lines, {len(ys)} sets of y values")
    for line, y in zip(lines, ys, strict=True):
        y = np.asarray(y, dtype=float)
        if len(y) != len(line.get_xdata()):
            raise ValueError(f"{len(y)} y values for a line of {len(line.get_xdata())} points")
        line.set_ydata(y)


def rescale(ax) -> None:
    """The limits of `ax` from the data its lines, patches and images hold now, as a drawing of them on a new axes
    autoscales them (after move_bars, or a line's set_data, moved the data's range). Collections (scatter,
    fill_between) are not counted (matplotlib's relim leaves them out): not for an axes whose limits they set."""
    ax.relim()
    ax.autoscale_view()
