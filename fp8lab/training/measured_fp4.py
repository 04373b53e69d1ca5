"""Training runs shipped with notebook 09: too slow to train while it runs.

Public: parts() (the lesson MLP with NVFP4 and every subset of its training recipe's parts, beside fp32, bf16 and
MXFP8; and NVFP4 with one chosen layer kept in high precision), backward_runs() (NVFP4 in the backward GEMMs only,
with and without the parts), dy_runs() (the four FP8 choices for the gradients, on the lesson MLP and notebook 08's
LLM-like model), dy_control_runs() (their control: blockwise's forward, dy unquantized), split() (the fc1 split:
fc1's forward against its weight gradient in high precision, fp8lab.training.parts.FC1_SPLIT), means(frame),
layer_recipes(), backward_recipes(), PARTS_ON, BACKWARD_ON, DY_ON, DY_CONTROL_ON, SPLIT_ON. The rows are data files,
fp8lab/training/runs/fp4_*.json (fp8lab.training.shipped); `python -m fp8lab measured_fp4 --write` trains them
again (fp8lab.harness.measure_fp4; --part one table, --jobs seeds side by side).
Every row: final loss (mean of the last 10 training steps), the held-out loss as trained, and the held-out loss of
the trained weights with a high-precision forward (fp8lab.training.parts.train_parts).
tests/notebooks/test_fp4_lessons.py trains seed 0 again and compares; fp8lab.lab's notebook-09 panels, answers
and exercise read these.
"""

from __future__ import annotations

from fp8lab.numerics.recipes import NVFP4_PARTS, Recipe, nvfp4_with
from fp8lab.training.parts import KeepLayers
from fp8lab.training.shipped import read_table

__all__ = ["BACKWARD_ON", "COLUMNS", "DY_CONTROL_ON", "DY_ON", "PARTS_ON", "SPLIT_ON", "backward_recipes",
           "backward_runs", "dy_control_runs", "dy_runs", "layer_recipes", "layer_runs", "means", "parts", "split"]

COLUMNS = ["model", "seed", "run", "final loss", "heldout as trained", "heldout high precision"]

# the machine each shipped table was measured on (fp8lab.timing.machine_line), its rows in fp8lab/training/runs/
PARTS_ON = read_table("fp4_parts").measured_on
DY_ON = read_table("fp4_dy").measured_on
SPLIT_ON = read_table("fp4_split").measured_on
BACKWARD_ON = read_table("fp4_backward").measured_on
DY_CONTROL_ON = read_table("fp4_dy_control").measured_on


def _frame(name: str):
    import pandas as pd  # a heavy dependency: imported where a table is read, not when fp8lab is

    rows = read_table(name).rows
    if not rows:
        raise ValueError("fp8lab.training.measured_fp4 holds no results: run `python -m fp8lab measured_fp4 --write`")
    return pd.DataFrame(list(rows), columns=COLUMNS)


def parts():
    """The parts runs: DataFrame with COLUMNS (model "mlp", seeds 0-2)."""
    return _frame("fp4_parts")


def split():
    """The fc1 split (fp8lab.training.parts.FC1_SPLIT on the lesson MLP, seeds 0-2): DataFrame with COLUMNS."""
    return _frame("fp4_split")


def backward_runs():
    """The backward-only runs (NVFP4 in dgrad and wgrad, the forward GEMM in high precision; no parts, each part
    alone, all four) beside bf16: DataFrame with COLUMNS (model "mlp", seeds 0-2)."""
    return _frame("fp4_backward")


def dy_control_runs():
    """The control for the gradient runs: blockwise's forward, dgrad and wgrad in high precision (dy unquantized),
    on the lesson MLP and notebook 08's LLM-like model: DataFrame with COLUMNS."""
    return _frame("fp4_dy_control")


def backward_recipes() -> tuple[Recipe, ...]:
    """The recipes of backward_runs() but bf16: NVFP4 in the backward GEMMs only, with no part, each part, all four."""
    sets = ((), *((p,) for p in NVFP4_PARTS), tuple(NVFP4_PARTS))
    return tuple(nvfp4_with(s).with_backward_only() for s in sets)


def dy_runs():
    """The gradient runs (fp32 and the four dy choices, forward as blockwise): DataFrame with COLUMNS."""
    return _frame("fp4_dy")


def means(frame, model: str | None = None):
    """Per run (and model), the mean over seeds of each loss column, runs in their first order."""
    df = frame if model is None else frame[frame.model == model]
    keys = ["run"] if model is not None else ["model", "run"]
    return df.groupby(keys, sort=False)[COLUMNS[3:]].mean()


def layer_recipes() -> tuple[KeepLayers, ...]:
    """NVFP4 (1x16, no parts) with one layer of the lesson MLP kept in high precision: fc1, fc2, fc3."""
    plain = nvfp4_with([])
    return tuple(KeepLayers(f"nvfp4 1x16, {layer} in bf16", plain, (layer,)) for layer in ("fc1", "fc2", "fc3"))


def layer_runs() -> tuple[str, ...]:
    """The runs of NVFP4 (1x16, no parts) with one layer of the lesson MLP kept in high precision, by label."""
    return tuple(r.label for r in layer_recipes())
