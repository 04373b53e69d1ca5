"""fp8lab.training.measured: the shipped training runs read back, and the summaries computed from them checked
against hand reductions of the rows."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fp8lab.numerics.recipes import RECIPES
from fp8lab.training.measured import (
    cliff,
    cliff_means,
    cliff_rows,
    first_break,
    measured_on,
    mismatch,
    published_means,
    published_runs,
    recovery,
    survivors,
)


def test_every_run_and_seed_of_the_cliff_has_its_no_sink_baseline():
    df = cliff()
    assert list(df.columns) == ["seed", "sinks", "run", "loss", "loss_short"]
    assert len(df) > 0 and (df.loss > 0).all()
    for (run, seed), part in df.groupby(["run", "seed"]):
        assert 0.0 in set(part.sinks), (run, seed)
    assert set(df.run) - {"fp32", "bf16"} <= set(RECIPES)


def test_cliff_means_change_is_the_mean_loss_over_the_no_sink_mean_minus_one():
    df, _, change = cliff_means()
    run, sinks = "tensorwise", 1e6
    rows = df[(df.run == run)]
    at = rows[rows.sinks == sinks].loss.mean()
    clean = rows[rows.sinks == 0.0].loss.mean()
    assert change[run, sinks] == pytest.approx(at / clean - 1, rel=1e-12)
    assert change[run, 0.0] == 0.0


def test_survivors_are_the_recipes_within_the_threshold():
    change = cliff_means()[2]
    for threshold in (0.05, 1.0):
        expected = {r for r in RECIPES if (r, 1e6) in change.index and change[r, 1e6] <= threshold}
        assert survivors(1e6, threshold) == expected
    assert survivors(1e6, 0.05) <= survivors(1e6, 1.0)
    assert "tensorwise" not in survivors(1e6, 0.05)  # notebook 06's cliff: per tensor breaks at 1e6


def test_first_break_is_the_smallest_magnitude_over_the_threshold():
    index = pd.MultiIndex.from_tuples([("a", 0.0), ("a", 10.0), ("a", 100.0), ("a", 1000.0), ("b", 0.0), ("b", 10.0)],
                                      names=["run", "sinks"])
    change = pd.Series([0.0, 0.01, 0.2, 0.1, 0.0, 0.04], index=index)
    assert first_break(change, "a") == 100.0
    assert first_break(change, "b") is None
    assert first_break(change, "a", threshold=0.005) == 10.0


def test_other_placements_and_refusals():
    assert cliff_rows("channels").equals(cliff())
    for placement in ("tokens", "both"):
        rows = cliff_rows(placement)
        assert list(rows.columns) == list(cliff().columns) and len(rows) > 0
        assert measured_on(placement)
    assert measured_on("nowhere") == ""
    with pytest.raises(ValueError, match="unknown placement"):
        cliff_rows("nowhere")


def test_recovery_keeps_never_as_none_and_published_means_by_hand():
    rec = recovery()
    assert list(rec.columns) == ["history", "steps_to_recover"]
    assert all(v is None or isinstance(v, int) for v in rec.steps_to_recover)
    df = published_runs()
    means = published_means()
    (run, sinks), value = next(iter(means.items()))
    part = df[df.run == run]
    expected = part[part.sinks == sinks].loss.mean() / part[part.sinks == 0.0].loss.mean() - 1
    assert value == pytest.approx(expected, rel=1e-12)


@pytest.mark.slow  # constant_loss draws 150 batches per seed (seconds)
def test_mismatch_puts_the_constant_predictor_beside_each_run():
    df = mismatch()
    assert set(df.run) == {"tensorwise", "rowwise", "rowwise_with_gw_hp"}
    assert all(math.isfinite(c) and c > 0 for c in df.constant)
    assert df.groupby("seed").constant.nunique().eq(1).all()  # one constant per seed
