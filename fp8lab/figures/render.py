"""Agg rendering for the panels: a cache of rendered glyphs, a kept background (their PNG: fp8lab.figures.png).

Public: GlyphCacheCanvas (a FigureCanvasAgg whose renderer keeps each string's layout and each
glyph's bitmap), LayeredCanvas (the panels' canvas: the background kept while it does not change),
glyph_cache_stats(), status() (whether each speed-up is on, and why not). Text is most
of a panel's Agg time, and a glyph's pixels do not depend on the pixels around it: the cache keys a
bitmap by everything matplotlib renders it from (font file and face, size, dpi, hinting, the
rotation matrix and the position's fraction of a pixel); a glyph moved by whole pixels is the same
bitmap moved. It also keeps each font's line height (ascent, descent and line gap from its
tables, which matplotlib reads again for every text it lays out: each tick label, each time).
The kept background's drawing lays each axis' ticks out once (_lay_out_once).
The PNGs are byte for byte those of plain Agg (tests/test_widgets.py compares every panel).
Both speed-ups rest on private matplotlib APIs, each reached through one function below
(PRIVATE_APIS); a self-test renders with and without each speed-up on first use, and any missing or
changed API, or any pixel that differs, turns that speed-up off for the process: plain Agg draws,
and status() says why.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager

import matplotlib as mpl
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg, get_hinting_flag
from matplotlib.figure import Figure
from matplotlib.font_manager import fontManager, get_font
from matplotlib.transforms import Bbox

__all__ = ["KEPT_BACKGROUNDS", "PRIVATE_APIS", "GlyphCacheCanvas", "LayeredCanvas", "glyph_cache_stats", "status"]

KEPT_BACKGROUNDS = 4  # per canvas (a panel's figure at 2x: about 2 MB each)
_MAX_ENTRIES = 20_000  # glyph bitmaps (a few hundred bytes each) and layouts; cleared whole when full
_layouts: dict[tuple, list[tuple]] = {}
_glyphs: dict[tuple, tuple[np.ndarray, int, int]] = {}
_heights: dict[tuple, tuple[float, float, float]] = {}  # font and size -> (ascent, descent, line gap) in pixels
_FONT_LISTS = ("font.serif", "font.sans-serif", "font.cursive", "font.fantasy", "font.monospace")
_stats = {"glyph hits": 0, "glyph misses": 0}
_lock = threading.Lock()


# -- the private matplotlib APIs used here, each reached through one function ---------------------


def _prepare_font(renderer, prop):  # RendererAgg._prepare_font: the FT2Font for a FontProperties
    return renderer._prepare_font(prop)


def _text_features(mtext) -> tuple:  # Text.get_fontfeatures / get_language (matplotlib 3.11)
    return (mtext.get_fontfeatures(), mtext.get_language()) if mtext is not None else (None, None)


def _layout(font, s: str, flags, features, language) -> list[tuple]:  # FT2Font._layout
    items = font._layout(s, flags=flags, features=features, language=language)
    return [(item.ft_object, item.glyph_index, item.x, item.y) for item in items]


def _render_glyph(ft, glyph_index: int, flags, matrix, offset, antialiased: bool):
    """FT2Font._set_transform and FT2Font._render_glyph (with ft2font.RenderMode): one glyph's bitmap."""
    from matplotlib.ft2font import RenderMode

    ft._set_transform(matrix, offset)  # the fraction of a pixel only
    return ft._render_glyph(glyph_index, flags, RenderMode.NORMAL if antialiased else RenderMode.MONO)


def _font_files(prop) -> list:  # FontManager._find_fonts_by_props: the fonts Text._get_layout measures
    return fontManager._find_fonts_by_props(prop)


def _blit(renderer, buffer, left: int, top: int, gc) -> None:  # RendererAgg._renderer.draw_text_image
    renderer._renderer.draw_text_image(buffer, left, top, 0, gc)


def _tick_kw(axis, which: str = "major") -> dict:  # Axis._major_tick_kw / _minor_tick_kw
    return axis._major_tick_kw if which == "major" else axis._minor_tick_kw


def _made_ticks(axis, which: str = "major") -> list:
    """The ticks an axis has made so far (Axis.majorTicks is a lazy list that makes them when read)."""
    return axis.__dict__.get("majorTicks" if which == "major" else "minorTicks", [])


