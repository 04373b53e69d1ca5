"""fp8lab.lab.panels.fp4_parts: notebook 09's backward-part panels computed without drawing."""

from __future__ import annotations

import pytest

from fp8lab.lab.panels.fp4_parts import BACKWARD_SETS, BackwardOnlyPanel, DepthPanel, SumRoundingPanel, backward_table
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


def test_a_drag_moves_the_drawn_lines_instead_of_drawing_new_ones():
    """Depth and sum-rounding panels: a slider's new value moves the mark and the path on the lines drawn (the
    picture against a fresh drawing: tests/lab/test_widgets.py); another recipe or source draws afresh."""
    depth = DepthPanel()
    depth.update(depth=4)
    ax = depth._figure[1]
    lines = list(ax.lines)
    depth.update(depth=8)
    assert list(ax.lines) == lines
    assert [list(line.get_xdata()) for line in lines if line.get_gid() == "mark"] == [[8, 8]]
    depth.update(recipe="mxfp8")
    assert list(ax.lines) != lines
    sums = SumRoundingPanel()
    sums.update(k=64)
    left, right = sums._figure[1]
    drawn = list(left.lines), list(right.lines)
    sums.update(k=256, steps=1000)
    assert (list(left.lines), list(right.lines)) == drawn
    assert len(right.lines[0].get_xdata()) == 1001 and right.get_xlim()[1] > 1000
    assert [list(line.get_xdata()) for line in left.lines if line.get_gid() == "mark"] == [[256, 256]]
