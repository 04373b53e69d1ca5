"""fp8lab.lab.panels.setup_check: notebook 00's timing panel; what it times and how it names changed settings
(no time is asserted)."""

from __future__ import annotations

from fp8lab.lab.panels.setup_check import TimingPanel
from fp8lab.numerics.recipes import RECIPES


def test_the_panel_shows_the_last_timing_and_names_the_settings_not_yet_timed():
    panel = TimingPanel()
    panel.result = {"times_ms": {"fp32 matmul": 1.0}, "reason": "r", "n": 128, "recipe": "tensorwise"}
    assert panel.compute(n=128, recipe="tensorwise")["pending"] == {}
    d = panel.compute(n=256, recipe="mxfp8")
    assert d["pending"] == {"n": 256, "recipe": "mxfp8"} and d["n"] == 128
    assert set(panel.controls["recipe"].options) == set(RECIPES)


def test_a_measurement_times_fp32_bf16_and_the_recipes_fp8_gemm():
    m = TimingPanel.measure(32, "tensorwise")
    assert (m["n"], m["recipe"]) == (32, "tensorwise")
    names = list(m["times_ms"])
    assert names[:2] == ["fp32 matmul", "bf16 matmul"] and names[2].startswith("FP8 tensorwise (")
    assert m["reason"]
