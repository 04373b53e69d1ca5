"""fp8lab.lab.panels.setup_check: notebook 00's timing panel; what it times and how it names changed settings
(no time is asserted)."""

from __future__ import annotations

import pytest
import torch

from fp8lab.lab.panels import setup_check
from fp8lab.lab.panels.setup_check import TimingPanel
from fp8lab.numerics.recipes import RECIPES
from tests.conftest import gpu


def test_the_panel_shows_the_last_timing_and_names_the_settings_not_yet_timed():
    panel = TimingPanel()
    panel.result = {"times_ms": {"fp32 matmul": 1.0}, "reason": "r", "n": 128, "recipe": "tensorwise",
                    "device": "this CPU"}
    assert panel.compute(n=128, recipe="tensorwise")["pending"] == {}
    d = panel.compute(n=256, recipe="mxfp8")
    assert d["pending"] == {"n": 256, "recipe": "mxfp8"} and d["n"] == 128
    assert set(panel.controls["recipe"].options) == set(RECIPES)


def test_a_measurement_times_fp32_bf16_and_the_recipes_fp8_gemm():
    m = TimingPanel.measure(32, "tensorwise")
    assert (m["n"], m["recipe"]) == (32, "tensorwise")
    names = list(m["times_ms"])
    assert names[:2] == ["fp32 matmul", "bf16 matmul"] and names[2].startswith("FP8 tensorwise (")
    assert m["reason"] and m["device"] == ("this CPU" if not torch.cuda.is_available() else
                                           torch.cuda.get_device_name())


@gpu
@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise"])
def test_on_a_gpu_all_three_gemms_run_there_and_fp8_runs_real(recipe, monkeypatch):
    """On a GPU box the fp32 and bf16 bars are the GPU's too (not the CPU's beside a real FP8 kernel),
    and each timed call is waited for."""
    synced, sync = [], torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synced.append(1) or sync(*a))
    matmuls, real_matmul = [], torch.Tensor.__matmul__
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: matmuls.append(a.device.type) or real_matmul(a, b))
    per_bar, real_timed = [], setup_check.timed

    def spy(fn, repeats=3, warmup=1):  # what each bar's timed calls multiply, and where
        start, out = len(matmuls), real_timed(fn, repeats, warmup)
        per_bar.append(matmuls[start:])
        return out

    monkeypatch.setattr(setup_check, "timed", spy)
    m = TimingPanel.measure(1024, recipe)
    assert m["device"] == torch.cuda.get_device_name() and "(scaled_mm)" in list(m["times_ms"])[2], m
    assert per_bar[:2] == [["cuda"] * 4, ["cuda"] * 4]  # fp32 and bf16: a warm-up and 3 timed calls, on the GPU
    assert len(synced) >= 3 * 4  # every call of the three bars is waited for
    assert TimingPanel().controls["n"].options in ((1024, 2048, 4096, 8192), (64, 128, 256))  # smoke: small