def _place_titles(ax, renderer) -> None:  # Axes._update_title_position, as Axes.draw calls it
    ax._update_title_position(renderer)


def _update_ticks(axis) -> list:  # Axis._update_ticks: the ticks in view, placed and labelled at the limits
    return type(axis)._update_ticks(axis)


def _ticklabel_bboxes(axis, ticks, renderer) -> tuple[list, list]:  # Axis._get_ticklabel_bboxes
    return type(axis)._get_ticklabel_bboxes(axis, ticks, renderer)


def _lay_out_once(axis, laid: dict) -> None:
    """Within one drawing, `axis` lays its ticks out once: Axis.draw, Axis.get_tightbbox, the axis label's
    placement (Axis._get_tick_boxes_siblings) and Spine.get_window_extent each place and label the ticks in
    view and measure their labels again (three to six times an axis a drawing) with the same limits, locator
    and formatter, so to the same result. Answered again from `laid` while those are unchanged (instance
    attributes over Axis' methods, removed after the drawing: LayeredCanvas._draw_layers)."""
    def update() -> list:
        key = (tuple(axis.get_view_interval()), axis.major.locator, axis.major.formatter, axis.minor.locator,
               axis.minor.formatter)
        if laid.get("key") != key:
            laid.clear()
            laid["key"], laid["ticks"] = key, _update_ticks(axis)
        return laid["ticks"]

    def bboxes(ticks, renderer) -> tuple[list, list]:
        key = (id(ticks), id(renderer))  # (the ticks and the renderer kept below: their ids stay theirs)
        if key not in laid:
            laid[key] = (_ticklabel_bboxes(axis, ticks, renderer), ticks, renderer)
        return laid[key][0]

    axis._update_ticks, axis._get_ticklabel_bboxes = update, bboxes


PRIVATE_APIS = {  # speed-up -> the functions above it needs (tests/test_widgets.py breaks each one)
    "glyph cache": ("_prepare_font", "_text_features", "_layout", "_render_glyph", "_blit", "_font_files"),
    "kept background": ("_tick_kw", "_made_ticks", "_place_titles", "_update_ticks", "_ticklabel_bboxes"),
}
_status: dict[str, tuple[bool, str]] = {}  # speed-up -> (on, why), decided once per process


def _turn_off(speedup: str, err: BaseException) -> None:
    _status[speedup] = (False, f"off: {type(err).__name__}: {str(err)[:160]} (plain Agg draws instead)")


def glyph_cache_stats() -> dict[str, int]:
    """Hits and misses of the glyph cache since the process started, and its size."""
    return {**_stats, "glyphs": len(_glyphs), "layouts": len(_layouts), "line heights": len(_heights)}


def _face(ft) -> tuple:
    return (ft.fname, ft.face_index)


