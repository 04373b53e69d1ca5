"""Measuring notebook 06's shipped runs again: `python -m fp8lab measured [--write [--part NAME]]`.

Public: PARTS (each table's name and how it is measured), main. Without --write it prints what
fp8lab.training.measured loads; with it, it trains the runs again (minutes) and writes their data files,
fp8lab/training/runs/NAME.json (fp8lab.harness.tables), with the machine line of this machine.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from fp8lab.harness.tables import write_table
from fp8lab.numerics.kernels import state_label
from fp8lab.timing import machine_line
from fp8lab.training.measured import (
    BOTH_ON,
    CLIFF_COLUMNS,
    MEASURED_ON,
    MISMATCH_ON,
    MISMATCH_RUNS,
    MISMATCH_SINKS,
    PUBLISHED_ON,
    PUBLISHED_RATIO,
    TOKEN_RUNS,
    TOKEN_SEEDS,
    TOKENS_ON,
    cliff,
    cliff_rows,
    mismatch,
    published_means,
    recovery,
)
from fp8lab.training.published import flush_cost, sinks_for
from fp8lab.training.shipped import RUNS
from fp8lab.training.train import cliff_sweep, history_sweep, steps_to_recover, train

__all__ = ["PARTS", "main"]


def _g(v: float) -> float:
    """A measured loss as shipped: 6 significant digits."""
    return float(f"{v:.6g}")


def _cliff_rows(df) -> list[tuple]:
    return [(int(r.seed), float(r.sinks), r.run, _g(r.loss), _g(r.loss_short)) for r in df.itertuples()]


def _cliff(seeds: tuple[int, ...]) -> None:
    on = machine_line(state_label())
    write_table("cliff", on, CLIFF_COLUMNS, _cliff_rows(cliff_sweep(seeds=seeds)))
    hist = history_sweep()
    rec = [(int(h), steps_to_recover(part.set_index("step")["underflow"])) for h, part in hist.groupby("history")]
    write_table("recovery", on, ["history", "steps_to_recover"], rec,
                "steps_to_recover null: not recovered within the run")


def _mismatch(seeds: tuple[int, ...]) -> None:
    rows = []
    for seed in seeds:
        res = train(MISMATCH_RUNS, seed=seed, sink_magnitude=MISMATCH_SINKS, progress=False, monitor_every=None)
        rows += [(seed, run, _g(loss)) for run, loss in res.final_loss().items()]
    write_table("mismatch", machine_line(state_label()), ["seed", "run", "loss"], rows, f"sinks at {MISMATCH_SINKS:g}")


def _published(seeds: tuple[int, ...]) -> None:
    df = cliff_sweep(sinks=(0.0, sinks_for(PUBLISHED_RATIO)), seeds=seeds)
    write_table("published", machine_line(state_label()), CLIFF_COLUMNS, _cliff_rows(df))


def _placement(placement: str) -> Callable[[tuple[int, ...]], None]:
    """The measurement of a placement's cliff (TOKEN_SEEDS seeds, TOKEN_RUNS, the sink values below)."""
    def measure(seeds: tuple[int, ...]) -> None:
        sinks = sorted({0.0, 1e3, 1e4, sinks_for(PUBLISHED_RATIO), 1e5, 1e6, 1e7})
        df = cliff_sweep(sinks=sinks, seeds=seeds[:TOKEN_SEEDS], runs=TOKEN_RUNS, placement=placement)
        write_table(placement, machine_line(state_label()), CLIFF_COLUMNS, _cliff_rows(df), f'placement "{placement}"')
    return measure


def _flush(seeds: tuple[int, ...]) -> None:
    cols = ["sinks", "recipe", "flushed", "energy", "fc2_error", "fp32_model_loss"]
    rows = [(float(r.sinks), r.recipe, *(_g(getattr(r, c)) for c in cols[2:])) for r in flush_cost().itertuples()]
    write_table("flush", machine_line(state_label()), cols, rows, "fp8lab.training.published.flush_cost, seed 0")


PARTS: dict[str, Callable[[tuple[int, ...]], None]] = {
    "cliff": _cliff, "mismatch": _mismatch, "published": _published, "flush": _flush,
    "tokens": _placement("tokens"), "both": _placement("both")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8lab measured", description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="train the runs again and write their data files (minutes)")
    p.add_argument("--part", choices=["all", *PARTS], default="all",
                   help="which table --write measures: the sink cliff and recovery, the mismatch runs, the runs at "
                        "the published ratio, the flush costs, the token sinks' cliff, both sinks' cliff, or all")
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args(argv)
    if not args.write:
        print(f"measured on: {MEASURED_ON}\n{cliff().groupby(['sinks', 'run'], sort=False).loss.mean().unstack()}")
        print(recovery().to_string(index=False))
        print(f"mismatch runs, measured on: {MISMATCH_ON}\n{mismatch().to_string(index=False)}")
        print(f"runs at the published ratio, measured on: {PUBLISHED_ON}\n{published_means().to_string()}")
        tokens = cliff_rows("tokens").groupby(["sinks", "run"], sort=False).loss.mean().unstack()
        print(f"the sinks in the first 2 tokens, measured on: {TOKENS_ON}\n{tokens}")
        both = cliff_rows("both").groupby(["sinks", "run"], sort=False).loss.mean().unstack()
        print(f"the sinks in every token's channels and the first 2 tokens', measured on: {BOTH_ON}\n{both}")
        return 0
    for name, measure in PARTS.items():
        if args.part in ("all", name):
            measure(tuple(range(args.seeds)))
            print(f"wrote the {name} table in {RUNS}", flush=True)
    return 0
