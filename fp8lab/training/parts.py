"""The NVFP4 training recipe's parts, trained on the lab's toys: runs side by side, judged as trained and in
high precision.

Public: train_parts(runs, model, seed, steps) -> PartsResult (per run: the final training loss, the held-out loss
as trained, and the held-out loss of the trained weights with a high-precision forward), PART_SETS (every subset
of NVFP4_PARTS, in a fixed order), REFERENCES, KeepLayers / KeepGemm (a run with layers, or one GEMM of a layer,
in high precision), FC1_SPLIT / fc1_split / split_gaps (notebook 09's fc1 split), part_label, layer_costs(model)
(each linear layer's share of the GEMM work, and the layers a recipe keeps), flops_speedup. Notebook 09 shows these
runs (shipped in fp8lab.training.measured_fp4); tests/notebooks/test_fp4_lessons.py trains seed 0 again and checks
its claims.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fp8lab.numerics.recipes import NVFP4_PARTS, Recipe, get_recipe, nvfp4_with
from fp8lab.training.capstone import make_case
from fp8lab.training.convert import convert, fp8_layers, unwrap
from fp8lab.training.models import MarkovTask, TeacherTask, make_model
from fp8lab.training.train import LESSON, train_step

__all__ = ["FC1_SPLIT", "MODELS", "PART_SETS", "REFERENCES", "KeepGemm", "KeepLayers", "PartsResult", "fc1_split",
           "flops_speedup", "layer_costs", "part_label", "split_gaps", "train_parts"]

# every subset of the parts, fewest first: () is NVFP4 with 1x16 blocks everywhere and none of them
PART_SETS: tuple[tuple[str, ...], ...] = tuple(
    combo for n in range(len(NVFP4_PARTS) + 1) for combo in itertools.combinations(NVFP4_PARTS, n))
REFERENCES = ("fp32", "bf16", "mxfp8")  # trained beside the NVFP4 runs, on the same batches
HELDOUT = 1024  # held-out samples (the mlp) or sequences / 8 (the transformer) judged at the end


@dataclass(frozen=True)
class KeepLayers:
    """A run of `recipe` with the named linear layers kept in high precision (convert's skip), named `label`."""

    label: str
    recipe: str | Recipe
    layers: tuple[str, ...]


@dataclass(frozen=True)
class KeepGemm:
    """A run of `recipe` with one GEMM of one linear layer kept in high precision, named `label`: `gemm` "fprop"
    (that layer's forward) or "wgrad" (its weight gradient), the layer's other GEMMs and every other layer as the
    recipe says (convert's overrides, Recipe.with_gemm_in_high_precision)."""

    label: str
    recipe: str | Recipe
    layer: str
    gemm: str


# notebook 09's fc1 split: NVFP4 (1x16, no part) with fc1 whole, fc1's forward alone, or fc1's weight gradient
# alone in high precision, beside bf16 and NVFP4 itself
FC1_SPLIT: tuple[str | KeepLayers | KeepGemm, ...] = (
    "bf16",
    (),
    KeepLayers("nvfp4 1x16, fc1 in high precision", nvfp4_with([]), ("fc1",)),
    KeepGemm("nvfp4 1x16, fc1's forward in high precision", nvfp4_with([]), "fc1", "fprop"),
    KeepGemm("nvfp4 1x16, fc1's weight gradient in high precision", nvfp4_with([]), "fc1", "wgrad"),
)


def fc1_split(seed: int = 0, steps: int | None = None) -> PartsResult:
    """Train notebook 09's fc1 split (FC1_SPLIT: bf16, NVFP4 1x16, and NVFP4 with fc1 whole / its forward / its
    weight gradient in high precision) on the lesson MLP, seed `seed`: about a minute on 2 cores at 150 steps."""
    return train_parts(FC1_SPLIT, model="mlp", seed=seed, steps=steps)


def split_gaps(table) -> dict[str, float]:
    """From a split's table (PartsResult.table, or a mean of them): the share of NVFP4's final-loss gap to bf16
    that each fc1 run closes, (nvfp4 - run) / (nvfp4 - bf16): 1 closes it, 0 leaves it, negative widens it. Keys
    "whole", "forward", "wgrad"."""
    loss = table["final loss"]
    nv, bf = float(loss["nvfp4 1x16"]), float(loss["bf16"])
    runs = {"whole": FC1_SPLIT[2].label, "forward": FC1_SPLIT[3].label, "wgrad": FC1_SPLIT[4].label}
    return {k: (nv - float(loss[label])) / (nv - bf) for k, label in runs.items()}


def part_label(parts: Sequence[str]) -> str:
    """The run's name for a set of parts: nvfp4_with(parts).name ("nvfp4 1x16" for none)."""
    return nvfp4_with(parts).name


@dataclass
class PartsResult:
    """history: DataFrame (step, run, loss); table: per run "final loss" (mean of the last 10 training steps, the
    forward in the run's own precision), "heldout as trained" and "heldout high precision" (the held-out loss of
    the trained weights with an fp32 forward: what training learned, without the forward's quantization noise)."""

    model: str
    seed: int
    history: object
    table: object
    seconds: float


MODELS = ("mlp", "transformer", "llm_like")  # the lesson MLP, the lab's transformer, notebook 08's LLM-like case


def _setup(model: str, seed: int, sink_magnitude: float):
    """(base model, batch(g), loss, data generator, held-out (x, y), default steps), as the lab trains `model`."""
    if model == "llm_like":  # notebook 08's case: its own batches, held-out batch and steps
        case = make_case("llm_like", seed)
        return (case.make_model(), case.batch, case.loss, torch.Generator().manual_seed(seed), case.heldout,
                case.steps)
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; valid: {', '.join(MODELS)}")
    task = TeacherTask(seed=seed) if model == "mlp" else MarkovTask(seed=seed)
    batch, heldout = (LESSON.batch, HELDOUT) if model == "mlp" else (LESSON.batch // 4, HELDOUT // 8)
    return (make_model(model, seed, sink_magnitude), lambda g: task.batch(g, batch), task.loss,
            torch.Generator().manual_seed(1_000 + seed),  # the batches train() draws for this seed
            task.batch(torch.Generator().manual_seed(77_000 + seed), heldout), LESSON.steps)


def train_parts(runs: Sequence[str | Recipe | KeepLayers | KeepGemm | Sequence[str]] = (*REFERENCES, *PART_SETS),
                model: str = "mlp", seed: int = 0, steps: int | None = None, sink_magnitude: float = 0.0,
                backend: str = "emulated") -> PartsResult:
    """Train one model per run from the same weights on the same batches (LESSON settings: Adam 2e-3, batch 128 for
    the mlp, 32 sequences for the transformer; notebook 08's for "llm_like", whose sinks are its own, 1e6;
    steps None: the model's lesson steps): runs are "fp32", "bf16" (autocast), recipe names or Recipes, a
    tuple of NVFP4_PARTS (nvfp4_with), KeepLayers or KeepGemm. A run's high-precision layers (a recipe's
    high_precision_share, KeepLayers' layers) are convert's.
    Then each run is judged on one held-out batch, as trained and with its layers back in high precision."""
    import pandas as pd

    base, batch, loss_fn, g, (hx, hy), default_steps = _setup(model, seed, sink_magnitude)
    steps = steps or default_steps
    made = []
    for r in runs:
        if isinstance(r, str) and r in ("fp32", "bf16"):
            net, label, autocast = copy.deepcopy(base), r, r == "bf16"
        elif isinstance(r, KeepLayers):
            net, label, autocast = convert(base, r.recipe, skip=r.layers, backend=backend), r.label, False
        elif isinstance(r, KeepGemm):
            recipe = get_recipe(r.recipe)
            kept = recipe.with_gemm_in_high_precision(r.gemm).replace(name=r.label)
            net = convert(base, recipe, overrides={r.layer: kept}, backend=backend)
            label, autocast = r.label, False
        else:
            recipe = nvfp4_with(r) if isinstance(r, tuple | list) else get_recipe(r)
            net, label, autocast = convert(base, recipe, backend=backend), recipe.name, False
        made.append((label, net, torch.optim.Adam(net.parameters(), lr=LESSON.lr), autocast))
    labels = [m[0] for m in made]
    if len(set(labels)) != len(labels):
        raise ValueError(f"each run once, please: got {labels}")
    rows = []
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = batch(g)
        for label, net, opt, autocast in made:
            rows.append({"step": step, "run": label, "loss": train_step(net, opt, loss_fn, x, y, autocast)})
    history = pd.DataFrame(rows)
    table = []
    for label, net, _, autocast in made:
        losses = history[history.run == label]["loss"].tail(10)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            as_trained = float(loss_fn(net(hx).float(), hy))
        with torch.no_grad():
            high = float(loss_fn((unwrap(net) if fp8_layers(net) else net)(hx).float(), hy))
        table.append({"run": label, "final loss": float(losses.mean()) if losses.notna().all() else math.inf,
                      "heldout as trained": as_trained, "heldout high precision": high})
    return PartsResult(model, seed, history, pd.DataFrame(table).set_index("run"), time.perf_counter() - t0)


def layer_costs(model: str = "mlp", recipe: Recipe | str = "nvfp4_training", tokens: int | None = None):
    """Each linear layer of the toy `model` in order: its GEMM work per training step (3 GEMMs of 2*M*K*N flops,
    M tokens per batch), its share of the total, and whether `recipe` keeps it in high precision. DataFrame."""
    import pandas as pd

    recipe = get_recipe(recipe)
    net = make_model("transformer" if model == "llm_like" else model)
    m = tokens or (LESSON.batch if model == "mlp" else LESSON.batch // 4 * 32)
    linears = [(n, mod) for n, mod in net.named_modules() if isinstance(mod, nn.Linear)]
    kept = set(recipe.high_precision_layers([n for n, _ in linears]))
    rows = [{"layer": n, "K": mod.in_features, "N": mod.out_features, "flops": 3 * 2 * m * mod.in_features *
             mod.out_features, "kept in high precision": n in kept} for n, mod in linears]
    df = pd.DataFrame(rows).set_index("layer")
    df["share of flops"] = df["flops"] / df["flops"].sum()
    return df


def flops_speedup(share_high: float, low_speedup: float) -> float:
    """The whole step's GEMM speed-up over high precision when a share of the work runs at `low_speedup`x and the
    rest at 1x (Amdahl): 1 / (share_high + (1 - share_high) / low_speedup)."""
    return 1.0 / (share_high + (1.0 - share_high) / low_speedup)
