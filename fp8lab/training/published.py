"""Outliers of real models as their papers publish them, placed on the lab's cliffs; and why flushing costs the lesson's
toy what it costs.

Public: Published, PUBLISHED (each source's words, link and ratio: data, read from sources/published.json by
read_published), lesson_median() (the median |value| of the ordinary channels of fc2's input in notebook 06's
MLP), sinks_for(ratio) (the sink value with that ratio to it),
outlier_multiplier(ratio, ...) (the same for notebook 02's synthetic tensor), flush_cost(...) (which values flush,
how much of fc2's input they carry, and what that costs a model that learned without them and one that learns
with them). Notebooks 02 and 06 mark PUBLISHED on their cliffs; fp8lab.training.measured ships the runs at them.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from fp8lab.data.synthetic import sample
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.recipes import get_recipe
from fp8lab.training.lesson import lesson_model_and_batch
from fp8lab.training.measured import with_trained_loss
from fp8lab.training.models import TeacherTask, make_model
from fp8lab.training.train import LESSON, train_step

__all__ = ["PUBLISHED", "SOURCES", "Published", "flush_cost", "lesson_fc2_input", "lesson_median", "marker_sinks",
           "measured_at", "outlier_multiplier", "read_published", "sinks_for"]


@dataclass(frozen=True)
class Published:
    """One published measurement of LLM activation outliers: `ratio` is the factor the source gives between the
    outliers and the other values, in its own `quote` (verbatim), at `url`; `against` says what the source compares
    them with; `placement` is where the source finds them (fp8lab.training.models.PLACEMENTS: "channels", a few
    feature dimensions across the tokens; "tokens", a few feature dimensions of a few tokens), the cliff a lab's
    panel marks it on. The lab reads "the other values" as the median magnitude of the ordinary values."""

    label: str
    source: str
    url: str
    quote: str
    ratio: float
    against: str
    placement: str


SOURCES = Path(__file__).with_name("sources")  # the published figures' data files


def read_published(path: Path = SOURCES / "published.json") -> tuple[Published, ...]:
    """The published measurements in a JSON file (a list of objects, one field of Published each), in its order."""
    return tuple(Published(**entry) for entry in json.loads(path.read_text(encoding="utf-8")))


PUBLISHED: tuple[Published, ...] = read_published()


def lesson_fc2_input(sinks: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """fc2's input in notebook 06's MLP (LESSON, its initial weights, train()'s first batch) with the sink channels
    at `sinks`, and the sink channels' indices."""
    model, x, _, _ = lesson_model_and_batch(sinks, seed)
    seen = {}
    handle = model.fc2.register_forward_pre_hook(lambda _, args: seen.setdefault("x", args[0].detach().clone()))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return seen["x"], model.sink.index.clone()


@functools.cache
def lesson_median(seeds: tuple[int, ...] = (0, 1, 2)) -> float:
    """The median |value| of fc2's input over its ordinary channels (all but the sinks) in notebook 06's MLP, at
    the initial weights on train()'s first batch, averaged over `seeds` (fp32 training moves it by under 2% in
    150 steps): the "median" a published ratio is taken against."""
    meds = []
    for seed in seeds:
        h, idx = lesson_fc2_input(0.0, seed)
        keep = torch.ones(h.shape[1], dtype=torch.bool)
        keep[idx] = False
        meds.append(float(h[:, keep].abs().median()))
    return sum(meds) / len(meds)


def sinks_for(ratio: float) -> float:
    """The sink value of notebook 06's MLP whose ratio to the median ordinary value of fc2's input is `ratio`,
    rounded to 2 significant digits (the value the shipped runs at the published ratios train with)."""
    v = ratio * lesson_median()
    digits = 1 - math.floor(math.log10(v))
    return round(v, digits)


def measured_at(source: Published, placement: str | None) -> bool:
    """Whether `source` measured its ratio at `placement` (None: any; "both" holds both kinds of outliers, so every
    source's ratio belongs on it)."""
    return placement in (None, "both", source.placement)


def marker_sinks(placement: str | None = None) -> dict[str, float]:
    """Each PUBLISHED label at the sink value of its ratio: where notebook 06's cliff marks it (only those measured
    at `placement`, where given: measured_at)."""
    return {p.label: sinks_for(p.ratio) for p in PUBLISHED if measured_at(p, placement)}


def outlier_multiplier(ratio: float, distribution: str = "normal", shape: tuple[int, int] = (64, 1024),
                       seed: int = 0, placement: str = "channels") -> float:
    """The outlier magnitude m of fp8lab.data.synthetic.sample (its outlier channels multiplied by m) at which the
    largest outlier is `ratio` times the median |value| of the other channels: where notebook 02's cliff marks a
    published ratio (m = ratio * median / the outlier channels' largest |value| before they are multiplied; with
    placement "tokens", their largest in the tokens that hold the outliers; "both", the largest of either kind)."""
    # multiplied by 1: the base values, and where the outliers will be
    x, where = sample(distribution, shape, 1.0, seed=seed, return_outliers=True, placement=placement)
    if placement == "channels":  # the outlier channels' indices: every token of them
        mask = torch.zeros(shape, dtype=torch.bool, device="cpu")
        mask[:, where] = True
    else:  # a mask of the outliers' positions
        mask = where
    keep = ~mask.any(0)  # the channels without an outlier
    return ratio * float(x[:, keep].abs().median()) / float(x[mask].abs().max())


@functools.cache
def _trained_fp32(seed: int):
    """Notebook 06's MLP trained in fp32 without sinks (LESSON: 150 steps on train()'s batches), its task, and a
    held-out batch of 1024."""
    model, task = make_model("mlp", seed, 0.0), TeacherTask(seed=seed)
    g = torch.Generator().manual_seed(1_000 + seed)  # the batches train() draws, in order
    opt = torch.optim.Adam(model.parameters(), lr=LESSON.lr)
    for _ in range(LESSON.steps):
        x, y = task.batch(g, LESSON.batch)
        train_step(model, opt, task.loss, x, y)
    held_out = task.batch(torch.Generator().manual_seed(99_000 + seed), 1024)
    return model.eval(), task, held_out


def flush_cost(sinks: tuple[float, ...] | None = None, recipes: tuple[str, ...] = ("tensorwise", "rowwise"),
               seed: int = 0):
    """Why a share of fc2's input flushed costs what it costs, in notebook 06's MLP. For each sink value (default:
    1e4, the massive-activation ratio's sinks_for(1e5), 1e5, 1e6) and recipe, fc2's input of the model trained in
    fp32 (150 steps, no sinks) on a held-out batch, with the sinks set and quantized as the recipe's forward GEMM
    quantizes it (only this GEMM: everything else stays fp32); the model is trained here (tens of seconds on 2
    cores: fp8lab.training.measured.flush_costs() ships the result). Columns: sinks, recipe, flushed (share of the
    ordinary values flushed to 0), energy (share of the ordinary values' sum of squares those carry), fc2_error
    (||fc2's output error|| / ||fc2's output||, its bias left out), fp32_model_loss (that model's loss with this
    input, against its own: a model that learned with these values and now loses them), trained_loss (the FP8 run
    trained with the sinks from its first step, against its own no-sink run: fp8lab.training.measured, mean of 3
    seeds; NaN where no run is shipped)."""
    import pandas as pd  # a heavy dependency: imported where a table is built, not when fp8lab is

    sinks = sinks or (1e4, sinks_for(1e5), 1e5, 1e6)
    model, task, (x, y) = _trained_fp32(seed)
    rows = []
    with torch.no_grad():
        h = model.sink(torch.nn.functional.gelu(model.fc1(x) + model.b1))  # (1024, hidden), no sinks
        keep = torch.ones(h.shape[1], dtype=torch.bool)
        keep[model.sink.index] = False
        out = model.fc2(h) - model.fc2.bias
        base = float(task.loss(model.fc3(torch.nn.functional.gelu(model.fc2(h))), y))
        for s in sinks:
            hs = h.clone()
            hs[:, model.sink.index] = s
            for name in recipes:
                q = quantize(hs, get_recipe(name).input).dequantize()
                ordinary, kept = h[:, keep], q[:, keep]
                lost = (ordinary != 0) & (kept == 0)
                loss = float(task.loss(model.fc3(torch.nn.functional.gelu(model.fc2(q))), y))
                rows.append({"sinks": s, "recipe": name, "flushed": float(lost.float().mean()),
                             "energy": float(ordinary[lost].square().sum() / ordinary.square().sum()),
                             "fc2_error": float(torch.linalg.norm(model.fc2(q) - model.fc2.bias - out)
                                                / torch.linalg.norm(out)),
                             "fp32_model_loss": loss / base - 1})
    return with_trained_loss(pd.DataFrame(rows))
