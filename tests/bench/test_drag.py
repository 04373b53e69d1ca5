"""fp8lab.bench.drag: the path a drag sends (its docstring's example), and the latencies it reads from a panel
whose redraws it can see (a stand-in panel that redraws at once; no time is asserted)."""

import math

from fp8lab.bench.drag import drag, drag_path


def test_drag_path_goes_to_the_end_back_to_the_start_and_home():
    assert drag_path([0, 1, 2, 3, 4], 2) == [3, 4, 3, 2, 1, 0, 1, 2]
    assert drag_path(["a", "b", "c"], 0, sweeps=2) == ["b", "c", "b", "a"] * 2
    # each sweep sends every option twice, the two ends once
    assert len(drag_path(list(range(7)), 3)) == 2 * 7 - 2


class _Control:
    def __init__(self, panel, options, value):
        self.panel, self.options, self._value = panel, options, value

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, v):
        self._value = v
        self.panel.refresh()  # a synchronous redraw: it starts after the value arrived


class _Panel:
    def __init__(self):
        self.drawn = []
        self.controls = {"block": _Control(self, [("1x16", 16), ("1x32", 32), ("1x128", 128)], 32)}

    def _refresh(self):
        self.drawn.append(self.controls["block"].value)

    def refresh(self):
        self._refresh()

    def wait_redrawn(self, timeout):
        return True


def test_drag_counts_each_change_and_its_redraw():
    panel = _Panel()
    out = drag(panel, "block", interval=0.0, sweeps=1)
    assert panel.drawn[1:] == [128, 32, 16, 32]  # after the first draw: the option values along the path
    assert out["panel"] == "_Panel" and out["control"] == "block"
    assert out["changes"] == 4 and out["redraws"] == 4
    assert all(math.isfinite(out[k]) and out[k] >= 0 for k in ("median_ms", "p95_ms", "max_ms", "last_ms"))
    assert out["max_ms"] >= out["p95_ms"] >= 0 and out["max_ms"] >= out["median_ms"]
    assert panel._refresh.__func__ is _Panel._refresh  # the timing wrapper is taken off again
