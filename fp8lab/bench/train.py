"""`python -m fp8lab bench train`: one training step per recipe as a ratio to fp32's, on three models.

Public: MODELS, TIMED_RECIPES, TARGET_RATIO, make_workload(name), bench_train(rounds, models, consecutive, parts),
c_passes(tally), PARTS_NOTE (what the --parts columns say).
The models (MODELS):
  unseen_mlp  256 -> 512 -> 256 -> 8 with GELU, batch 256, on the teacher task: a plain nn.Sequential that is
              none of the lab's toys, so no speed-up can be tuned to a toy's shapes
  lesson_mlp  notebook 06's MLP (256 -> 1024 -> 1024 -> 8), batch 128, as the lesson trains it
  llm_like    notebook 08's LLM-like model (fp8lab.training.capstone): the lab's 2-layer transformer with sink
              channels at 1e6, 32 sequences of 32 tokens
Each recipe's model is converted from the same fp32 weights and trains on the same batch with Adam; fp32, bf16
and every recipe take turns in each round (timing.time_interleaved), each sample a few consecutive steps as in a
training loop. A recipe's ratio is the median over the rounds of its time over fp32's in the same round; the
target is within TARGET_RATIO of fp32. Beside the wall-clock columns, the CPU time of the calling thread
(time.thread_time: what other processes on a shared machine leave untouched; all of a step's work with one torch
thread, torch.set_num_threads(1)) and its ratio to fp32's, by the same median of per-round ratios. With
parts=True (`--parts`) each step's C passes are timed too (c_passes): the kernels' own work on operands and outputs,
and a recipe's floor beside its ratio, fp32's step plus those passes: where the step would stand if everything else it
adds to fp32's (the Python around each call, torch's own passes over the outputs) cost nothing.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from fp8lab.bench.table import print_table
from fp8lab.numerics.kernels import kernel_times
from fp8lab.numerics.kernels_gemm import GEMM_KERNELS
from fp8lab.timing import time_interleaved, timed
from fp8lab.training.capstone import make_case
from fp8lab.training.convert import convert
from fp8lab.training.models import TeacherTask, make_model
from fp8lab.training.train import LESSON, train_step

__all__ = ["MODELS", "PARTS_NOTE", "TARGET_RATIO", "TIMED_RECIPES", "Workload", "bench_train", "c_passes",
           "make_workload"]

MODELS = ("unseen_mlp", "lesson_mlp", "llm_like")
TIMED_RECIPES = ("tensorwise", "delayed", "rowwise", "rowwise_with_gw_hp", "blockwise", "mxfp8", "nvfp4",
                 "nvfp4_training")
TARGET_RATIO = 1.5  # an FP8 step within 1.5x of fp32's
REFERENCES = ("bf16", "tensorwise (torchao)")  # timed beside the recipes, not held to the target
PARTS_NOTE = ("C passes: the median step's time in fp8lab's kernels other than their GEMMs (c_passes); floor: fp32's "
              "ms/step plus a recipe's C passes, over fp32's, where its step would stand if all else it adds cost "
              "nothing")


@dataclass(frozen=True)
class Workload:
    """A model to time: a factory of its fp32 model (the same weights every call), one batch, its loss."""

    name: str
    title: str
    make: Callable[[], nn.Module]
    x: torch.Tensor
    y: torch.Tensor
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _unseen_mlp() -> nn.Module:
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256), nn.GELU(), nn.Linear(256, 8))


def make_workload(name: str) -> Workload:
    """One of MODELS with its batch (seeded: the same inputs every call)."""

    g = torch.Generator().manual_seed(0)
    if name == "unseen_mlp":
        task = TeacherTask()
        x, y = task.batch(g, 256)
        return Workload(name, "MLP 256-512-256-8 (nn.Sequential), batch 256", _unseen_mlp, x, y, task.loss)
    if name == "lesson_mlp":
        task = TeacherTask()
        x, y = task.batch(g, LESSON.batch)
        return Workload(name, f"notebook 06's MLP 256-1024-1024-8, batch {LESSON.batch}", lambda: make_model("mlp", 0),
                        x, y, task.loss)
    if name == "llm_like":
        case = make_case("llm_like")
        x, y = case.batch(g)
        return Workload(name, f"notebook 08's LLM-like transformer, {x.shape[0]} x {x.shape[1]} tokens",
                        case.make_model, x, y, case.loss)
    raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")


def _model_for(label: str, work: Workload) -> nn.Module | None:
    """The model a candidate trains (None: torchao is not installed)."""

    base = work.make()
    if label in ("fp32", "bf16"):
        return base
    if label == "tensorwise (torchao)":
        try:
            return convert(base, "tensorwise", engine="torchao")
        except ImportError:
            return None
    return convert(base, label)


def c_passes(tally: Counter) -> float:
    """Seconds of a kernel_times tally spent in passes over operands and outputs (quantize, transform, draws, widen,
    scales): every kernel but those that compute a GEMM (GEMM_KERNELS), whose work fp32's step does in its matmuls."""

    return sum(seconds for name, seconds in tally.items() if name not in GEMM_KERNELS)


