"""fp8lab.lab.panels.fp4: notebook 09's parts panel read from the shipped runs (the other fp4 panels' pictures are
swept in the widget tests)."""

from __future__ import annotations

import pytest

from fp8lab.lab.panels.fp4 import PartsPanel
from fp8lab.training.measured_fp4 import parts


def test_the_checkboxes_name_the_run_and_its_change_is_each_seed_against_its_bf16():
    panel = PartsPanel()
    assert PartsPanel.parts_of(True, False, True, False) == ("2d_weights", "stochastic_rounding")
    d = panel.compute(two_d=True, hadamard=False, stochastic=True, high=False, measure="final loss")
    assert d["label"] == "nvfp4 2D+SR"
    df = parts()
    by = df[df.model == "mlp"].pivot_table(index="seed", columns="run", values="final loss")
    rel = by["nvfp4 2D+SR"] / by["bf16"] - 1
    assert d["values"]["nvfp4 2D+SR"] == pytest.approx(float(rel.mean()), rel=1e-12)
    assert d["values"]["bf16"] == 0.0
    assert list(d["values"])[:2] == ["nvfp4 1x16", "nvfp4 2D+SR"]
    none = panel.compute(two_d=False, hadamard=False, stochastic=False, high=False, measure="final loss")
    assert none["label"] == "nvfp4 1x16" and list(none["values"]).count("nvfp4 1x16") == 1
