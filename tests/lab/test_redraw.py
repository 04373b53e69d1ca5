"""fp8lab.lab.redraw: an axes cleared of a drawing draws the pixels a new axes draws (the panels' own pictures
are compared in the widget tests)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from fp8lab.lab.redraw import clear_data, kept_colorbar


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


def test_a_colorbar_is_kept_for_the_next_heatmap():
    fig, ax = plt.subplots()
    assert kept_colorbar(ax) is None
    cbar = fig.colorbar(ax.imshow([[1, 2], [3, 4]]), ax=ax)
    clear_data(ax)
    assert kept_colorbar(ax) is cbar
    plt.close(fig)
