"""fp8lab.lab.panels.split: the fc1 split's table from the shipped runs or a run of your own."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fp8lab.lab.panels.split import fc1_split_table
from fp8lab.training.parts import FC1_SPLIT, PartsResult


def test_a_result_of_your_own_gives_changes_against_bf16_and_the_gaps_closed():
    loss = {"bf16": 1.0, "nvfp4 1x16": 2.0, FC1_SPLIT[2].label: 1.2, FC1_SPLIT[3].label: 2.0,
            FC1_SPLIT[4].label: 1.5}
    result = PartsResult("mlp", 0, None, pd.DataFrame({"final loss": loss}), 0.0)
    t = fc1_split_table(result)
    assert t.loc["nvfp4 1x16", "vs bf16"] == pytest.approx(1.0)
    assert t.loc[FC1_SPLIT[2].label, "gap closed"] == pytest.approx(0.8)
    assert t.loc[FC1_SPLIT[3].label, "gap closed"] == 0.0
    assert t.loc[FC1_SPLIT[4].label, "gap closed"] == pytest.approx(0.5)
    assert math.isnan(t.loc["bf16", "gap closed"])


def test_the_shipped_split_is_the_mean_of_its_seeds():
    from fp8lab.training.measured_fp4 import split

    t = fc1_split_table()
    df = split()
    assert t.loc["bf16", "vs bf16"] == 0.0
    assert t.loc["nvfp4 1x16", "final loss"] == pytest.approx(df[df.run == "nvfp4 1x16"]["final loss"].mean())
