"""One activation, two GEMMs: what a linear layer's forward and weight-gradient GEMMs keep of the same tensor.

Public: operand_losses(x, recipe, outlier_channels) (the activation as fprop quantizes it, along K, and as
wgrad quantizes it, along M), lesson_mismatch (fc2's input in the lesson MLP, per recipe and GEMM, from
fp8lab.inspect), placement_flush (which scales the sinks break, by where they sit), constant_loss (the lesson
task's loss of predicting the mean, from fp8lab.training.lesson), GEMM_ROLES. Notebook 05 shows the first,
notebook 06 the others.
A linear layer y = x @ w^T runs three GEMMs, each operand scaled along the dimension that GEMM sums over:
    fprop  y[M, N]  = x[M, K] @ w[N, K]^T      x in 1 x c tiles along K (a token's channels share a scale)
    wgrad  dw[N, K] = dy^T[N, M] @ x[M, K]     x^T in 1 x c tiles along M: c x 1 tiles of x (a channel's tokens)
so the same x is quantized twice, along different axes (fp8lab.nn.layer_gemms builds both, as FP8Linear does).
"""

from __future__ import annotations

import math

import torch

from fp8lab.numerics.metrics import channel_sqnr, flushed_fraction
from fp8lab.numerics.recipes import Recipe, get_recipe
from fp8lab.training.layers import layer_gemms
from fp8lab.training.lesson import constant_loss, lesson_model_and_batch
from fp8lab.training.models import PLACEMENTS
from fp8lab.training.published import sinks_for
from fp8lab.training.readiness import inspect

__all__ = ["GEMM_ROLES", "PLACEMENT_RECIPES", "constant_loss", "lesson_mismatch", "operand_losses", "placement_flush"]

# the GEMMs that read the activation x, and what each sums over
GEMM_ROLES = {"fprop": "x[M, K], summed over K (channels)", "wgrad": "x^T[K, M], summed over M (tokens)"}


def _block_label(q, gemm: str) -> str:
    """One scale's region, in x's layout, as a learner reads it: per-tensor, per token, per channel, or r x c."""
    if q.granularity.whole_tensor:
        return "per-tensor"
    if q.granularity.whole_rows:  # per row
        return "per row (one token)" if gemm == "fprop" else "per column (one channel)"
    r, c = q.granularity.rows, q.granularity.cols
    return f"{r}x{c}" if gemm == "fprop" else f"{c}x{r}"


def operand_losses(x: torch.Tensor, recipe: Recipe | str, outlier_channels: torch.Tensor | list[int] | None = None,
                   seed: int = 0, gemms: tuple[str, ...] = tuple(GEMM_ROLES)) -> dict[str, dict]:
    """x[M, K] quantized as `recipe`'s fprop and wgrad GEMMs read it (fp8lab.nn.layer_gemms), seen in x's layout.

    Returns {"fprop": ..., "wgrad": ...} (the GEMMs in `gemms`: a panel that shows one measures only that one),
    each a dict: "values" (the dequantized operand as x[M, K], None where the recipe keeps that GEMM in high
    precision), "block" ((rows, cols) of one scale's region in x's layout),
    "label" (that region in words), "format", "ordinary_flushed" (share of the ordinary channels' nonzero values
    flushed to zero) and "ordinary_sqnr_db" (their SQNR, every channel alike; fp8lab.metrics.channel_sqnr).
    The weight and output gradient the three GEMMs also need are drawn from `seed`: they change nothing here.
    """
    recipe = get_recipe(recipe)
    unknown = [gemm for gemm in gemms if gemm not in GEMM_ROLES]
    if unknown or not gemms:
        raise ValueError(f"gemms must name some of {', '.join(GEMM_ROLES)}; got {tuple(gemms)}")
    x = x.detach().float()
    m, k = x.shape
    g = torch.Generator().manual_seed(seed)
    n = 16  # the layer's output width: any; it only shapes the weight and gradient operands
    pairs = layer_gemms(x, torch.randn(n, k, generator=g, dtype=x.dtype, device="cpu").to(x.device),
                        torch.randn(m, n, generator=g, dtype=x.dtype, device="cpu").to(x.device), recipe)
    out = {}
    for gemm in (gemm for gemm in GEMM_ROLES if gemm in gemms):
        pair = pairs[gemm]
        if pair is None:  # the recipe runs this GEMM in high precision: nothing is quantized
            out[gemm] = {"values": None, "block": (m, k), "label": "high precision", "format": "high precision",
                         "ordinary_flushed": 0.0, "ordinary_sqnr_db": math.inf}
            continue
        q = pair[0] if gemm == "fprop" else pair[1]  # fprop: x_q[M, K]; wgrad: xT_q[K, M]
        values = q.dequantize().reshape(q.shape)
        rows, cols = q.block_shape
        if gemm == "wgrad":  # back to x's layout: a 1 x c tile of x^T is a c x 1 tile of x
            values, rows, cols = values.t(), cols, rows
        rows, cols = min(rows, m), min(cols, k)
        out[gemm] = {"values": values, "block": (rows, cols), "label": _block_label(q, gemm),
                     "format": q.fmt.name, "ordinary_flushed": flushed_fraction(x, values, outlier_channels),
                     "ordinary_sqnr_db": channel_sqnr(x, values, outlier_channels)}
    return out


