"""fp8lab.training.parts: the NVFP4 recipe's parts as runs (names, the fc1 split's arithmetic, the layers' costs)
and one two-step training of them (the notebook-09 lesson tests train the full runs)."""

from __future__ import annotations

import pandas as pd
import pytest

from fp8lab.numerics.recipes import NVFP4_PARTS
from fp8lab.training.parts import (
    FC1_SPLIT,
    PART_SETS,
    flops_speedup,
    layer_costs,
    part_label,
    split_gaps,
    train_parts,
)


def test_part_sets_are_every_subset_fewest_first():
    assert len(PART_SETS) == 2 ** len(NVFP4_PARTS) and len(set(PART_SETS)) == len(PART_SETS)
    assert PART_SETS[0] == () and PART_SETS[-1] == tuple(NVFP4_PARTS)
    assert [len(p) for p in PART_SETS] == sorted(len(p) for p in PART_SETS)
    assert part_label(()) == "nvfp4 1x16" and part_label(tuple(NVFP4_PARTS)) == "nvfp4 2D+RHT+SR+HP"


def test_split_gaps_is_the_share_of_the_gap_each_run_closes():
    loss = {"bf16": 1.0, "nvfp4 1x16": 2.0, FC1_SPLIT[2].label: 1.0, FC1_SPLIT[3].label: 1.75,
            FC1_SPLIT[4].label: 2.5}
    table = pd.DataFrame({"final loss": loss})
    assert split_gaps(table) == {"whole": 1.0, "forward": 0.25, "wgrad": -0.5}


def test_flops_speedup_is_amdahls_law():
    assert flops_speedup(0.0, 4.0) == 4.0
    assert flops_speedup(1.0, 4.0) == 1.0
    assert flops_speedup(0.25, 2.0) == pytest.approx(1 / (0.25 + 0.75 / 2))


def test_layer_costs_count_three_gemms_of_2mkn_and_the_kept_layers():
    df = layer_costs("mlp", "nvfp4_training")
    assert list(df.index) == ["fc1", "fc2", "fc3"]
    assert df.loc["fc2", "flops"] == 3 * 2 * 128 * 1024 * 1024  # batch 128, 1024 -> 1024
    assert df["share of flops"].sum() == pytest.approx(1.0)
    assert list(df["kept in high precision"]) == [False, False, True]  # the last 15% of the layers: fc3
    assert not layer_costs("mlp", "nvfp4")["kept in high precision"].any()


@pytest.mark.slow  # trains two runs and judges them on 1024 held-out samples (tens of seconds)
def test_two_steps_of_runs_side_by_side_give_a_row_each_and_refuse_a_repeat():
    result = train_parts(("fp32", ()), model="mlp", steps=2)
    assert list(result.table.index) == ["fp32", "nvfp4 1x16"]
    assert len(result.history) == 2 * 2
    fp32 = result.table.loc["fp32"]
    assert fp32["heldout as trained"] == fp32["heldout high precision"]  # no FP8 layer to take out
    with pytest.raises(ValueError, match="each run once"):
        train_parts(("fp32", "fp32"), model="mlp", steps=1)
