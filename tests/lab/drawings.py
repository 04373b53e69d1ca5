"""What the panel tests count: whole_drawings(panel) records each whole drawing a panel makes (a redraw in place is
not one)."""

from __future__ import annotations


def whole_drawings(panel) -> list:
    """One entry (1) per whole drawing `panel` makes from now on; a redraw in place (draw_in_place) adds none."""
    calls: list = []
    panel.draw = lambda data, axes, draw=panel.draw: (calls.append(1), draw(data, axes))[1]
    return calls