class _GlyphCacheRenderer(RendererAgg):
    """RendererAgg.draw_text with the layout and the glyphs' bitmaps kept (plain text only;
    mathtext and TeX as Agg draws them), and each font's line height kept."""

    def _get_font_height_metrics(self, prop):
        """(ascent, descent, line gap) in pixels at this renderer's dpi (the figure's: get_renderer makes a
        new renderer when it changes) of the font Text._get_layout measures a line by, from its OS/2 or hhea
        table; matplotlib asks a renderer that has this method, and (None, None, None) lets it compute them."""
        if not _status.get("glyph cache", (True, ""))[0]:
            return None, None, None
        size = prop.get_size_in_points()
        key = (tuple(prop.get_family()), prop.get_style(), prop.get_variant(), prop.get_weight(), prop.get_stretch(),
               size, prop.get_file(), self.dpi, tuple(tuple(mpl.rcParams[k]) for k in _FONT_LISTS))
        hit = _heights.get(key)
        if hit is None:
            try:
                font = get_font(_font_files(prop))
            except Exception as err:  # a matplotlib whose private APIs moved: plain Agg from now on
                _turn_off("glyph cache", err)
                return None, None, None
            hit = (None, None, None)
            for table_name, gap, ascent, descent in (("OS/2", "sTypoLineGap", "sTypoAscender", "sTypoDescender"),
                                                     ("hhea", "lineGap", "ascent", "descent")):
                table = font.get_sfnt_table(table_name)
                if table is not None:  # (the same expression as Text._get_layout's: the same float)
                    scale = 1 / font.get_sfnt_table("head")["unitsPerEm"] * size * self.dpi / 72
                    hit = (table[ascent] * scale, -table[descent] * scale, table[gap] * scale)
                    break
            with _lock:
                if len(_heights) >= _MAX_ENTRIES:
                    _heights.clear()
                _heights[key] = hit
        return hit

    def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if ismath or not _status.get("glyph cache", (True, ""))[0]:
            return super().draw_text(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)
        try:
            self._draw_text_kept(gc, x, y, s, prop, angle, mtext)
        except Exception as err:  # a matplotlib whose private APIs moved: plain Agg from now on
            _turn_off("glyph cache", err)
            super().draw_text(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

    def _draw_text_kept(self, gc, x, y, s, prop, angle, mtext) -> None:
        features, language = _text_features(mtext)
        flags = get_hinting_flag()
        size = prop.get_size_in_points()
        key = (tuple(prop.get_family()), prop.get_style(), prop.get_variant(), prop.get_weight(), prop.get_stretch(),
               size, prop.get_file(), prop.get_math_fontfamily(), self.dpi, s, str(flags),
               tuple(features) if features is not None else None, language)
        layout = _layouts.get(key)
        if layout is None:
            layout = _layout(_prepare_font(self, prop), s, flags, features, language)
            with _lock:
                if len(_layouts) >= _MAX_ENTRIES:
                    _layouts.clear()
                _layouts[key] = layout
        # as RendererAgg._draw_text_glyphs_and_boxes: y is downwards, a glyph's dy upwards
        cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        matrix = (0x10000 * np.array([[cos, -sin], [sin, cos]]) @ [[1, 0], [0, 1]]).round().astype(int)
        mkey = tuple(int(v) for v in matrix.flat)
        antialiased = gc.get_antialiased()
        height = self.height
        for ft, glyph_index, dx, dy in layout:
            tx = round(0x40 * (x + dx * cos - dy * sin))  # FreeType's 1/64 pixel, y upwards
            ty = round(0x40 * (height - y + dx * sin + dy * cos))
            gkey = (_face(ft), size, self.dpi, glyph_index, mkey, tx & 63, ty & 63, antialiased, str(flags))
            hit = _glyphs.get(gkey)
            if hit is None:
                ft.set_size(size, self.dpi)
                bitmap = _render_glyph(ft, glyph_index, flags, matrix, [tx & 63, ty & 63], antialiased)
                buffer = np.array(bitmap.buffer, copy=True)
                if not antialiased:
                    buffer *= 0xff
                hit = (buffer, bitmap.left, bitmap.top)
                with _lock:
                    if len(_glyphs) >= _MAX_ENTRIES:
                        _glyphs.clear()
                    _glyphs[gkey] = hit
                _stats["glyph misses"] += 1
            else:
                _stats["glyph hits"] += 1
            buffer, left, top = hit
            left, top = left + (tx >> 6), top + (ty >> 6)  # whole pixels move the bitmap, nothing else
            _blit(self, buffer, left, int(height) - top + buffer.shape[0], gc)


class GlyphCacheCanvas(FigureCanvasAgg):
    """FigureCanvasAgg whose renderer keeps rendered glyphs (see the module docstring)."""

    def get_renderer(self):
        if not status()["glyph cache"][0]:
            return super().get_renderer()
        w, h = self.get_width_height(physical=True)
        key = w, h, self.figure.dpi
        if getattr(self, "_glyph_key", None) != key or not isinstance(getattr(self, "renderer", None),
                                                                        _GlyphCacheRenderer):
            self.renderer = _GlyphCacheRenderer(w, h, self.figure.dpi)
            self._glyph_key = key
        return self.renderer


# -- layers: what changes with a slider over a background kept while it does not ----------------

def _axis_key(axis) -> tuple:
    """What an axis draws, without drawing it: scale, limits, tick positions and their labels as
    the formatter writes them, the label, tick and grid settings, and the label styles of the ticks
    it will draw (set_xticks(..., fontsize=, rotation=) sets those on the tick objects). The axis
    draws one tick per position: those made so far, then new ones that copy the first one's styles
    (Axis.get_major_ticks), so the key is the same before the first drawing makes them and after."""
    locs = tuple(np.asarray(axis.get_majorticklocs(), float).tolist())
    labels = tuple(axis.major.formatter.format_ticks(list(locs))) if locs else ()
    minor = tuple(np.asarray(axis.get_minorticklocs(), float).tolist())
    made = _made_ticks(axis)  # only those already made: making ticks is the cost
    ticks = made[:len(locs)] + made[:1] * max(0, len(locs) - len(made))
    label = axis.label
    return (axis.get_visible(), axis.get_scale(), tuple(axis.get_view_interval()), locs, labels,
            axis.major.formatter.get_offset() if hasattr(axis.major.formatter, "get_offset") else "",
            minor, repr(sorted(_tick_kw(axis).items())), repr(sorted(_tick_kw(axis, "minor").items())),
            label.get_text(), label.get_fontsize(), label.get_color(), label.get_visible(), axis.get_label_position(),
            tuple((t.label1.get_fontsize(), t.label1.get_rotation(), t.label1.get_color(), t.label1.get_visible(),
                   t.label2.get_visible(), t.tick1line.get_visible(), t.gridline.get_visible()) for t in ticks))


def _grid_on(axis) -> bool:
    """Whether the axis draws grid lines (inside the axes, where the data is). Without them an
    axis draws outside the axes only (ticks point out in the theme), so an image under it (a
    heatmap, zorder 0) may be drawn after it: the pixels are the same."""
    kw = _tick_kw(axis)
    if "gridOn" in kw:
        return bool(kw["gridOn"])
    rc = mpl.rcParams
    return bool(rc["axes.grid"]) and rc["axes.grid.which"] in ("major", "both") and \
        rc["axes.grid.axis"] in ("both", axis.axis_name)


def _handle_key(handle) -> tuple:
    props = []
    for getter in ("get_color", "get_facecolor", "get_edgecolor", "get_linestyle", "get_linewidth", "get_marker",
                   "get_alpha", "get_hatch"):
        if hasattr(handle, getter):
            value = getattr(handle, getter)()
            props.append(repr(np.asarray(value).round(6).tolist()) if isinstance(value, np.ndarray) else repr(value))
    return (type(handle).__name__, *props)


def _legend_key(legend, renderer) -> tuple:
    return (tuple(t.get_text() for t in legend.get_texts()), tuple(_handle_key(h) for h in legend.legend_handles),
            tuple(legend.get_window_extent(renderer).bounds), legend.get_frame_on(), legend.get_visible())


@contextmanager
def _hidden(artists):
    """The artists invisible inside the block, as they were after it."""
    visible = [a.get_visible() for a in artists]
    for a in artists:
        a.set_visible(False)
    try:
        yield
    finally:
        for a, v in zip(artists, visible, strict=True):
            a.set_visible(v)


class LayeredCanvas(GlyphCacheCanvas):
    """An Agg canvas that keeps a figure's background while a slider moves.

    A panel's figure is drawn in two layers. The background: the figure and axes patches and the
    axes' ticks, tick labels, grid and axis labels (matplotlib draws these first, under the data:
    the theme has axes.axisbelow). The foreground: every other artist (data, spines, titles,
    texts) in matplotlib's order, legends last, each pasted from an image of it rendered once.
    The background is drawn again only when what it shows changes (its key: figure size, each
    axes' position, scales, limits, tick positions and labels as formatted, label texts and tick
    settings); otherwise its pixels are restored and only the foreground is drawn. The last
    KEPT_BACKGROUNDS backgrounds are kept, each under its key: a control that goes back to an
    earlier value (a recipe list toggled, a slider dragged back) restores that one. The first
    layer is most of a redraw (axes, ticks and legends take most of Agg's time in the lab's
    panels). `keep=False` draws both layers every time (the reference that tests/test_widgets.py
    compares the kept background against, byte for byte).

    Figures this cannot layer exactly (an artist below the axis, e.g. zorder < 0.5) are drawn
    whole, as FigureCanvasAgg draws them."""

    def __init__(self, figure, keep: bool = True, glyphs: bool = True) -> None:
        super().__init__(figure)
        self.keep, self.glyphs = keep, glyphs
        self._background = None  # (figure part, axes parts, each axes' region, BufferRegion)
        self._earlier: list[tuple] = []  # backgrounds before it, newest first, each as _background
        self._sprites: dict[tuple, tuple[np.ndarray, int, int]] = {}  # legend key -> (rgba, x, y)
        self.stats = {"kept": 0, "partly": 0, "drawn": 0, "whole": 0}

    def get_renderer(self):
        if self.glyphs:
            return super().get_renderer()
        return FigureCanvasAgg.get_renderer(self)

    def _layers(self):
        """(foreground, legends): the artists drawn over the background, as (axes or None, artist),
        and the legends; None where the figure cannot be layered exactly."""
        fig = self.figure
        front, legends = [], []
        for ax in sorted(fig.axes, key=lambda a: a.get_zorder()):
            # what Axes.draw leaves out: the axis without axison, the spines and patch without a frame too
            axis_z = min(ax.xaxis.get_zorder(), ax.yaxis.get_zorder())
            grid = _grid_on(ax.xaxis) or _grid_on(ax.yaxis)
            skipped = [] if ax.axison else [ax.xaxis, ax.yaxis]
            if not (ax.axison and ax.get_frame_on()):
                skipped += list(ax.spines.values())
            below = [ax.patch] + ([ax.xaxis, ax.yaxis] if ax.axison else [])
            rest = [a for a in ax.get_children() if a.get_visible() and not any(a is b for b in below + skipped)]
            for a in rest:
                if a is ax.legend_:
                    legends.append(a)
                elif isinstance(a, type(ax)) or (a.get_zorder() < axis_z and grid):
                    return None  # under a grid (or an inset axes): only a whole draw is exact
                else:
                    front.append((ax, a))
        for a in fig.get_children():
            if a is fig.patch or a in fig.axes or not a.get_visible():
                continue
            if a in fig.legends:
                legends.append(a)
            else:
                front.append((None, a))
        return front, legends

    def _background_key(self, renderer) -> tuple[tuple, list[tuple]]:
        """(the figure's part, one part per axes): what the background shows."""
        fig = self.figure
        figure_part = (tuple(fig.bbox.bounds), fig.dpi, repr(fig.patch.get_facecolor()), len(fig.axes))
        return figure_part, [(tuple(ax.get_position().bounds), ax.axison, ax.get_frame_on(),
                              repr(ax.patch.get_facecolor()), ax.patch.get_visible(), ax.get_axisbelow(),
                              _axis_key(ax.xaxis), _axis_key(ax.yaxis)) for ax in fig.axes]

    @staticmethod
    def _region(ax, renderer):
        """Where an axes' background lies: its box, what each axis will draw at its current limits
        (Axis.get_tightbbox lays out the ticks in view, their labels, the axis label and offset as
        Axis.draw does, so it holds before a drawing too), and the tick marks' length around the
        box, 3 px wider."""
        boxes = [ax.bbox]
        for axis in (ax.xaxis, ax.yaxis) if ax.axison else ():
            if not axis.get_visible():
                continue
            tight = axis.get_tightbbox(renderer)
            if tight is not None:
                boxes.append(tight)
            # the marks' reach out of the box, on the sides that have them (tick1: bottom or left)
            ticks = [*_made_ticks(axis), *_made_ticks(axis, "minor")]
            below = max((renderer.points_to_pixels(t.tick1line.get_markersize()) for t in ticks
                         if t.tick1line.get_visible()), default=0.0)
            above = max((renderer.points_to_pixels(t.tick2line.get_markersize()) for t in ticks
                         if t.tick2line.get_visible()), default=0.0)
            x0, y0, x1, y1 = ax.bbox.extents
            boxes.append(Bbox.from_extents(x0 - below, y0, x1 + above, y1) if axis is ax.yaxis else
                         Bbox.from_extents(x0, y0 - below, x1, y1 + above))
        return Bbox.union(boxes).padded(3)

    def _redraw_axes(self, renderer, changed: list[int], regions: list, hidden) -> bool:
        """Draw the background of the `changed` axes again over the kept one, with every axes whose
        region overlaps theirs (and those overlapping these, and so on): each one's region (for a
        changed one, its old and new extent) cleared to the figure's face, then each one's patch and
        axis drawn again in the figure's order. A pixel in a cleared region gets the face and every
        axes whose region holds it, in order, as in a whole drawing; a pixel outside them is kept.
        False (nothing drawn) where that takes every axes: a whole drawing costs the same."""
        axes = self.figure.axes
        new = list(regions)
        for i in changed:
            new[i] = Bbox.union([regions[i], self._region(axes[i], renderer)])
        redrawn, grown = set(changed), True
        while grown:  # the closure: regions that overlap one already in
            more = {j for j in range(len(axes)) if j not in redrawn and any(new[j].overlaps(new[i]) for i in redrawn)}
            redrawn, grown = redrawn | more, bool(more)
        if len(redrawn) == len(axes):
            return False
        patch = self.figure.patch
        clip = patch.get_clip_box()
        for i in redrawn:  # the figure's face, inside these regions only
            box = new[i].frozen()
            patch.set_clip_box(Bbox.from_extents(math.floor(box.x0), math.floor(box.y0), math.ceil(box.x1),
                                                 math.ceil(box.y1)))
            patch.draw(renderer)
        patch.set_clip_box(clip)
        with _hidden(hidden):
            for i in sorted(redrawn, key=lambda i: axes[i].get_zorder()):  # (stable: the figure's order on ties)
                ax = axes[i]
                if ax.axison and ax.get_frame_on():
                    ax.patch.draw(renderer)
                if ax.axison:
                    for axis in sorted((ax.xaxis, ax.yaxis), key=lambda a: a.get_zorder()):
                        axis.draw(renderer)
        for i in redrawn:
            regions[i] = new[i]
        return True

    def draw(self):
        if not status()["kept background"][0]:
            self.stats["whole"] += 1
            return super().draw()
        try:
            self._draw_layers()
        except Exception as err:  # a matplotlib whose private APIs moved: whole drawings from now on
            _turn_off("kept background", err)
            self._background, self._earlier = None, []
            self.stats["whole"] += 1
            super().draw()

    def _draw_layers(self) -> None:
        axes = [axis for ax in self.figure.axes for axis in (ax.xaxis, ax.yaxis)] if self.keep else []
        for axis in axes:  # each axis lays its ticks out once (keep=False: as matplotlib does, the reference)
            _lay_out_once(axis, {})
        try:
            self._draw_in_layers()
        finally:
            for axis in axes:
                del axis._update_ticks, axis._get_ticklabel_bboxes

    def _draw_in_layers(self) -> None:
        layers = self._layers()
        if layers is None:
            self.stats["whole"] += 1
            self._background, self._earlier = None, []
            super().draw()
            return
        front, legends = layers
        renderer = self.get_renderer()
        figure_part, axes_parts = self._background_key(renderer)
        hidden = [a for _, a in front] + legends
        self.stats[self._background_layer(renderer, figure_part, axes_parts, hidden)] += 1
        for ax in self.figure.axes:  # as Axes.draw does, with the titles shown: titles clear of top ticks
            _place_titles(ax, renderer)
        for ax, artist in sorted(front, key=lambda pair: pair[1].get_zorder()):
            if ax is None:
                artist.draw(renderer)
            else:
                ax.draw_artist(artist)
        for legend in legends:
            self._paste_legend(legend, renderer)

    def _background_layer(self, renderer, figure_part: tuple, axes_parts: list[tuple], hidden) -> str:
        """Put the background in the buffer: kept, kept with some axes drawn again, or drawn whole;
        says which."""
        kept = self._background if self.keep else None
        earlier = next((i for i, bg in enumerate(self._earlier) if bg[:2] == (figure_part, axes_parts)), None)
        if kept is not None and kept[:2] != (figure_part, axes_parts) and earlier is not None:
            self._background = self._earlier.pop(earlier)  # a value shown before: the newest again
            self._earlier.insert(0, kept)
            self.restore_region(self._background[3])
            return "kept"
        if kept is not None and kept[0] == figure_part:
            _, old_parts, regions, pixels = kept
            changed = [i for i, (old, now) in enumerate(zip(old_parts, axes_parts, strict=True)) if old != now]
            self.restore_region(pixels)
            if not changed:
                return "kept"
            regions = None if regions is None else list(regions)  # (the new background's: the kept one keeps its)
            if regions is not None and len(changed) < len(axes_parts) and \
                    self._redraw_axes(renderer, changed, regions, hidden):
                self._keep_background((figure_part, axes_parts, regions, self.copy_from_bbox(self.figure.bbox)))
                return "partly"
        with _hidden(hidden):
            super().draw()
        if self.keep:  # each axes' region, where one of several may be drawn again alone
            regions = [self._region(ax, renderer) for ax in self.figure.axes] if len(axes_parts) > 1 else None
            self._keep_background((figure_part, axes_parts, regions, self.copy_from_bbox(self.figure.bbox)))
        return "drawn"

    def _keep_background(self, background: tuple) -> None:
        """Make `background` the current one; the one it replaces joins the earlier ones (the oldest dropped)."""
        if self._background is not None:
            self._earlier = [self._background, *self._earlier][:KEPT_BACKGROUNDS - 1]
        self._background = background

    def _paste_legend(self, legend, renderer) -> None:
        """Draw the legend from an image of it drawn alone (kept per legend key)."""
        key = _legend_key(legend, renderer)
        sprite = self._sprites.get(key) if self.keep else None
        if sprite is None:
            box = legend.get_window_extent(renderer).padded(2)
            height = int(renderer.height)
            x0, x1 = max(0, math.floor(box.x0)), min(int(renderer.width), math.ceil(box.x1))
            y0, y1 = max(0, math.floor(box.y0)), min(height, math.ceil(box.y1))
            scratch = RendererAgg(int(renderer.width), height, renderer.dpi) if not self.glyphs else \
                _GlyphCacheRenderer(int(renderer.width), height, renderer.dpi)
            scratch.clear()  # transparent
            legend.draw(scratch)
            # rows bottom-up, as RendererAgg.draw_image takes them
            pixels = np.asarray(scratch.buffer_rgba())[height - y1:height - y0, x0:x1][::-1].copy()
            sprite = (pixels, x0, y0)
            if self.keep:
                if len(self._sprites) > 64:
                    self._sprites.clear()
                self._sprites[key] = sprite
        pixels, x0, y0 = sprite
        gc = renderer.new_gc()
        renderer.draw_image(gc, x0, y0, pixels)
        gc.restore()


def status() -> dict[str, tuple[bool, str]]:
    """Whether each speed-up ("glyph cache", "kept background") is on, and why not. The first call
    runs each one's self-test: draw a small figure with it and without it; any exception or any
    pixel that differs turns it off for the process."""
    for speedup, probe in (("glyph cache", _probe_glyphs), ("kept background", _probe_layers)):
        if speedup not in _status:
            try:
                same = probe()
            except Exception as err:
                _turn_off(speedup, err)
                continue
            _status.setdefault(speedup, (True, "on (its self-test drew the same pixels as plain Agg)") if same else
                               (False, "off: its self-test drew other pixels than plain Agg (plain Agg draws instead)"))
    return dict(_status)


def _probe_figure():
    fig = Figure(figsize=(3.0, 1.6), dpi=100)
    axes = fig.subplots(1, 2)
    for i, ax in enumerate(axes):
        ax.plot([1, 2, 3], [3, 1 + i, 2], label=f"run {i}")
        ax.set_title(f"probe {i}: Ag 0.5 dB" + "\nline two" * i)  # (two lines: the line gap)
        ax.set_xlabel("log2 |x|")
        ax.set_xticks([1, 2, 3], ["1e-3", "0.5", "448"], rotation=90 * i)
        ax.legend(fontsize=7)
    return fig, axes


def _probe_glyphs() -> bool:
    """Text drawn by the glyph cache (twice: laid out, then from the cache) and by plain Agg."""
    with _lock:  # from empty caches: every private API runs
        _layouts.clear()
        _glyphs.clear()
        _heights.clear()
    fig, _ = _probe_figure()
    plain = FigureCanvasAgg(fig)
    plain.draw()
    reference = np.asarray(plain.buffer_rgba()).copy()
    w, h = plain.get_width_height(physical=True)
    for _ in range(2):
        renderer = _GlyphCacheRenderer(w, h, fig.dpi)
        fig.draw(renderer)
        if not np.array_equal(np.asarray(renderer.buffer_rgba()), reference):
            return False
    return True


def _probe_layers() -> bool:
    """A figure drawn in layers, its data moved and drawn again over the kept background, against the
    same figure drawn whole in the same two layers."""
    fig, axes = _probe_figure()
    kept = LayeredCanvas(fig, glyphs=False)
    kept._draw_layers()  # (it makes the ticks: the background's key is the same before and after)
    axes[0].lines[0].set_ydata([2, 3, 1])
    kept._draw_layers()
    shown = np.asarray(kept.buffer_rgba()).copy()
    whole = LayeredCanvas(fig, keep=False, glyphs=False)
    whole._draw_layers()
    return kept.stats["kept"] == 1 and np.array_equal(shown, np.asarray(whole.buffer_rgba()))
