"""Training results shipped with the lab: too slow to compute while notebook 06 runs.

Public: cliff() (final loss against sink magnitude per recipe and seed), cliff_means() (its means and changes
against the no-sink runs), survivors() (the recipes that hold), first_break(), recovery() (steps the delayed recipe
needs after fc1's input drops, per amax history length), mismatch() (tensorwise, rowwise and rowwise_with_gw_hp with
sinks at 1e6, beside a constant predictor: why rowwise fails), published_runs() and published_means() (the cliff's
runs at the massive-activation ratio that Sun et al. publish, fp8lab.training.published, beside runs without sinks),
flush_costs() and with_trained_loss() (why a flushed share costs what it costs), cliff_rows(placement) (the cliff
with the sinks in every token, or in a few tokens), measured_on(placement), and the machine lines MEASURED_ON,
MISMATCH_ON, PUBLISHED_ON, FLUSH_ON, TOKENS_ON, BOTH_ON.
The rows are data files, fp8lab/training/runs/*.json (fp8lab.training.shipped); `python -m fp8lab measured --write`
measures them again (fp8lab.harness.measure). tests/notebooks/test_lessons.py recomputes some of them live and compares.
Notebook 06 plots them and lets the learner recompute one point; fp8lab.exercises grades 06's exercises against them.
"""

from __future__ import annotations

import math

from fp8lab.numerics.recipes import RECIPES
from fp8lab.training.lesson import constant_loss
from fp8lab.training.models import PLACEMENTS
from fp8lab.training.shipped import read_table

__all__ = ["BOTH_ON", "CLIFF_COLUMNS", "FLUSH_ON", "MEASURED_ON", "MISMATCH_ON", "MISMATCH_RUNS", "MISMATCH_SINKS",
           "PUBLISHED_ON", "PUBLISHED_RATIO", "TOKENS_ON", "TOKEN_RUNS", "TOKEN_SEEDS", "cliff", "cliff_means",
           "cliff_rows", "first_break", "flush_costs", "measured_on", "mismatch", "published_means", "published_runs",
           "recovery", "survivors", "with_trained_loss"]

MISMATCH_RUNS = ("tensorwise", "rowwise", "rowwise_with_gw_hp")  # notebook 06: why rowwise fails
MISMATCH_SINKS = 1e6
PUBLISHED_RATIO = 1e5  # Sun et al.'s "e.g., 100,000 times larger" (fp8lab.training.published): trained there
# the token sinks' cliff (placement "tokens"), and both kinds of sinks' ("both"): fewer seeds, sink values and runs
# than the channel cliff (delayed scales as tensorwise does here; nvfp4 is left out), with the massive-activation
# ratio's sinks among the values
TOKEN_SEEDS = 2
TOKEN_RUNS = ("fp32", "tensorwise", "rowwise", "blockwise", "mxfp8")
CLIFF_COLUMNS = ["seed", "sinks", "run", "loss", "loss_short"]

# the machine each shipped table was measured on (fp8lab.timing.machine_line)
MEASURED_ON = read_table("cliff").measured_on  # the channel cliff and the delayed recovery
MISMATCH_ON = read_table("mismatch").measured_on
PUBLISHED_ON = read_table("published").measured_on
FLUSH_ON = read_table("flush").measured_on
TOKENS_ON = read_table("tokens").measured_on
BOTH_ON = read_table("both").measured_on


def _frame(name: str, columns: list[str] | None = None, **kwargs):
    import pandas as pd  # a heavy dependency: imported where a table is read, not when fp8lab is

    table = read_table(name)
    return pd.DataFrame(list(table.rows), columns=columns or list(table.columns), **kwargs)


def cliff():
    """Final losses: DataFrame with columns seed, sinks, run, loss (mean of the last 10 of
    150 steps), loss_short (mean of steps 20-29: what a 30-step run ends at)."""
    return _frame("cliff", CLIFF_COLUMNS)


