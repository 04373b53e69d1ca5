"""fp8lab.figures.render's speed-ups rest on private matplotlib APIs: each one, missing or changed,
turns its speed-up off and plain Agg draws the same panel, never an error (PRIVATE_APIS names them)."""

import io

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from PIL import Image

from fp8lab.figures import render
from fp8lab.lab.panels import PerTensorPanel

ACCESSORS = [(speedup, name) for speedup, names in render.PRIVATE_APIS.items() for name in names]


@pytest.fixture
def fresh_status(monkeypatch):
    """The speed-ups decided again in this test (and as before after it)."""
    monkeypatch.setattr(render, "_status", {})
    return render


def _panel_pixels() -> tuple[np.ndarray, np.ndarray]:
    """A panel drawn twice (a slider moved): the pixels it showed, and plain Agg's drawing of its figure."""
    panel = PerTensorPanel()
    panel.update(outliers=1e5)
    panel.update(margin=1)
    shown = np.asarray(Image.open(io.BytesIO(panel.image.value)).convert("RGBA"))
    fig = panel._figure[0]
    plain = FigureCanvasAgg(fig)
    plain.draw()
    return shown, np.asarray(plain.buffer_rgba())


def test_both_speed_ups_pass_their_self_tests_here(fresh_status):
    assert all(on for on, _ in render.status().values()), render.status()


@pytest.mark.parametrize("speedup, name", ACCESSORS, ids=[n for _, n in ACCESSORS])
def test_a_missing_private_api_turns_its_speed_up_off_and_plain_agg_draws(fresh_status, monkeypatch, speedup, name):
    def missing(*args, **kwargs):
        raise AttributeError(f"matplotlib has no {name} here")

    monkeypatch.setattr(render, name, missing)
    on, why = render.status()[speedup]
    assert not on and "AttributeError" in why, why
    shown, plain = _panel_pixels()
    differ = (np.abs(plain.astype(int) - shown.astype(int)).max(-1) > 8).mean()
    assert differ < 0.02, f"{differ:.1%} of the pixels differ from plain Agg"  # the layers' own order aside


def test_a_private_api_that_changes_what_it_returns_is_caught_by_the_pixels(fresh_status, monkeypatch):
    original = render._layout
    monkeypatch.setattr(render, "_layout", lambda *a, **k: original(*a, **k)[:-1])  # one glyph short
    on, why = render.status()["glyph cache"]
    assert not on and "other pixels" in why, why


def test_a_private_api_that_breaks_after_the_self_test_falls_back_mid_run(fresh_status, monkeypatch):
    assert render.status()["glyph cache"][0] and render.status()["kept background"][0]

    def gone(*args, **kwargs):
        raise AttributeError("gone")

    monkeypatch.setattr(render, "_blit", gone)
    monkeypatch.setattr(render, "_place_titles", gone)
    shown, plain = _panel_pixels()  # no error: both fall back while drawing
    assert not render.status()["glyph cache"][0] and not render.status()["kept background"][0]
    assert (np.abs(plain.astype(int) - shown.astype(int)).max(-1) > 8).mean() < 0.02


def test_the_first_change_after_the_first_drawing_keeps_the_background():
    """The first drawing makes the ticks (one per position); the background's key counts the ticks that will be
    drawn, not those made so far, so the first slider move pastes the kept background instead of drawing it
    again, and its pixels are a whole drawing's."""
    fig, axes = render._probe_figure()
    kept = render.LayeredCanvas(fig, glyphs=False)
    kept._draw_layers()
    axes[0].lines[0].set_ydata([2, 3, 1])
    kept._draw_layers()
    assert (kept.stats["drawn"], kept.stats["kept"]) == (1, 1)
    whole = render.LayeredCanvas(fig, keep=False, glyphs=False)
    whole._draw_layers()
    assert np.array_equal(np.asarray(kept.buffer_rgba()), np.asarray(whole.buffer_rgba()))


