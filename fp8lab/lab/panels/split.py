"""Notebook 09's fc1 split, shown: which of fc1's GEMMs, kept in high precision, closes NVFP4's gap on the lesson MLP.

Public: fc1_split_table (the shipped runs, fp8lab.training.measured_fp4.split(), or your own fc1_split result, as a
table: each run's final loss, its change against bf16, and the share of NVFP4's gap to bf16 it closes).
"""

from __future__ import annotations

import pandas as pd

from fp8lab.training.measured_fp4 import split
from fp8lab.training.parts import FC1_SPLIT, PartsResult, split_gaps

__all__ = ["fc1_split_table"]

_GAP_OF = {FC1_SPLIT[2].label: "whole", FC1_SPLIT[3].label: "forward", FC1_SPLIT[4].label: "wgrad"}


def fc1_split_table(result: PartsResult | None = None) -> pd.DataFrame:
    """Per run of the fc1 split: "final loss" (the shipped runs: mean of 3 seeds; or `result`'s, one seed), "vs bf16"
    (final loss / bf16's - 1) and "gap closed" ((nvfp4 1x16 - run) / (nvfp4 1x16 - bf16), for the three fc1 runs)."""
    if result is None:

        loss = split().groupby("run", sort=False)[["final loss"]].mean()
    else:
        loss = result.table[["final loss"]]
    gaps = split_gaps(loss)
    out = loss.copy()
    out["vs bf16"] = out["final loss"] / float(out.loc["bf16", "final loss"]) - 1
    out["gap closed"] = [gaps[_GAP_OF[r]] if r in _GAP_OF else float("nan") for r in out.index]
    return out
