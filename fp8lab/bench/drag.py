"""A slider dragged as a learner drags it, in a running kernel: how long until the panel shows each value.

Public: DRAGS, drag_path(options, start, sweeps), drag(panel, control, interval, sweeps) -> dict, drag_all() -> dict.
`bench load` sends this module's source into a notebook's kernel after its Run All (so it runs in
that kernel, under that machine's load, with whatever fp8lab that kernel imported) and calls
drag_all(). A drag sets the control's value every `interval` seconds, sweeping across its options
and back, from the kernel's main thread as the widget messages from the browser do (each value
goes through the control's observer: Panel.request_redraw). A value's latency is the time from
its arrival to the end of the first redraw that started after it (that redraw read it, or a newer
value): when the plot shows it or something newer. The browser's own drawing is not included.
Only the panels' public surface and Panel._refresh (timed by wrapping it) are used.
"""

from __future__ import annotations

import math
import statistics
import time

__all__ = ["DRAGS", "drag", "drag_all", "drag_path"]

# (panel, slider) dragged: notebook 02's per-tensor panel, notebook 04's block panel, notebook 06's sink cliff
DRAGS = (("per_tensor", "outliers"), ("block", "block"), ("training_cliff", "sinks"))


def _options(ctl) -> list:
    return [o[1] if isinstance(o, tuple) else o for o in ctl.options]


def drag_path(options: list, start: int, sweeps: int = 1) -> list:
    """The values a drag from options[start] sends, one per step: to the last option, back to the first, back
    to the start, `sweeps` times (each sweep sends every option twice but the two ends, once).
    drag_path([0, 1, 2, 3, 4], 2) == [3, 4, 3, 2, 1, 0, 1, 2]."""
    path = []
    for _ in range(sweeps):
        path += options[start + 1:] + options[::-1][1:] + options[1:start + 1]
    return path


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def drag(panel, control: str, interval: float = 0.04, sweeps: int = 3) -> dict:
    """Drag `control` of `panel` across its options and back `sweeps` times, one value per `interval`
    seconds; latencies in ms (median, p95, max; `last`: of the final value), redraws made."""
    ctl = panel.controls[control]
    options = _options(ctl)
    path = drag_path(options, options.index(ctl.value) if ctl.value in options else 0, sweeps)
    redraws: list[tuple[float, float]] = []
    original = panel._refresh

    def timed():
        began = time.perf_counter()
        try:
            return original()
        finally:
            redraws.append((began, time.perf_counter()))

    panel._refresh = timed
    try:
        panel.refresh()
        panel.wait_redrawn(60)
        redraws.clear()
        arrivals = []
        due = time.perf_counter()
        for value in path:
            time.sleep(max(0.0, due - time.perf_counter()))
            arrivals.append(time.perf_counter())
            ctl.value = value  # the observer marks the panel stale; a drawing thread redraws
            due += interval
        panel.wait_redrawn(120)
    finally:
        panel._refresh = original
    latencies = []
    for t in arrivals:
        ends = [end for began, end in redraws if began >= t]
        latencies.append((min(ends) - t) * 1e3 if ends else math.inf)
    return {"panel": type(panel).__name__, "control": control, "changes": len(arrivals), "redraws": len(redraws),
            "median_ms": statistics.median(latencies), "p95_ms": _p95(latencies), "max_ms": max(latencies),
            "last_ms": latencies[-1], "redraw_median_ms": statistics.median([(e - b) * 1e3 for b, e in redraws])}


def drag_all(interval: float = 0.04, sweeps: int = 3) -> list[dict]:
    """Each of DRAGS on a new panel (drawn once before the drag, as a notebook shows it)."""
    # the panels load matplotlib and every notebook's panel (measured: 2.3 s of CPU): bench widgets imports this
    # module for its drag table, and only a drag needs them
    from fp8lab.lab.panels import PANELS

    out = []
    for name, control in DRAGS:
        panel = PANELS[name]()
        out.append({"name": name, **drag(panel, control, interval, sweeps)})
    return out