def test_a_tick_styled_alone_after_the_first_drawing_draws_the_background_again():
    """A style set on one tick that the first drawing made (not the first tick, whose styles new ticks copy)
    changes the key: the background is drawn again, with the pixels of a whole drawing."""
    fig, axes = render._probe_figure()
    kept = render.LayeredCanvas(fig, glyphs=False)
    kept._draw_layers()
    axes[1].xaxis.get_major_ticks()[2].label1.set_color("red")
    kept._draw_layers()
    assert (kept.stats["drawn"], kept.stats["kept"]) == (2, 0)
    whole = render.LayeredCanvas(fig, keep=False, glyphs=False)
    whole._draw_layers()
    assert np.array_equal(np.asarray(kept.buffer_rgba()), np.asarray(whole.buffer_rgba()))


@pytest.mark.parametrize("dpi", [72, 100, 137])
def test_kept_line_heights_lay_text_out_as_matplotlib_does(fresh_status, dpi):
    """Texts of one and three lines (spaced by the font's line gap, "normal", and by factors), sizes, weights
    and families laid out by the glyph cache's renderer (line heights kept) and by plain Agg's: the same boxes
    to the last bit, laid out twice (from an empty cache and from the kept heights)."""
    assert render.status()["glyph cache"][0]
    fig = Figure(figsize=(3, 2), dpi=dpi)
    texts = [fig.text(0.1, 0.1 + 0.1 * i, "Ag 0.5 dB" + "\nline\nline" * (i in (1, 2, 3)), size=size, weight=weight,
                      family=family, linespacing=spacing)
             for i, (size, weight, family, spacing) in enumerate(
                 [(7, "normal", "sans-serif", None), (9, "bold", "sans-serif", 1.4),
                  (12.5, "normal", "serif", "normal"), (10, "light", "monospace", 2),
                  (8, "normal", "DejaVu Sans", None)])]
    w, h = int(fig.bbox.width), int(fig.bbox.height)
    plain = [t.get_window_extent(RendererAgg(w, h, dpi)).bounds for t in texts]
    render._heights.clear()
    for _ in range(2):
        kept = render._GlyphCacheRenderer(w, h, dpi)
        assert [t.get_window_extent(kept).bounds for t in texts] == plain
    assert len(render._heights) == 5


def _crowded_figure():
    """Three axes in a row; the first two so close that the second's tick labels and axis label reach into
    the first's region, the third well apart."""
    fig = Figure(figsize=(6.0, 2.0), dpi=100)
    axes = [fig.add_axes(box) for box in ((0.08, 0.2, 0.22, 0.7), (0.34, 0.2, 0.22, 0.7), (0.75, 0.2, 0.22, 0.7))]
    for i, ax in enumerate(axes):
        ax.plot([0, 1, 2], [0, 1 + i, 4])
        ax.set_ylabel(f"value {i}")
    return fig, axes


@pytest.mark.parametrize("moved", [0, 1, 2])
def test_a_redrawn_axes_takes_the_axes_whose_regions_overlap_it_along(moved):
    """Axes whose regions overlap are drawn again together (their regions cleared first, then each one's
    background in the figure's order): new limits on one of them keeps the far one's background, and the pixels
    are a whole drawing's."""
    fig, axes = _crowded_figure()
    kept = render.LayeredCanvas(fig, glyphs=False)
    kept._draw_layers()
    regions = kept._background[2]
    assert regions[0].overlaps(regions[1]) and not regions[1].overlaps(regions[2])
    axes[moved].set_ylim(-1000, 100000)  # wider tick labels: its region grows
    kept._draw_layers()
    assert kept.stats["partly"] == 1, kept.stats
    whole = render.LayeredCanvas(fig, keep=False, glyphs=False)
    whole._draw_layers()
    assert np.array_equal(np.asarray(kept.buffer_rgba()), np.asarray(whole.buffer_rgba()))


