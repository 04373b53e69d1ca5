"""Agg rendering for the panels: matplotlib's Agg canvas with a cache of rendered glyphs.

Public: GlyphCacheCanvas (a FigureCanvasAgg), glyph_cache_stats(). A panel's redraw spends
most of its Agg time on text (measured 2026-11-30: ~60% of a render is FreeType laying out
and rasterizing the same tick labels and titles again), and its pixels do not depend on the
pixels around them. This canvas keeps each string's layout and each glyph's bitmap, keyed
by everything matplotlib renders them from (font file and face, size, dpi, hinting, the
rotation matrix and the position's fraction of a pixel, in FreeType's 1/64 units); a glyph
moved by whole pixels is the same bitmap moved. The PNGs are byte for byte those of plain
Agg (tests/test_widgets.py compares every panel). Used by fp8lab.plots.to_png.
"""

from __future__ import annotations

import math
import threading

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg, get_hinting_flag
from matplotlib.ft2font import RenderMode

__all__ = ["GlyphCacheCanvas", "glyph_cache_stats"]

_MAX_ENTRIES = 20_000  # glyph bitmaps (a few hundred bytes each) and layouts; cleared whole when full
_layouts: dict[tuple, list[tuple]] = {}
_glyphs: dict[tuple, tuple[np.ndarray, int, int]] = {}
_stats = {"glyph hits": 0, "glyph misses": 0}
_lock = threading.Lock()
# the private Agg methods this renderer stands in for: if a matplotlib lacks them, plain Agg draws
SUPPORTED = all(hasattr(RendererAgg, m) for m in ("_prepare_font", "_draw_text_glyphs_and_boxes", "draw_text"))


def glyph_cache_stats() -> dict[str, int]:
    """Hits and misses of the glyph cache since the process started, and its size."""
    return {**_stats, "glyphs": len(_glyphs), "layouts": len(_layouts)}


def _face(ft) -> tuple:
    return (ft.fname, ft.face_index)


class _GlyphCacheRenderer(RendererAgg):
    """RendererAgg.draw_text with the layout and the glyphs' bitmaps kept (plain text only;
    mathtext and TeX as Agg draws them)."""

    def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if ismath:
            return super().draw_text(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)
        features = mtext.get_fontfeatures() if mtext is not None else None
        language = mtext.get_language() if mtext is not None else None
        flags = get_hinting_flag()
        size = prop.get_size_in_points()
        key = (tuple(prop.get_family()), prop.get_style(), prop.get_variant(), prop.get_weight(), prop.get_stretch(),
               size, prop.get_file(), prop.get_math_fontfamily(), self.dpi, s, str(flags),
               tuple(features) if features is not None else None, language)
        layout = _layouts.get(key)
        if layout is None:
            font = self._prepare_font(prop)
            items = font._layout(s, flags=flags, features=features, language=language)
            layout = [(item.ft_object, item.glyph_index, item.x, item.y) for item in items]
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
                ft._set_transform(matrix, [tx & 63, ty & 63])  # the fraction of a pixel only
                bitmap = ft._render_glyph(glyph_index, flags, RenderMode.NORMAL if antialiased else RenderMode.MONO)
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
            self._renderer.draw_text_image(buffer, left, int(height) - top + buffer.shape[0], 0, gc)


class GlyphCacheCanvas(FigureCanvasAgg):
    """FigureCanvasAgg whose renderer keeps rendered glyphs (see the module docstring)."""

    def get_renderer(self):
        if not SUPPORTED:
            return super().get_renderer()
        w, h = self.get_width_height(physical=True)
        key = w, h, self.figure.dpi
        if self._lastKey != key or not isinstance(getattr(self, "renderer", None), _GlyphCacheRenderer):
            self.renderer = _GlyphCacheRenderer(w, h, self.figure.dpi)
            self._lastKey = key
        return self.renderer