def _quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q[0], q[2]


def _slow_bf16(cands: dict[str, Callable[[], None]], limit: float = 3.0) -> str:
    """Why bf16 is left out of the rounds ("" where it is not): a CPU without bf16 matrix units takes many times
    fp32's step for it, which would make the benchmark's run time mostly bf16's."""

    fp32 = min(timed(cands["fp32"], 1, 1))
    bf16 = min(timed(cands["bf16"], 1, 1))
    ratio = bf16 / fp32
    return f"{ratio:.1f}x fp32's time for one sample (no bf16 matrix units here?)" if ratio > limit else ""


def bench_train(size: int | None = None, rounds: int | None = None, models: tuple[str, ...] | None = None,
                consecutive: int = 4, parts: bool = False) -> list[dict]:
    """One table: for each model (all of MODELS, or `models`), fp32, bf16 (autocast), every recipe of
    TIMED_RECIPES and torchao's tensorwise (emulate=True), `rounds` rounds (default 20) of `consecutive` steps;
    with `parts`, each step's C passes (c_passes) and each recipe's floor too."""

    if size is not None:
        print("bench train: --size does not apply (each model has its own sizes); ignored", file=sys.stderr)
    unknown = set(models or ()) - set(MODELS)
    if unknown:
        raise ValueError(f"unknown models {sorted(unknown)}; valid: {', '.join(MODELS)}")
    rounds = rounds or 20
    rows, titles, notes = [], [], []
    for name in (m for m in MODELS if not models or m in models):
        work = make_workload(name)
        titles.append(f"{name}: {work.title}")
        cands, skipped, cpu, passes = {}, {}, {}, {}
        for label in ("fp32", *TIMED_RECIPES, *REFERENCES):
            model = _model_for(label, work)
            if model is None:
                continue
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)

            def steps(model=model, opt=opt, label=label, work=work, skipped=skipped, cpu=cpu, passes=passes) -> None:
                start = time.thread_time()
                with kernel_times() if parts else contextlib.nullcontext(Counter()) as tally:
                    for _ in range(consecutive):
                        loss = train_step(model, opt, work.loss, work.x, work.y, autocast=label == "bf16")
                        if not math.isfinite(loss):  # train_step returns without a backward pass: not a step
                            skipped[label] = skipped.get(label, 0) + 1
                cpu.setdefault(label, []).append(time.thread_time() - start)
                passes.setdefault(label, []).append(c_passes(tally))

            cands[label] = steps
        slow = _slow_bf16(cands)
        if slow:
            del cands["bf16"]
            notes.append(f"{name}: bf16 left out, {slow}")
        times = time_interleaved(cands, rounds=rounds, warmup=2)
        cpu_rounds = {label: cpu[label][-rounds:] for label in times}  # (the rounds' samples: warm-ups came first)
        fp32_ms = statistics.median(times["fp32"]) / consecutive * 1e3
        for label, ts in times.items():
            ratios = [t / base for t, base in zip(ts, times["fp32"], strict=True)]
            ratio = statistics.median(ratios)
            low, high = _quartiles(ratios)
            cpu_ratio = statistics.median(t / max(base, 1e-9) for t, base in
                                          zip(cpu_rounds[label], cpu_rounds["fp32"], strict=True))
            held = label in TIMED_RECIPES
            rows.append({"model": name, "what": label, "ms/step": statistics.median(ts) / consecutive * 1e3,
                         "x fp32": ratio, "x fp32, middle half": f"{low:.2f}-{high:.2f}",
                         "cpu ms/step": statistics.median(cpu_rounds[label]) / consecutive * 1e3,
                         "cpu x fp32": cpu_ratio,
                         f"within {TARGET_RATIO:g}x": ("yes" if ratio <= TARGET_RATIO else "NO") if held else "-",
                         **(_parts(passes[label][-rounds:], consecutive, fp32_ms, held) if parts else {}),
                         **({"note": f"{skipped[label]} steps with a non-finite loss (no backward)"}
                            if label in skipped else {})})
    print_table(f"bench train: training step time against fp32, Adam, median of {rounds} rounds of {consecutive} "
                "consecutive steps, every candidate in each round (x fp32: the median of each round's ratio; cpu: "
                "the calling thread's CPU time)", rows,
                "\n".join([f"target: every recipe within {TARGET_RATIO:g}x of fp32; bf16 (autocast) and torchao's "
                           "tensorwise (emulate=True) for reference", "; ".join(titles), *notes,
                           *([PARTS_NOTE] if parts else [])]))
    return rows


def _parts(samples: list[float], consecutive: int, fp32_ms: float, held: bool) -> dict:
    """A row's --parts columns: its C passes a step (the median over the rounds) and, for a recipe, its floor."""

    passes_ms = statistics.median(samples) / consecutive * 1e3
    return {"C passes ms/step": passes_ms, "floor x fp32": (fp32_ms + passes_ms) / fp32_ms if held else "-"}
