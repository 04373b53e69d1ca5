"""The gradient side: dy, the output gradient both backward GEMMs of a linear layer read, over training.

Public: record_dy(model, steps, at, seed) -> DyRecord (each linear layer's dy at chosen steps of a high-precision
run, and its range at every step), DY_CHOICES (E4M3 / E5M2 x per-tensor / 1x128, as dgrad reads dy[M, N] along
N), dy_choice_table(dy) (per choice: the share flushed to zero, the share clipped, SQNR, the binades used),
grad_recipes() (the four choices as training recipes, forward as blockwise's), dy_control() (blockwise's forward,
dy unquantized: their control), DY_MODELS.
Notebook 09's first part: "E4M3 for weight and activation tensors, and E5M2 for gradient tensors" (arXiv
2209.05433) against DeepSeek-V3's E4M3 everywhere with 1x128 tiles (arXiv 2412.19437).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from fp8lab.numerics.metrics import db
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.recipes import RECIPES, Recipe, TensorScaling
from fp8lab.numerics.scaling import PerBlock, PerTensor, amax_per_block
from fp8lab.training.capstone import make_case
from fp8lab.training.models import TeacherTask, make_model
from fp8lab.training.train import LESSON, train_step

__all__ = ["DY_CHOICES", "DY_MODELS", "WHEN", "DyRecord", "block_amaxes", "dy_choice_table", "dy_control",
           "grad_recipes",
           "lesson_records", "record_dy", "when_steps"]

# (label, format, granularity of dy[M, N] along N, as the dgrad GEMM reads it)
DY_CHOICES: tuple[tuple[str, str, object], ...] = (
    ("E5M2 per-tensor", "e5m2", PerTensor()),
    ("E4M3 per-tensor", "e4m3", PerTensor()),
    ("E5M2 1x128", "e5m2", PerBlock(1, 128)),
    ("E4M3 1x128", "e4m3", PerBlock(1, 128)),
)
DY_MODELS = ("mlp", "llm_like")  # notebook 06's lesson MLP; notebook 08's LLM-like transformer (sinks at 1e6)


@dataclass
class DyRecord:
    """dy of every linear layer of one high-precision run.

    snapshots: {(step, layer): dy[M, N] float32} at the steps asked for; ranges: one row per step and layer
    (step, layer, amax, smallest nonzero |dy|, binades between them, loss); layers: in model order."""

    model: str
    steps: int
    snapshots: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    ranges: object = None
    layers: list[str] = field(default_factory=list)

    @property
    def at(self) -> list[int]:
        return sorted({s for s, _ in self.snapshots})


def _setup(model: str, seed: int, lr: float):
    """(model, loss_fn, batch(g) -> (x, y), data generator, default steps) as fp8lab trains them elsewhere."""
    if model == "mlp":
        task = TeacherTask(seed=seed)
        return (make_model("mlp", seed), task.loss, lambda g: task.batch(g, LESSON.batch),
                torch.Generator().manual_seed(1_000 + seed), LESSON.steps, lr or LESSON.lr)
    case = make_case("llm_like", seed)
    return case.make_model(), case.loss, case.batch, torch.Generator().manual_seed(seed), case.steps, lr or case.lr


def record_dy(model: str = "mlp", steps: int | None = None, at: Sequence[int] = (0, 10, 50, 149), seed: int = 0,
              lr: float | None = None) -> DyRecord:
    """Train `model` (DY_MODELS) in fp32 for `steps` (None: its lesson's: 150 for the mlp, notebook 08's for the
    LLM-like model) with Adam, keeping every nn.Linear's output gradient dy[M, N] (batch dims flattened) at the steps
    in `at` (those beyond the run are dropped) and its range at every step: the data notebook 09 quantizes."""
    import pandas as pd

    if model not in DY_MODELS:
        raise ValueError(f"unknown model {model!r}; valid: {', '.join(DY_MODELS)}")
    net, loss_fn, batch, g, default_steps, lr = _setup(model, seed, lr or 0.0)
    steps = steps or default_steps
    keep = {s for s in at if 0 <= s < steps}
    linears = [(n, m) for n, m in net.named_modules() if isinstance(m, nn.Linear)]
    record = DyRecord(model, steps, layers=[n for n, _ in linears])
    rows: list[dict] = []
    current = {"step": 0}

    def hook(name):
        def save(grad: torch.Tensor) -> None:
            dy = grad.detach().float().reshape(-1, grad.shape[-1])  # (M, N)
            a = dy.abs()
            nonzero = a[a > 0]
            amax, smallest = float(a.max()), float(nonzero.min()) if nonzero.numel() else math.nan
            rows.append({"step": current["step"], "layer": name, "amax": amax, "smallest": smallest,
                         "binades": math.log2(amax / smallest) if nonzero.numel() else 0.0})
            if current["step"] in keep:
                record.snapshots[current["step"], name] = dy.clone()
        def on_output(module, inputs, output) -> None:  # (a forward hook's return value would replace the output)
            if output.requires_grad:
                output.register_hook(save)

        return on_output

    handles = [m.register_forward_hook(hook(n)) for n, m in linears]  # dy: the gradient of each linear's output
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    losses = []
    try:
        for step in range(steps):
            current["step"] = step
            x, y = batch(g)
            losses.append(train_step(net, opt, loss_fn, x, y))
    finally:
        for h in handles:
            h.remove()
    ranges = pd.DataFrame(rows)
    ranges["loss"] = [losses[s] for s in ranges.step]
    record.ranges = ranges
    return record


def dy_choice_table(dy: torch.Tensor, choices: Sequence[tuple[str, str, object]] = DY_CHOICES):
    """dy[M, N] quantized as the dgrad GEMM reads it, per choice: DataFrame indexed by label with flushed (share of
    dy's nonzero values that became zero), sqnr_db, binades_used (distinct binades of the nonzero codes, out of the
    format's "format binades") and blocks (scales). The binades are read off a histogram of the 8-bit codes."""
    import pandas as pd

    rows = []
    nonzero = int((dy != 0).sum())
    signal = float(dy.double().square().sum())
    for label, fmt, granularity in choices:
        q = quantize(dy, fmt, granularity)
        deq = q.dequantize()
        counts = torch.bincount((q.data.view(torch.uint8) & 0x7F).reshape(-1).int(), minlength=128)  # magnitudes
        zeros = int(counts[0]) - (dy.numel() - nonzero)  # a zero code where dy was not zero: flushed
        codes = torch.nonzero(counts[1:]).flatten() + 1
        values = codes.to(torch.uint8).view(q.data.dtype).float()
        values = values[torch.isfinite(values)]
        binades = torch.unique(torch.floor(torch.log2(values))).numel()  # (at most 127 values)
        rows.append({"choice": label, "flushed": zeros / max(nonzero, 1),
                     "sqnr_db": db(signal, float((dy.double() - deq.double()).square().sum())),
                     "binades_used": binades, "format binades": q.fmt.dynamic_range_binades, "blocks": q.scale.numel()})
    return pd.DataFrame(rows).set_index("choice")


def block_amaxes(dy: torch.Tensor, cols: int = 128) -> torch.Tensor:
    """dy[M, N]'s amax per 1 x cols block, [M, ceil(N/cols)] (the scales a 1x128 dy would get, times 448 or 57344)."""
    return amax_per_block(dy, PerBlock(1, cols))


def grad_recipes(forward: Recipe = RECIPES["blockwise"]) -> list[Recipe]:
    """The four DY_CHOICES as training recipes: `forward`'s input and weight (blockwise: robust to the sinks, so
    only the gradients differ), grad_output in each choice's format and granularity (dgrad along N, wgrad along M,
    as FP8Linear quantizes every operand). Named "dy " + the choice's label."""
    return [forward.replace(name=f"dy {label}", grad_output=TensorScaling(fmt, granularity),
                            description=f"{forward.name}'s forward; gradients {label}")
            for label, fmt, granularity in DY_CHOICES]


def dy_control(forward: Recipe = RECIPES["blockwise"]) -> Recipe:
    """The control for grad_recipes: `forward`'s forward GEMM, both backward GEMMs in high precision (dy never
    quantized). Against it, each choice for dy shows what quantizing the backward pass costs; against fp32, the
    forward's share is mixed in. Named "dy unquantized"."""
    return forward.replace(name="dy unquantized", wgrad_high_precision=True, dgrad_high_precision=True,
                           description=f"{forward.name}'s forward; dgrad and wgrad in high precision")


WHEN = ("first step", "early", "middle", "last step")  # the steps record_dy keeps, as notebook 09 names them


def when_steps(steps: int) -> tuple[int, ...]:
    """The steps WHEN names in a run of `steps`: 0, steps/15, steps/3 and the last (150: 0, 10, 50, 149)."""
    return (0, max(1, round(steps / 15)), max(2, steps // 3), steps - 1)


@functools.cache
def lesson_records(seed: int = 0, smoke: bool = False) -> dict[str, DyRecord]:
    """record_dy for each of DY_MODELS at its lesson's steps (smoke: a few), kept for the process: notebook 09's
    panels, answers and predictions share one recording."""
    out = {}
    for model in DY_MODELS:
        steps = (20 if model == "mlp" else 8) if smoke else None
        full = 150 if model == "mlp" else 60
        out[model] = record_dy(model, steps, when_steps(steps or full), seed)
    return out
