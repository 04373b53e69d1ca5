"""fp8lab.lab.panels.fp4_parts: notebook 09's backward-part panels computed without drawing."""

from __future__ import annotations

import pytest

from fp8lab.lab.panels.fp4_parts import BACKWARD_SETS, BackwardOnlyPanel, backward_table
from fp8lab.training.measured_fp4 import backward_runs


def test_the_backward_table_is_each_seed_against_its_own_bf16_then_the_mean():
    t = backward_table("final loss")
    assert list(t.index) == list(BACKWARD_SETS)
    df = backward_runs()
    df = df[df.model == "mlp"]
    by = df.pivot_table(index="seed", columns="run", values="final loss")
    rel = by["nvfp4 1x16 backward"] / by["bf16"] - 1
    assert t.loc["none", ("vs bf16", "backward only")] == pytest.approx(float(rel.mean()), rel=1e-12)
    assert t.loc["none", ("spread", "backward only")] == pytest.approx(float(rel.max() - rel.min()) / 2, rel=1e-12)


def test_the_panel_reads_the_measure_it_is_given():
    d = BackwardOnlyPanel().compute(measure="heldout high precision")
    assert d["table"].equals(backward_table("heldout high precision"))