PLACEMENT_RECIPES = ("tensorwise", "rowwise", "blockwise")  # one scale per tensor, per token (row), per 1x128 tile


def placement_flush(ratio: float = 1e5, placements: tuple[str, ...] | None = None,
                    recipes: tuple[str, ...] = PLACEMENT_RECIPES, seed: int = 0):
    """Where the sinks sit decides which scales they break: fc2's input in notebook 06's MLP (LESSON, its initial
    weights, train()'s first batch: 128 rows, the tokens fc2 sees) with the sinks at `ratio` x the median
    ordinary value (fp8lab.training.published.sinks_for) in each placement (fp8lab.training.models.PLACEMENTS),
    quantized as each recipe's fprop GEMM reads it (along K: a token's channels) and its wgrad GEMM reads it
    (along M: a channel's tokens), as operand_losses does. The ordinary values are every value the sinks do not
    overwrite (in the token placement the sink channels' other tokens count). DataFrame with columns placement,
    recipe, gemm, scale (one scale's region, in words), flushed (share of the ordinary values flushed to zero),
    worst (the largest share flushed in one token, for fprop, or in one channel, for wgrad: inside a scale the
    sinks set, the damage the overall share dilutes)."""
    import pandas as pd  # a heavy dependency: imported where a table is built, not when fp8lab is

    placements = PLACEMENTS if placements is None else tuple(placements)
    for name in placements:
        if name not in PLACEMENTS:
            raise ValueError(f"unknown placement {name!r}; valid: {', '.join(PLACEMENTS)}")
    sinks = sinks_for(ratio)
    rows = []
    for placement in placements:
        model, x, _, _ = lesson_model_and_batch(sinks, seed, placement)
        with torch.no_grad():
            h = model.sink(torch.nn.functional.gelu(model.fc1(x) + model.b1))  # (M, hidden): fc2's input
        sink = model.sink.mask(h.shape)  # (M, hidden): True where the sinks sit
        for name in recipes:
            for gemm, seen in operand_losses(h, name, sink, seed).items():
                lost = ((h != 0) & (seen["values"] == 0) & ~sink).double()  # (M, hidden): the flushed ordinary
                line = 1 if gemm == "fprop" else 0  # fprop: per token (a row); wgrad: per channel (a column)
                worst = float((lost.sum(line) / (~sink).double().sum(line).clamp(min=1)).max())
                rows.append({"placement": placement, "recipe": name, "gemm": gemm, "scale": seen["label"],
                             "flushed": seen["ordinary_flushed"], "worst": worst})
    return pd.DataFrame(rows)


def lesson_mismatch(recipes: tuple[str, ...] = ("tensorwise", "rowwise", "rowwise_with_gw_hp"), sinks: float = 1e6,
                    seed: int = 0, layer: str = "fc2"):
    """fc2's input in notebook 06's MLP (LESSON, its initial weights, the first batch) as each recipe's fprop and
    wgrad GEMMs quantize it, measured by fp8lab.inspect: DataFrame indexed by (recipe, gemm) with underflow
    (share of the operand flushed to zero), sqnr_ordinary_db and format ("high precision" where the recipe
    runs that GEMM unquantized)."""
    model, x, y, task = lesson_model_and_batch(sinks, seed)
    report = inspect(model, x, lambda out: task.loss(out, y), recipes=recipes, progress=False)
    f = report.frame
    part = f[(f.layer == layer) & (f.operand == "input") & f.gemm.isin(("fprop", "wgrad"))]
    return part.set_index(["recipe", "gemm"])[["format", "granularity", "underflow", "sqnr_ordinary_db"]]
