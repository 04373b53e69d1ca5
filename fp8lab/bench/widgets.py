"""`python -m fp8lab bench widgets`: each panel's redraw time per change, the changes made as a learner makes them.

Public: LIVE_MEDIAN_MS, LIVE_P95_MS, slider_values(control), changes(panel), bench_widgets(rounds, panels).
A live panel's sliders send their values while dragged: each slider is dragged from the panel's default state
to one end, back to the other and back to where it started (fp8lab.bench.drag.drag_path, as `bench load` drags
in a running kernel), one redraw per value, each value the neighbour of the one before. Its other controls
(dropdowns, boxes, text) and every control of a panel that redraws on release are "clicks": each value once,
each control from the default state. A change's time runs from the new value to the finished redraw (compute,
draw, Agg render, PNG encode), made at once in this thread: the frame rate a drag can reach. Beside the wall time,
the thread's CPU time per change (time.thread_time): on a machine shared with other work it is what the redraw
itself costs, and under a CPU quota of q CPUs it is about q times the wall time.
The live target (median <= 50 ms and p95 <= 100 ms per change) is judged on a live panel's drags, or on its
clicks where it has no slider (each of its changes redraws at once).
"""

from __future__ import annotations

import gc
import math
import statistics
import time

import ipywidgets as W

import fp8lab
from fp8lab.bench.drag import drag_path
from fp8lab.bench.table import print_table
from fp8lab.lab.panels import PANELS, sweep_values

__all__ = ["LIVE_MEDIAN_MS", "LIVE_P95_MS", "bench_widgets", "changes", "slider_values"]


# what a live panel must meet per value change: continuous while a slider is dragged
LIVE_MEDIAN_MS, LIVE_P95_MS = 50.0, 100.0


def slider_values(control: W.Widget) -> list | None:
    """The values a drag of `control` passes, in order along the slider; None for a control that is not a slider.
    A range slider's upper handle is dragged, its lower one stays."""
    if isinstance(control, W.IntRangeSlider):
        low = control.value[0]
        return [(low, high) for high in range(low, control.max + 1, control.step)]
    if isinstance(control, W.SelectionSlider):
        return [o[1] if isinstance(o, tuple) else o for o in control.options]
    if isinstance(control, W.IntSlider):
        return list(range(control.min, control.max + 1, control.step))
    if isinstance(control, W.FloatSlider):
        steps = round((control.max - control.min) / control.step)
        return [control.min + i * control.step for i in range(steps + 1)]
    return None


def changes(panel) -> tuple[dict[str, list], dict[str, list]]:
    """(drags, clicks) of `panel`: {control: the values sent, in order}. Drags: each slider of a live panel,
    from its current value across and back (drag_path). Clicks: every other control's values
    (lab.panels.sweep_values), and every control of a panel whose sliders send their value on release."""
    sweeps = sweep_values(panel)
    drags, clicks = {}, {}
    for name, control in panel.controls.items():
        values = slider_values(control) if panel.live_sliders else None
        if values:
            start = values.index(control.value) if control.value in values else 0
            drags[name] = drag_path(values, start)
        elif name in sweeps:
            clicks[name] = sweeps[name]
    return drags, clicks


def _stats(times: list[float]) -> tuple[float, float, float]:
    """(median, p95, max) in ms; p95: the value 95% of the changes stay under (nearest rank)."""
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return statistics.median(ordered) * 1e3, p95 * 1e3, ordered[-1] * 1e3


def _part_medians(parts: list[dict]) -> dict[str, float | str]:
    """The median CPU ms of each part of a redraw (Panel.cpu_parts) over the changes that drew ("-" where none did)."""
    drew = [p for p in parts if p]
    return {f"{name} ms": statistics.median(p[name] for p in drew) * 1e3 if drew else "-"
            for name in ("compute", "draw", "render")}


def _timed_changes(panel, plan: dict[str, list], defaults: dict) -> tuple[list[float], list[float], list[dict]]:
    """(wall seconds, this thread's CPU seconds, the redraw's CPU parts: Panel.cpu_parts) per change: each control
    of `plan` from the default state, its values one after another."""
    wall, cpu, parts = [], [], []
    for control, values in plan.items():
        if panel.values() != defaults:
            panel.update(**defaults)  # untimed: back to the state the notebook shows first
        for value in values:
            c0, t0 = time.thread_time(), time.perf_counter()
            panel.update(**{control: value})
            wall.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            parts.append(panel.cpu_parts)
    return wall, cpu, parts


def bench_widgets(rounds: int | None = None, panels: tuple[str, ...] | None = None) -> list[dict]:
    """One row per panel (all, or those named in `panels`): its changes (see the module's docstring) `rounds`
    times (default 2), each round on a new panel (nothing kept from the round before: what a panel caches is
    measured as a learner meets it), after `fp8lab.setup()` as in the notebooks. Python's garbage is collected
    before each panel, so one panel's leftovers do not land in another's times."""
    unknown = set(panels or ()) - set(PANELS)
    if unknown:
        raise ValueError(f"unknown panels {sorted(unknown)}; valid: {', '.join(PANELS)}")
    fp8lab.setup(quiet=True)  # as the first cell of every notebook does
    rows = []
    for name, make in PANELS.items():
        if panels and name not in panels:
            continue
        gc.collect()
        drag_times: list[float] = []
        click_times: list[float] = []
        drag_cpu: list[float] = []
        click_cpu: list[float] = []
        drag_parts: list[dict] = []
        click_parts: list[dict] = []
        for _ in range(rounds or 2):
            panel = make()
            panel.refresh()
            defaults = panel.values()
            drags, clicks = changes(panel)
            for plan, times, cpu, parts in ((drags, drag_times, drag_cpu, drag_parts),
                                            (clicks, click_times, click_cpu, click_parts)):
                wall_s, cpu_s, parts_s = _timed_changes(panel, plan, defaults)
                times += wall_s
                cpu += cpu_s
                parts += parts_s
        judged = drag_times or click_times
        median, p95, worst = _stats(judged)
        cpu_median, cpu_p95, _ = _stats(drag_cpu or click_cpu)
        live = make.live_sliders
        target = ("met" if median <= LIVE_MEDIAN_MS and p95 <= LIVE_P95_MS else "missed") if live else "-"
        row = {"panel": name, "live": "yes" if live else "no (release/button)",
               "changes": f"drag {', '.join(drags)}" if drag_times else "clicks", "updates": len(judged),
               "median ms": median, "p95 ms": p95, "max ms": worst, "cpu median ms": cpu_median, "cpu p95 ms": cpu_p95,
               **_part_medians(drag_parts if drag_times else click_parts), "live target": target}
        if drag_times and click_times:
            c_median, c_p95, _ = _stats(click_times)
            row.update({"clicks": len(click_times), "clicks median ms": c_median, "clicks p95 ms": c_p95})
        rows.append(row)
    print_table(f"bench widgets: from a control's new value to the finished redraw (PNG, Agg); a live panel's "
                f"sliders dragged across and back, other controls clicked ({rounds or 2} rounds, a new panel each)",
                rows, f"live target: median <= {LIVE_MEDIAN_MS:g} ms and p95 <= {LIVE_P95_MS:g} ms per change "
                f"(judged on the drags; clicks where a live panel has no slider); a redraw runs with one torch thread; "
                f"cpu: the redraw's own CPU time (time.thread_time), what it costs whatever else the machine runs; "
                f"compute / draw / render: its parts' CPU medians (Panel.cpu_parts: the data, the artists, Agg's "
                f"drawing with the PNG)")
    return rows
