"""fp8lab.figures.axes: bare figures with their axes, PNG bytes at a pixel ratio, log ticks a reader can read,
limits that round out to whole steps or decades, magnitudes as the lab writes them."""

import struct

import pytest
from matplotlib.ticker import NullLocator

from fp8lab.figures.axes import figure, log_axis, magnitude, steady_limits, to_png


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])  # IHDR: width, height


def test_figure_gives_one_ax_or_a_list_and_to_png_scales_the_pixels():
    fig, axes = figure(ncols=2, width=3.0, height=2.0, pyplot=False, dpi=50)
    assert len(axes) == 2
    assert _png_size(to_png(fig, keep=True)) == (300, 100)  # 6 x 2 inches at 50 dpi
    assert _png_size(to_png(fig, keep=True, pixel_ratio=2)) == (600, 200)
    assert fig.dpi == 50  # restored after the 2x render
    _, ax = figure(pyplot=False)
    assert not isinstance(ax, list)


@pytest.mark.parametrize(("v", "text"), [(0, "none"), (1e5, "1e5"), (1e3, "1e3"), (100, "100"), (1e-3, "1e-3"),
                                         (2.5, "2.5")])
def test_magnitude(v, text):
    assert magnitude(v) == text


def test_steady_limits_round_out_to_whole_steps_and_decades():
    _, ax = figure(pyplot=False)
    ax.plot([0, 1], [0.3, 7.2])
    steady_limits(ax, "y", step=5)
    assert ax.get_ylim() == (0.0, 10.0)  # 0.3 - 2% of 6.9 = 0.162 -> down to 0; 7.2 + 0.138 -> up to 10
    ax.plot([0, 1], [-0.1, 0.0])
    steady_limits(ax, "y", step=5)
    assert ax.get_ylim() == (-5.0, 10.0)
    steady_limits(ax, "y", step=5, lo=-20, hi=40)
    assert ax.get_ylim() == (-20.0, 40.0)
    _, ax2 = figure(pyplot=False)
    ax2.plot([1, 2], [3.0, 450.0])
    ax2.set_yscale("log")
    steady_limits(ax2, "y")
    assert ax2.get_ylim() == pytest.approx((1.0, 1000.0))


def test_log_axis_has_plain_labels_and_no_minor_ticks():
    _, ax = figure(pyplot=False)
    ax.plot([1, 2], [1e-3, 1e4])
    log_axis(ax, "y")
    assert isinstance(ax.yaxis.get_minor_locator(), NullLocator)
    fmt = ax.yaxis.get_major_formatter()
    assert [fmt(v, 0) for v in (1e-3, 4096.0, 1e7)] == ["0.001", "4096", "1e7"]