def cliff_rows(placement: str = "channels"):
    """cliff() for the sinks at `placement` (fp8lab.training.models.PLACEMENTS): "channels" is cliff() (3 seeds),
    "tokens" the token sinks' runs (TOKEN_SEEDS seeds, TOKEN_RUNS, TOKENS_ON; the massive-activation ratio's sink
    value among them), "both" the runs with both kinds of sinks (as "tokens": TOKEN_SEEDS seeds, TOKEN_RUNS, BOTH_ON).
    Columns as cliff()."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; valid: {', '.join(PLACEMENTS)}")
    if placement == "channels":
        return cliff()
    return _frame(placement, CLIFF_COLUMNS)


def measured_on(placement: str = "channels") -> str:
    """The machine line of the shipped runs at `placement` ("" where none are shipped)."""
    return {"channels": MEASURED_ON, "tokens": TOKENS_ON, "both": BOTH_ON}.get(placement, "")


def recovery():
    """Delayed scaling after fc1's input shrinks 1e5-fold at step 75 (LESSON, seed 0): per amax
    history length, the steps until fc1's input underflow stays under 1% (None: not within
    the run). DataFrame with columns history, steps_to_recover."""
    # None (never recovered) stays None: an object column, not a float NaN
    return _frame("recovery", ["history", "steps_to_recover"], dtype=object)


def mismatch():
    """Final losses (mean of the last 10 of 150 steps, LESSON settings) of MISMATCH_RUNS with sinks at 1e6,
    trained together per seed, beside the loss of predicting the mean target (fp8lab.training.operands.
    constant_loss, same batches): DataFrame with columns seed, run, loss, constant."""
    df = _frame("mismatch", ["seed", "run", "loss"])
    df["constant"] = [constant_loss(int(s)) for s in df.seed]
    return df


def published_runs():
    """The cliff's runs (CLIFF_RUNS, LESSON, 150 steps, 3 seeds) with the sinks at the massive-activation ratio
    (fp8lab.training.published.sinks_for(PUBLISHED_RATIO)) and without sinks, trained on one machine
    (PUBLISHED_ON): DataFrame with columns seed, sinks, run, loss, loss_short, as cliff()."""
    return _frame("published", CLIFF_COLUMNS)


def flush_costs():
    """fp8lab.training.published.flush_cost() as measured on FLUSH_ON (seed 0: fc2's input of the MLP trained in
    fp32, flushed as each recipe's forward GEMM flushes it), with trained_loss joined from the shipped runs:
    columns sinks, recipe, flushed, energy, fc2_error, fp32_model_loss, trained_loss."""
    cols = ["sinks", "recipe", "flushed", "energy", "fc2_error", "fp32_model_loss"]
    return with_trained_loss(_frame("flush", cols))


def published_means():
    """published_runs() summarised: each run's mean final loss over the seeds at the published sinks, against its
    own no-sink mean from the same machine, - 1: a Series indexed by (run, sinks)."""
    df = published_runs()
    if df.empty:
        raise ValueError("fp8lab.training.measured holds no runs at the published ratio: run "
                         "`python -m fp8lab measured --write --part published`")
    mean = df.groupby(["run", "sinks"], sort=False)["loss"].mean()
    clean = mean.xs(0.0, level="sinks")
    at = mean[mean.index.get_level_values("sinks") > 0]
    return at / at.index.get_level_values("run").map(clean).to_numpy() - 1


def cliff_means():
    """cliff() summarised: (the rows, the mean over seeds per run and sink magnitude, and each mean's
    change against the same run without sinks, final loss / no-sink final loss - 1)."""
    df = cliff()
    if df.empty:
        raise ValueError("fp8lab.training.measured holds no results: run `python -m fp8lab measured --write`")
    mean = df.groupby(["run", "sinks"], sort=False)[["loss", "loss_short"]].mean()
    clean = mean.xs(0.0, level="sinks")["loss"]
    change = mean["loss"] / mean.index.get_level_values("run").map(clean).to_numpy() - 1
    return df, mean, change


def survivors(magnitude: float = 1e6, threshold: float = 0.05) -> set[str]:
    """FP8 recipes whose final loss (mean of 3 seeds, fp8lab.training.measured) stays within `threshold`
    of their own no-sink loss with sinks at `magnitude` (what exercise 06 grades)."""
    change = cliff_means()[2]
    return {r for r in RECIPES if (r, magnitude) in change.index and change[r, magnitude] <= threshold}


def first_break(change, run: str, threshold: float = 0.05) -> float | None:
    """The smallest sink magnitude at which `run`'s final loss is more than `threshold` above its
    own no-sink run (change: cliff_means()[2]), or None if it never is."""
    c = change.xs(run, level="run")
    bad = c[(c.index > 0) & (c > threshold)]
    return float(bad.index.min()) if len(bad) else None


def with_trained_loss(df):
    """df (columns sinks, recipe, ...) with a column trained_loss: each recipe's FP8 run trained with the sinks from
    its first step, against its own no-sink run (the cliff and the runs at the published ratio, mean of 3 seeds;
    NaN where no run is shipped)."""
    change, extra = cliff_means()[2], published_means()
    df = df.copy()
    df["trained_loss"] = [float(change[r, s]) if (r, s) in change.index else
                          float(extra[r, s]) if (r, s) in extra.index else math.nan
                          for r, s in zip(df["recipe"], df["sinks"], strict=True)]
    return df
