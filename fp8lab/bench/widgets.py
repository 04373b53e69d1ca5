"""`python -m fp8lab bench widgets`: each live panel's redraw time per control change."""

from __future__ import annotations

import statistics

from fp8lab.bench.table import print_table

__all__ = ["bench_widgets"]


# what a live panel must meet per value change: continuous while a slider is dragged
LIVE_MEDIAN_MS, LIVE_P95_MS = 50.0, 100.0


def bench_widgets(rounds: int | None = None, panels: tuple[str, ...] | None = None) -> list[dict]:
    """Time from a control's new value to a finished redraw (compute, draw, Agg render, PNG
    encode), per panel: every value of every control, each control swept from the panel's
    default state, `rounds` times (default 2, each on a new panel: nothing kept from the round
    before), after `fp8lab.setup()` as in the notebooks.
    Live panels (their sliders redraw while dragged) are held to median <= 50 ms and
    p95 <= 100 ms per change; p95 is the value 95% of the updates stay under (nearest rank)."""
    import math
    import time

    import fp8lab
    from fp8lab.lab.panels import PANELS, sweep_values

    fp8lab.setup(quiet=True)  # as the first cell of every notebook does
    rows = []
    unknown = set(panels or ()) - set(PANELS)
    if unknown:
        raise ValueError(f"unknown panels {sorted(unknown)}; valid: {', '.join(PANELS)}")
    for name, make in PANELS.items():
        if panels and name not in panels:
            continue
        times = []
        for _ in range(rounds or 2):
            # a new panel each round: what a panel keeps (curves computed, a background drawn) is
            # measured as a learner meets it, once per value, not as a second pass would find it
            panel = make()
            panel.refresh()
            sweeps = sweep_values(panel)
            defaults = panel.values()
            for control, values in sweeps.items():
                panel.update(**defaults)  # each control from the default state, as the tests sweep
                for value in values:
                    t0 = time.perf_counter()
                    panel.update(**{control: value})
                    times.append(time.perf_counter() - t0)
        times.sort()
        median = statistics.median(times) * 1e3
        p95 = times[min(len(times) - 1, math.ceil(0.95 * len(times)) - 1)] * 1e3
        live = panel.live_sliders
        target = ("met" if median <= LIVE_MEDIAN_MS and p95 <= LIVE_P95_MS else "missed") if live else "-"
        rows.append({"panel": name, "live": "yes" if live else "no (release/button)", "updates": len(times),
                     "median ms": median, "p95 ms": p95, "max ms": times[-1] * 1e3, "live target": target})
    print_table("widget update -> finished redraw (PNG, Agg), every value of every control", rows,
                f"live target: median <= {LIVE_MEDIAN_MS:g} ms and p95 <= {LIVE_P95_MS:g} ms per change")
    return rows