def test_when_overlapping_regions_take_every_axes_the_figure_is_drawn_whole():
    fig, axes = _crowded_figure()
    axes[2].set_position((0.6, 0.2, 0.22, 0.7))  # now the third one's labels reach the second's region
    kept = render.LayeredCanvas(fig, glyphs=False)
    kept._draw_layers()
    axes[0].set_ylim(-1000, 100000)
    kept._draw_layers()
    assert kept.stats["drawn"] == 2, kept.stats


def _draw_kept_as_whole(kept, fig, what) -> None:
    """Draw `fig` on its kept canvas and assert the pixels are a whole drawing's (then the kept canvas is the
    figure's again)."""
    kept._draw_layers()
    whole = render.LayeredCanvas(fig, keep=False, glyphs=False)
    whole._draw_layers()
    assert np.array_equal(np.asarray(kept.buffer_rgba()), np.asarray(whole.buffer_rgba())), what
    fig.set_canvas(kept)


def test_ticks_laid_out_once_a_drawing_are_laid_out_again_at_new_limits():
    """Within a drawing each axis answers its tick layout and label boxes from the first time it laid them out
    (LayeredCanvas._draw_layers), while its limits, locator and formatter stay: new limits lay them out again.
    A kept drawing of figures with aligned labels (the label's placement measures its siblings' ticks) is a whole
    drawing's, pixel for pixel, and leaves no instance attribute behind."""
    fig, axes = _crowded_figure()
    fig.align_ylabels(axes)
    axis = axes[0].yaxis
    render._lay_out_once(axis, {})
    try:
        first = axis._update_ticks()
        assert axis._update_ticks() is first  # the same layout, answered again
        renderer = render.LayeredCanvas(fig, glyphs=False).get_renderer()
        assert axis._get_ticklabel_bboxes(first, renderer) is axis._get_ticklabel_bboxes(first, renderer)
        axes[0].set_ylim(-1000, 100000)
        again = axis._update_ticks()
        labels = [t.label1.get_text() for t in again]
        boxes = [b.bounds for b in axis._get_ticklabel_bboxes(again, renderer)[0]]
        assert boxes == [b.bounds for b in type(axis)._get_ticklabel_bboxes(axis, again, renderer)[0]]
        assert [b.bounds for b in axis._get_ticklabel_bboxes(again[1:2], renderer)[0]] == boxes[1:2]  # those asked
    finally:
        del axis._update_ticks, axis._get_ticklabel_bboxes
    assert labels == [t.label1.get_text() for t in axis._update_ticks()]  # matplotlib's own, at the new limits
    kept = render.LayeredCanvas(fig, glyphs=False)
    for ylim in ((-5, 5), (0, 3e4)):
        axes[1].set_ylim(*ylim)
        _draw_kept_as_whole(kept, fig, ylim)
    assert kept.stats["partly"] == 1, kept.stats
    assert not any("_update_ticks" in vars(a) for ax in axes for a in (ax.xaxis, ax.yaxis))


def test_a_background_shown_before_is_restored_and_the_oldest_is_dropped():
    """The last KEPT_BACKGROUNDS backgrounds are kept, each under its key: limits that go back to an earlier value
    restore that background (no drawing), with a whole drawing's pixels; one more new background drops the
    oldest, which is drawn again when it comes back."""
    fig, axes = render._probe_figure()
    kept = render.LayeredCanvas(fig, glyphs=False)
    limits = [(0, 4 + i) for i in range(render.KEPT_BACKGROUNDS)]
    for ylim in limits + limits[::-1][1:]:  # across, then back: every way back is kept
        axes[0].set_ylim(*ylim)
        _draw_kept_as_whole(kept, fig, ylim)
    n = render.KEPT_BACKGROUNDS
    assert kept.stats["kept"] == n - 1 and kept.stats["drawn"] + kept.stats["partly"] == n, kept.stats
    axes[0].set_ylim(0, 99)  # one more: the oldest kept one (limits[-1], shown first on the way back) is dropped
    kept._draw_layers()
    before = dict(kept.stats)
    axes[0].set_ylim(*limits[-1])
    kept._draw_layers()
    assert kept.stats["kept"] == before["kept"], kept.stats
