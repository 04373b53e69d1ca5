"""fp8lab.training.measured_fp4: notebook 09's shipped runs read back (retrained and compared in the notebook-09
lesson tests), and means() checked against a hand reduction."""

from __future__ import annotations

import pytest

from fp8lab.training.measured_fp4 import (
    COLUMNS,
    backward_runs,
    dy_control_runs,
    dy_runs,
    layer_runs,
    means,
    parts,
    split,
)


@pytest.mark.parametrize("frame", [parts, split, backward_runs, dy_runs, dy_control_runs])
def test_each_shipped_frame_has_the_columns_and_finite_positive_losses(frame):
    df = frame()
    assert list(df.columns) == COLUMNS and len(df) > 0
    assert (df[COLUMNS[3:]] > 0).all().all()
    per_run = df.groupby(["model", "run"]).seed.nunique()
    assert per_run.min() == per_run.max()  # every run has the same seeds


def test_means_average_over_seeds_in_first_order():
    df = parts()
    m = means(df, "mlp")
    first = df.run.iloc[0]
    assert m.index[0] == first
    assert m.loc[first, "final loss"] == pytest.approx(df[df.run == first]["final loss"].mean(), rel=1e-12)
    both = means(dy_runs())
    assert both.index.names == ["model", "run"]


def test_the_layer_runs_keep_one_layer_each():
    assert layer_runs() == ("nvfp4 1x16, fc1 in bf16", "nvfp4 1x16, fc2 in bf16", "nvfp4 1x16, fc3 in bf16")
    shipped = set(parts().run)
    assert set(layer_runs()) <= shipped
