"""`python -m fp8lab bench blas`: what MKL's strict reproducibility (the MKL_CBWR fp8lab sets) costs and buys.

MKL reads MKL_CBWR once per process, so each candidate runs in processes of its own, interleaved
round by round: "AUTO,STRICT" (what fp8lab sets when imported) against "AUTO" (MKL's own default).
Each process times an fp32 GEMM and one training step of notebook 06's MLP under the tensorwise
recipe, and checks whether a GEMM gives the same bits with 1 and 2 threads.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from fp8lab.bench.table import print_table

__all__ = ["CANDIDATES", "bench_blas"]

CANDIDATES = {"AUTO,STRICT (fp8lab's)": "AUTO,STRICT", "AUTO (MKL's default)": "AUTO"}

CHILD = r"""
import hashlib, json, statistics, sys, time
import fp8lab
import torch
from fp8lab.training.models import TeacherTask, make_model
from fp8lab.training.train import LESSON, train_step
from fp8lab.nn import convert

size, steps = int(sys.argv[1]), int(sys.argv[2])
g = torch.Generator().manual_seed(0)
a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
x, w = torch.randn(128, 1024, generator=g), torch.randn(1024, 1024, generator=g) / 32

def bits(threads):
    torch.set_num_threads(threads)
    out = (x @ w).numpy().tobytes()
    torch.set_num_threads(2)
    return hashlib.sha256(out).hexdigest()

same = bits(1) == bits(2)
gemm = []
for _ in range(4):
    t = time.perf_counter(); a @ b; gemm.append(time.perf_counter() - t)
task = TeacherTask()
model = convert(make_model("mlp"), "tensorwise", backend="emulated")
opt = torch.optim.Adam(model.parameters(), lr=LESSON.lr)
batches = [task.batch(g, LESSON.batch) for _ in range(steps + 2)]
step = []
for i, (bx, by) in enumerate(batches):
    t = time.perf_counter(); train_step(model, opt, task.loss, bx, by); step.append(time.perf_counter() - t)
print("RESULT", json.dumps({"same": same, "gemm_ms": 1e3 * statistics.median(gemm[1:]),
                            "step_ms": 1e3 * statistics.median(step[2:])}))
"""


def _child(cbwr: str, size: int, steps: int) -> dict:
    env = {**os.environ, "MKL_CBWR": cbwr}
    out = subprocess.run([sys.executable, "-c", CHILD, str(size), str(steps)], env=env, capture_output=True,
                         text=True, timeout=900, check=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT "):])


def bench_blas(size: int = 2048, rounds: int | None = None, steps: int = 20) -> list[dict]:
    """Each candidate in `rounds` processes, interleaved; medians over processes of per-process medians."""
    rounds = rounds or 5
    results: dict[str, list[dict]] = {name: [] for name in CANDIDATES}
    for _ in range(rounds):
        for name, cbwr in CANDIDATES.items():
            results[name].append(_child(cbwr, size, steps))
    base = statistics.median(r["gemm_ms"] for r in results["AUTO (MKL's default)"])
    base_step = statistics.median(r["step_ms"] for r in results["AUTO (MKL's default)"])
    rows = []
    for name, runs in results.items():
        gemm, step = statistics.median(r["gemm_ms"] for r in runs), statistics.median(r["step_ms"] for r in runs)
        rows.append({"MKL_CBWR": name, f"fp32 {size}^3 GEMM ms": gemm, "vs AUTO": gemm / base,
                     "MLP tensorwise step ms": step, "step vs AUTO": step / base_step,
                     "same bits, 1 and 2 threads": f"{sum(r['same'] for r in runs)}/{len(runs)} processes"})
    print_table(f"bench blas: {rounds} processes per candidate, interleaved", rows,
                "MKL_CBWR is read once per process; fp8lab sets AUTO,STRICT when imported unless it is set")
    return rows
