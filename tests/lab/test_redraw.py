"""fp8lab.lab.redraw: an axes cleared of a drawing draws the pixels a new axes draws (the panels' own pictures
are compared in the widget tests)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from fp8lab.lab.redraw import clear_data, kept_colorbar, move_bars, rescale


def _draw(ax) -> None:
    ax.plot([1, 2, 3], [1, 4, 9], label="y")
    ax.set_xlabel("x")
    ax.legend()


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=50)
    return buf.getvalue()


def test_a_cleared_axes_redraws_as_a_new_one():
    fig_new, ax_new = plt.subplots()
    _draw(ax_new)
    fig_old, ax_old = plt.subplots()
    ax_old.imshow([[1, 2], [3, 4]])
    ax_old.set_yscale("log")  # what the next drawing does not set
    ax_old.set_ylabel("old")
    ax_old.text(0, 0, "old")
    ax_old.set_xlim(5, 6)
    clear_data(ax_old)
    assert not ax_old.images and not ax_old.texts and ax_old.get_yscale() == "linear"
    _draw(ax_old)
    assert _png(fig_old) == _png(fig_new)
    plt.close(fig_new)
    plt.close(fig_old)


def test_bars_cleared_leave_no_entry_in_the_next_legend():
    """A legend lists the axes' bar containers: clearing the bars clears their containers too, so bars drawn
    again on the cleared axes give a new axes' legend (one entry per label), not the last drawing's entries too."""
    def bars(ax):
        ax.bar([0, 1], [1, 2], color="C0", label="fprop")
        ax.bar([0.4, 1.4], [2, 1], color="C1", label="wgrad")
        ax.legend()

    fig_new, ax_new = plt.subplots()
    bars(ax_new)
    fig_old, ax_old = plt.subplots()
    bars(ax_old)
    clear_data(ax_old)
    assert not ax_old.containers
    bars(ax_old)
    assert [t.get_text() for t in ax_old.get_legend().get_texts()] == ["fprop", "wgrad"]
    assert _png(fig_old) == _png(fig_new)
    plt.close(fig_new)
    plt.close(fig_old)


def test_a_colorbar_is_kept_for_the_next_heatmap():
    fig, ax = plt.subplots()
    assert kept_colorbar(ax) is None
    cbar = fig.colorbar(ax.imshow([[1, 2], [3, 4]]), ax=ax)
    clear_data(ax)
    assert kept_colorbar(ax) is cbar
    plt.close(fig)


def test_bars_moved_and_rescaled_get_the_limits_a_new_drawing_gets():
    fig, ax = plt.subplots()
    bars = ax.bar([0, 1, 2], [1.0, 2.0, 3.0])
    ax.plot([0, 2], [0.5, 0.5])
    ax.get_ylim()  # the limits of the first drawing, set
    move_bars(bars, [4.0, 9.0, 2.0])
    rescale(ax)
    fig_new, ax_new = plt.subplots()
    ax_new.bar([0, 1, 2], [4.0, 9.0, 2.0])
    ax_new.plot([0, 2], [0.5, 0.5])
    assert ax.get_ylim() == ax_new.get_ylim() and ax.get_ylim()[1] > 9
    assert ax.get_xlim() == ax_new.get_xlim()
    plt.close(fig)
    plt.close(fig_new)
