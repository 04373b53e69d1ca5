"""Training notebook 09's shipped runs again: `python -m fp8lab measured_fp4 [--write [--part NAME] [--jobs N]]`.

Public: PARTS (each table: its data file and models), task(part, model, seed) (one seed's rows, trained now), main.
Without --write it prints what fp8lab.training.measured_fp4 loads; with it, it trains them again (tens of minutes;
--jobs runs seeds side by side, one thread each) and writes fp8lab/training/runs/fp4_*.json (fp8lab.harness.tables).
"""

from __future__ import annotations

import argparse
import multiprocessing

import torch

from fp8lab.harness.tables import write_table
from fp8lab.numerics.kernels import state_label
from fp8lab.timing import machine_line
from fp8lab.training.gradients import dy_control, grad_recipes
from fp8lab.training.measured_fp4 import (
    BACKWARD_ON,
    COLUMNS,
    DY_CONTROL_ON,
    DY_ON,
    PARTS_ON,
    SPLIT_ON,
    backward_recipes,
    backward_runs,
    dy_control_runs,
    dy_runs,
    layer_recipes,
    means,
    parts,
    split,
)
from fp8lab.training.parts import FC1_SPLIT, PART_SETS, REFERENCES, train_parts

__all__ = ["PARTS", "main", "task"]

# each table: its data file (fp8lab/training/runs/NAME.json) and the models it trains
PARTS = {"parts": ("fp4_parts", ("mlp",)), "dy": ("fp4_dy", ("mlp", "llm_like")),
         "backward": ("fp4_backward", ("mlp",)), "dy_control": ("fp4_dy_control", ("mlp", "llm_like")),
         "split": ("fp4_split", ("mlp",))}


def task(part: str, model: str, seed: int) -> list[tuple]:
    """One (part, model, seed) of the sweep, trained now: its rows (losses to 6 significant digits, as shipped)."""
    torch.set_num_threads(1)  # jobs side by side, one core each (MKL_CBWR: the same bits on any thread count)
    runs = {"parts": lambda: [*REFERENCES, *PART_SETS, *layer_recipes()], "dy": lambda: ["fp32", *grad_recipes()],
            "backward": lambda: ["bf16", *backward_recipes()], "dy_control": lambda: [dy_control()],
            "split": lambda: list(FC1_SPLIT)}[part]()
    res = train_parts(runs, model=model, seed=seed)
    return [(model, seed, run, *(float(f"{float(v):.6g}") for v in row))
            for run, row in zip(res.table.index, res.table.to_numpy(), strict=True)]


def _machine() -> str:
    """This machine's line as each job trained: one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return machine_line(state_label())
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8lab measured_fp4", description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="train again and write the data files (tens of minutes)")
    p.add_argument("--part", choices=["all", *PARTS], default="all")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=1, help="processes side by side, one thread each")
    args = p.parse_args(argv)
    if not args.write:
        for name, (frame, on) in {"parts": (parts, PARTS_ON), "dy": (dy_runs, DY_ON),
                                  "backward": (backward_runs, BACKWARD_ON),
                                  "dy_control": (dy_control_runs, DY_CONTROL_ON), "split": (split, SPLIT_ON)}.items():
            print(f"{name}, measured on: {on}\n{means(frame()).to_string()}")
        return 0
    for name, (table, models) in PARTS.items():
        if args.part not in ("all", name):
            continue
        tasks = [(name, m, s) for m in models for s in range(args.seeds)]
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            rows = [row for rows in pool.starmap(task, tasks) for row in rows]
        write_table(table, _machine(), COLUMNS, rows)
        print(f"wrote fp8lab/training/runs/{table}.json", flush=True)
    return 0
